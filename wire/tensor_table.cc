// The binary tensor table of wire/manifest.h (its format is described
// there): encoding, the header check, and the decoder that checks every
// size and reference before it reads.
#include <endian.h>

#include <algorithm>
#include <cstring>
#include <string_view>

#include "wire/manifest.h"
#include "wire/manifest_detail.h"

namespace wsup {

using namespace manifest_detail;

namespace {

constexpr char kTableMagic[8] = {'w', 's', 'u', 'p', 'T', 'T', 'B', 'L'};
constexpr uint64_t kTableHeaderBytes = 64;
constexpr uint64_t kTableRecordBytes = 32;

}  // namespace

namespace {

uint16_t Le16(const char* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof v);
  return le16toh(v);
}
uint32_t Le32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return le32toh(v);
}
uint64_t Le64(const char* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof v);
  return le64toh(v);
}
void Put16(char* p, uint16_t v) {
  v = htole16(v);
  std::memcpy(p, &v, sizeof v);
}
void Put32(char* p, uint32_t v) {
  v = htole32(v);
  std::memcpy(p, &v, sizeof v);
}
void Put64(char* p, uint64_t v) {
  v = htole64(v);
  std::memcpy(p, &v, sizeof v);
}

Error BadTable(const std::string& what) { return Bad("tensor table: " + what); }

}  // namespace

Result<std::string> EncodeTensorTable(const std::vector<ManifestEntry>& entries) {
  // First pass: sizes, and each dtype spelling once (there are a handful).
  uint64_t dims = 0, name_bytes = 0;
  std::vector<std::string_view> dtypes;
  // With strides, every entry carries them (its contiguous ones when it has
  // none), so the records stay fixed-size and the decoder reads 2 x rank.
  const bool strided = AnyStrided(entries);
  for (size_t i = 0; i < entries.size(); ++i) {
    const ManifestEntry& e = entries[i];
    if (e.name.size() > 0xffff || e.dtype.size() > 0xff || e.shape.size() > 0xff) {
      return InvalidArgument(EntryName(i, e.name) +
                             ": a name over 64 KiB, a dtype over 255 bytes or a rank over 255 cannot go "
                             "into a tensor table; no valid manifest has one: fix the arena's layout");
    }
    if (!e.strides.empty() && e.strides.size() != e.shape.size()) {
      return InvalidArgument(EntryName(i, e.name) + ": " + std::to_string(e.strides.size()) +
                             " strides for a shape of rank " + std::to_string(e.shape.size()) +
                             "; give one stride per dimension, or none for a contiguous tensor");
    }
    dims += e.shape.size() * (strided ? 2 : 1);
    name_bytes += e.name.size();
    if (std::find(dtypes.begin(), dtypes.end(), std::string_view(e.dtype)) == dtypes.end()) {
      dtypes.push_back(e.dtype);
    }
  }
  uint64_t string_bytes = name_bytes;
  for (std::string_view d : dtypes) string_bytes += d.size();
  if (string_bytes > 0xffffffffull) {
    return InvalidArgument(
        "tensor table: " + std::to_string(string_bytes) +
        " bytes of names do not fit its 4 GiB string area; no valid manifest has that many");
  }
  const uint64_t n = entries.size();
  const uint64_t total = kTableHeaderBytes + kTableRecordBytes * n + 8 * dims + string_bytes;
  std::string out(total, '\0');
  char* p = out.data();
  std::memcpy(p, kTableMagic, sizeof kTableMagic);
  Put32(p + 8, kTensorTableVersion);
  Put32(p + 12, static_cast<uint32_t>(kTableHeaderBytes));
  Put32(p + 16, static_cast<uint32_t>(kTableRecordBytes));
  Put32(p + 20, strided ? kTableFlagStrides : 0);
  Put64(p + 24, n);
  Put64(p + 32, dims);
  Put64(p + 40, string_bytes);
  Put64(p + 48, total);
  Put64(p + 56, 0);

  char* rec = p + kTableHeaderBytes;
  char* dim = rec + kTableRecordBytes * n;
  char* str = dim + 8 * dims;
  // Names first, in entry order; the dtype spellings after them.
  std::vector<uint32_t> dtype_offsets(dtypes.size());
  uint64_t at = name_bytes;
  for (size_t k = 0; k < dtypes.size(); ++k) {
    dtype_offsets[k] = static_cast<uint32_t>(at);
    std::memcpy(str + at, dtypes[k].data(), dtypes[k].size());
    at += dtypes[k].size();
  }
  uint64_t name_at = 0;
  size_t dtype_k = 0;
  for (size_t i = 0; i < n; ++i, rec += kTableRecordBytes) {
    const ManifestEntry& e = entries[i];
    if (dtypes[dtype_k] != e.dtype) {
      dtype_k = static_cast<size_t>(std::find(dtypes.begin(), dtypes.end(), std::string_view(e.dtype)) -
                                    dtypes.begin());
    }
    Put64(rec, e.offset);
    Put64(rec + 8, e.nbytes);
    Put32(rec + 16, e.alloc);
    Put32(rec + 20, static_cast<uint32_t>(name_at));
    Put16(rec + 24, static_cast<uint16_t>(e.name.size()));
    rec[26] = static_cast<char>(static_cast<uint8_t>(e.dtype.size()));
    rec[27] = static_cast<char>(static_cast<uint8_t>(e.shape.size()));
    Put32(rec + 28, dtype_offsets[dtype_k]);
    std::memcpy(str + name_at, e.name.data(), e.name.size());
    name_at += e.name.size();
    for (int64_t d : e.shape) {
      Put64(dim, static_cast<uint64_t>(d));
      dim += 8;
    }
    if (strided) {
      const std::vector<int64_t> strides = e.strides.empty() ? ContiguousStrides(e.shape) : e.strides;
      for (int64_t d : strides) {
        Put64(dim, static_cast<uint64_t>(d));
        dim += 8;
      }
    }
  }
  return out;
}

