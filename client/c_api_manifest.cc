// The C ABI's tensors (client/wsup_client.h): lookups by name, copies to
// the host, and the whole manifest in one block (wsup_manifest_table).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "client/c_api_handle.h"
#include "client/client.h"
#include "client/wsup_client.h"

static_assert(sizeof(wsup_manifest_header) == 64 && alignof(wsup_manifest_header) == 8,
              "wsup_client.h documents a 64-byte header");
static_assert(sizeof(wsup_tensor_record) == 64 && offsetof(wsup_tensor_record, dims_index) == 56,
              "wsup_client.h documents 64-byte records of eight 8-byte fields");

namespace {

using wsup::capi::StatusCode;

const wsup::ManifestEntry* Entry(const wsup_attachment* a, const char* name) {
  if (a == nullptr || name == nullptr || !a->att) return nullptr;
  return a->att->Find(name).entry;
}

// The block of wsup_manifest_table (its layout is in wsup_client.h) for
// every entry of `att`, in manifest order. Equal (shape, strides) and equal
// dtypes are stored once and shared. Fields are copied in with memcpy: the
// storage is uint64_t, the views of it are the C structs.
std::vector<uint64_t> BuildTable(const wsup::Attachment& att, size_t* total) {
  const std::vector<wsup::ManifestEntry>& entries = att.manifest().entries;
  const size_t n = entries.size();
  // First pass: the distinct dims and dtypes, each entry's index into them,
  // and the sizes of the areas.
  std::map<std::vector<int64_t>, uint64_t> dims_at;  // shape then strides -> index in `dims`
  std::map<std::string, uint64_t> dtype_at;          // spelling -> offset in the strings
  std::vector<int64_t> dims;
  std::vector<uint64_t> dims_index(n);
  std::vector<uint64_t> dtype_offset(n);
  std::string dtypes;  // the distinct spellings, NUL after each
  size_t name_bytes = 0;
  uint32_t flags = WSUP_MANIFEST_DIMS_UNIQUE;
  std::vector<int64_t> key;
  std::vector<int64_t> last_key;  // most entries repeat their neighbour's dims and dtype:
  uint64_t last_dims = 0;         // compare with it before searching
  const std::string* last_dtype = nullptr;
  uint64_t last_dtype_offset = 0;
  for (size_t i = 0; i < n; ++i) {
    const wsup::ManifestEntry& e = entries[i];
    const size_t rank = e.shape.size();
    key.resize(2 * rank);
    std::copy(e.shape.begin(), e.shape.end(), key.begin());
    if (e.strides.empty()) {  // the contiguous row-major strides, as wsup::ContiguousStrides
      int64_t step = 1;
      for (size_t d = rank; d-- > 0;) {
        key[rank + d] = step;
        step *= std::max<int64_t>(e.shape[d], 1);
      }
    } else {
      flags |= WSUP_MANIFEST_STRIDED;
      std::copy(e.strides.begin(), e.strides.end(), key.begin() + static_cast<std::ptrdiff_t>(rank));
    }
    if (i == 0 || key != last_key) {
      auto d = dims_at.find(key);
      if (d == dims_at.end()) {
        d = dims_at.emplace(key, dims.size()).first;
        dims.insert(dims.end(), key.begin(), key.end());
        // A scalar's dims are empty: one unused element keeps the next
        // shape from starting at its index (WSUP_MANIFEST_DIMS_UNIQUE).
        if (key.empty()) dims.push_back(0);
      }
      last_key = key;
      last_dims = d->second;
    }
    dims_index[i] = last_dims;
    if (last_dtype == nullptr || e.dtype != *last_dtype) {
      auto t = dtype_at.find(e.dtype);
      if (t == dtype_at.end()) {
        t = dtype_at.emplace(e.dtype, dtypes.size()).first;
        dtypes.append(e.dtype).push_back('\0');
      }
      last_dtype = &e.dtype;
      last_dtype_offset = t->second;
    }
    dtype_offset[i] = last_dtype_offset;
    name_bytes += e.name.size() + 1;
  }
  wsup_manifest_header h{};
  std::memcpy(h.magic, WSUP_MANIFEST_MAGIC, sizeof h.magic);
  h.version = WSUP_MANIFEST_VERSION;
  h.header_bytes = sizeof(wsup_manifest_header);
  h.record_bytes = sizeof(wsup_tensor_record);
  h.flags = flags;
  h.count = n;
  h.dims_offset = sizeof(wsup_manifest_header) + n * sizeof(wsup_tensor_record);
  h.strings_offset = h.dims_offset + dims.size() * sizeof(int64_t);
  h.strings_bytes = dtypes.size() + name_bytes;
  h.total_bytes = h.strings_offset + h.strings_bytes;
  std::vector<uint64_t> block((h.total_bytes + 7) / 8, 0);
  char* base = reinterpret_cast<char*>(block.data());
  std::memcpy(base, &h, sizeof h);
  if (!dims.empty()) std::memcpy(base + h.dims_offset, dims.data(), dims.size() * sizeof(int64_t));
  char* strings = base + h.strings_offset;
  // Strings are length-delimited (each record has its byte count); the
  // block's zeros after each one are for C readers.
  std::memcpy(strings, dtypes.data(), dtypes.size());  // NOLINT(bugprone-not-null-terminated-result)
  // Second pass: the records, and the names after the dtypes (the block's
  // zeros are their NULs).
  uint64_t at = dtypes.size();
  for (size_t i = 0; i < n; ++i) {
    const wsup::ManifestEntry& e = entries[i];
    wsup_tensor_record r{};
    r.data = reinterpret_cast<uintptr_t>(att.At(i).data);
    r.nbytes = e.nbytes;
    r.name_offset = at;
    r.name_bytes = e.name.size();
    r.dtype_offset = dtype_offset[i];
    r.dtype_bytes = e.dtype.size();
    r.ndim = e.shape.size();
    r.dims_index = dims_index[i];
    std::memcpy(strings + at, e.name.data(), e.name.size());  // NOLINT(bugprone-not-null-terminated-result)
    at += e.name.size() + 1;
    std::memcpy(base + h.header_bytes + i * sizeof r, &r, sizeof r);
  }
  *total = h.total_bytes;
  return block;
}

}  // namespace