namespace {

// What a table's header says, once checked against its size.
struct TableLayout {
  uint64_t entries = 0;
  uint64_t dims = 0;
  uint64_t string_bytes = 0;
  bool strided = false;  // kTableFlagStrides
};

Result<TableLayout> CheckTableHeader(std::string_view table) {
  const uint64_t size = table.size();
  if (size < kTableHeaderBytes) {
    return BadTable(std::to_string(size) + " bytes, shorter than its " + std::to_string(kTableHeaderBytes) +
                    "-byte header (cut short)");
  }
  const char* p = table.data();
  if (std::memcmp(p, kTableMagic, sizeof kTableMagic) != 0) {
    return BadTable("does not start with \"wsupTTBL\"; it is not a wsup tensor table");
  }
  const uint32_t version = Le32(p + 8);
  if (version != kTensorTableVersion) {
    return BadTable("version " + std::to_string(version) + ", but this wsup reads version " +
                    std::to_string(kTensorTableVersion));
  }
  if (Le32(p + 12) != kTableHeaderBytes || Le32(p + 16) != kTableRecordBytes) {
    return BadTable("header of " + std::to_string(Le32(p + 12)) + " bytes and records of " +
                    std::to_string(Le32(p + 16)) + " bytes, but version 1 has " +
                    std::to_string(kTableHeaderBytes) + " and " + std::to_string(kTableRecordBytes));
  }
  const uint32_t flags = Le32(p + 20);
  if ((flags & ~kTableFlagStrides) != 0 || Le64(p + 56) != 0) {
    return BadTable("flags or reserved header fields are set (flags " + std::to_string(flags) +
                    "), which version 1 never does (it knows flag 1, strides)");
  }
  TableLayout t;
  t.strided = (flags & kTableFlagStrides) != 0;
  t.entries = Le64(p + 24);
  t.dims = Le64(p + 32);
  t.string_bytes = Le64(p + 40);
  const uint64_t total = Le64(p + 48);
  if (total != size) {
    return BadTable("its header says " + std::to_string(total) + " bytes but it has " + std::to_string(size) +
                    (total > size ? " (cut short)" : " (trailing bytes)"));
  }
  if (t.entries > kMaxEntries) {
    return BadTable(std::to_string(t.entries) + " entries, more than the " + std::to_string(kMaxEntries) +
                    " wsup accepts");
  }
  if (t.dims > t.entries * kMaxRank * (t.strided ? 2 : 1) || t.string_bytes > size) {
    return BadTable("header counts " + std::to_string(t.dims) + " dims and " +
                    std::to_string(t.string_bytes) + " string bytes for " + std::to_string(t.entries) +
                    " entries, more than the table can hold");
  }
  // Each term is bounded above, so the sum cannot overflow.
  const uint64_t sections = kTableHeaderBytes + kTableRecordBytes * t.entries + 8 * t.dims + t.string_bytes;
  if (sections != size) {
    return BadTable("its sections (64 + 32 x " + std::to_string(t.entries) + " + 8 x " +
                    std::to_string(t.dims) + " + " + std::to_string(t.string_bytes) + " = " +
                    std::to_string(sections) + " bytes) do not add up to its " + std::to_string(size) +
                    " bytes");
  }
  return t;
}

}  // namespace

Result<uint64_t> TensorTableEntries(std::string_view table) {
  WSUP_ASSIGN_OR_RETURN(TableLayout t, CheckTableHeader(table));
  return t.entries;
}

Status DecodeTensorTable(std::string_view table, std::vector<ManifestEntry>* entries) {
  entries->clear();
  WSUP_ASSIGN_OR_RETURN(TableLayout t, CheckTableHeader(table));
  const uint64_t n = t.entries;
  const uint64_t dims = t.dims;
  const uint64_t string_bytes = t.string_bytes;
  const char* p = table.data();
  const char* rec = p + kTableHeaderBytes;
  const char* dim = rec + kTableRecordBytes * n;
  const char* str = dim + 8 * dims;
  entries->reserve(n);
  uint64_t dim_at = 0;
  for (uint64_t i = 0; i < n; ++i, rec += kTableRecordBytes) {
    const uint64_t name_off = Le32(rec + 20);
    const uint64_t name_len = Le16(rec + 24);
    const uint64_t dtype_len = static_cast<uint8_t>(rec[26]);
    const uint64_t rank = static_cast<uint8_t>(rec[27]);
    const uint64_t dtype_off = Le32(rec + 28);
    auto fail = [&](const std::string& what) {
      entries->clear();
      return BadTable("record " + std::to_string(i) + ": " + what);
    };
    if (name_off + name_len > string_bytes) {
      return fail("its name (offset " + std::to_string(name_off) + ", " + std::to_string(name_len) +
                  " bytes) runs past the " + std::to_string(string_bytes) + "-byte string area");
    }
    if (dtype_off + dtype_len > string_bytes) {
      return fail("its dtype (offset " + std::to_string(dtype_off) + ", " + std::to_string(dtype_len) +
                  " bytes) runs past the " + std::to_string(string_bytes) + "-byte string area");
    }
    if (rank > kMaxRank) {
      return fail("rank " + std::to_string(rank) + ", more than " + std::to_string(kMaxRank));
    }
    const uint64_t used = t.strided ? 2 * rank : rank;
    if (used > dims - dim_at) {
      return fail(std::string("its shape") + (t.strided ? " and strides run" : " runs") + " past the " +
                  std::to_string(dims) + " dims the table holds");
    }
    ManifestEntry& e = entries->emplace_back();
    e.name.assign(str + name_off, name_len);
    e.dtype.assign(str + dtype_off, dtype_len);
    e.shape.resize(rank);
    for (uint64_t d = 0; d < rank; ++d) e.shape[d] = static_cast<int64_t>(Le64(dim + 8 * (dim_at + d)));
    if (t.strided) {
      e.strides.resize(rank);
      for (uint64_t d = 0; d < rank; ++d) {
        e.strides[d] = static_cast<int64_t>(Le64(dim + 8 * (dim_at + rank + d)));
      }
      Canonicalize(&e);
    }
    e.alloc = Le32(rec + 16);
    e.offset = Le64(rec);
    e.nbytes = Le64(rec + 8);
    dim_at += used;
  }
  if (dim_at != dims) {
    entries->clear();
    return BadTable("its records use " + std::to_string(dim_at) + " dims but its header counts " +
                    std::to_string(dims));
  }
  return {};
}

}  // namespace wsup