extern "C" {

int wsup_is_cuda(const wsup_attachment* a) {
  if (a == nullptr) return 0;
  if (a->att) return a->att->arena().is_cuda() ? 1 : 0;
  // A handle with the lease: what wsup_publish_alloc's pointers are.
  return a->pub && !a->pub->done() && a->pub->lease().backend == "cuda" ? 1 : 0;
}

size_t wsup_num_tensors(const wsup_attachment* a) { return a && a->att ? a->att->size() : 0; }

const char* wsup_tensor_name(const wsup_attachment* a, size_t i) {
  if (!a || !a->att || i >= a->att->manifest().entries.size()) return nullptr;
  return a->att->manifest().entries[i].name.c_str();
}

const void* wsup_tensor_data(const wsup_attachment* a, const char* name) {
  if (a == nullptr || name == nullptr || !a->att) return nullptr;
  return a->att->Find(name).data;
}

const char* wsup_tensor_dtype(const wsup_attachment* a, const char* name) {
  const wsup::ManifestEntry* e = Entry(a, name);
  return e ? e->dtype.c_str() : nullptr;
}

int wsup_tensor_ndim(const wsup_attachment* a, const char* name) {
  const wsup::ManifestEntry* e = Entry(a, name);
  return e ? static_cast<int>(e->shape.size()) : -1;
}

int64_t wsup_tensor_dim(const wsup_attachment* a, const char* name, int i) {
  const wsup::ManifestEntry* e = Entry(a, name);
  if (!e || i < 0 || static_cast<size_t>(i) >= e->shape.size()) return -1;
  return e->shape[static_cast<size_t>(i)];
}

uint64_t wsup_tensor_nbytes(const wsup_attachment* a, const char* name) {
  const wsup::ManifestEntry* e = Entry(a, name);
  return e ? e->nbytes : 0;
}

int64_t wsup_tensor_stride(const wsup_attachment* a, const char* name, int i) {
  const wsup::ManifestEntry* e = Entry(a, name);
  if (!e || i < 0 || static_cast<size_t>(i) >= e->shape.size()) return -1;
  const std::vector<int64_t> strides = e->strides.empty() ? wsup::ContiguousStrides(e->shape) : e->strides;
  return strides[static_cast<size_t>(i)];
}

int wsup_tensor_copy_to_host(const wsup_attachment* a, const char* name, void* dst, uint64_t dst_len) {
  try {
    const wsup::ManifestEntry* e = Entry(a, name);
    if (e == nullptr) return WSUP_ERR_NOT_FOUND;
    if (dst == nullptr || dst_len < e->nbytes) return WSUP_ERR_INVALID_ARGUMENT;
    wsup::Status s = a->att->arena().CopyToHost(*e, dst);
    return s.ok() ? WSUP_OK : StatusCode(s.code());
  } catch (...) {
    return WSUP_ERR_INTERNAL;
  }
}

const void* wsup_manifest_table(const wsup_attachment* a, size_t* len) {
  if (len != nullptr) *len = 0;
  if (a == nullptr || !a->att) return nullptr;
  try {
    std::lock_guard<std::mutex> lock(a->table_mu);
    if (a->table.empty()) a->table = BuildTable(*a->att, &a->table_bytes);
    if (len != nullptr) *len = a->table_bytes;
    return a->table.data();
  } catch (...) {  // out of memory (or a lock that cannot be taken): no block
    return nullptr;
  }
}

}  // extern "C"
