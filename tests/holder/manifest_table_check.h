// CheckManifestTable: wsup_manifest_table's block of an attached C ABI
// handle, field by field against the per-tensor accessors' answers (which
// are the contract the block must repeat), and every offset inside the
// block. For the holder tests that attach through the C ABI.
#pragma once

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>

#include "client/wsup_client.h"

namespace wsup::test {

// Returns the block's WSUP_MANIFEST_STRIDED flag, for tests that expect it
// (WSUP_MANIFEST_DIMS_UNIQUE is always set, and checked here).
inline uint32_t CheckManifestTable(const wsup_attachment* c) {
  size_t len = 12345;
  const char* t = static_cast<const char*>(wsup_manifest_table(c, &len));
  REQUIRE(t != nullptr);
  REQUIRE(len >= sizeof(wsup_manifest_header));
  CHECK(reinterpret_cast<uintptr_t>(t) % 8 == 0);
  wsup_manifest_header h;
  std::memcpy(&h, t, sizeof h);
  CHECK(std::string(h.magic, sizeof h.magic) == WSUP_MANIFEST_MAGIC);
  CHECK(h.version == WSUP_MANIFEST_VERSION);
  CHECK(h.header_bytes == sizeof(wsup_manifest_header));
  CHECK(h.record_bytes == sizeof(wsup_tensor_record));
  CHECK(h.total_bytes == len);
  REQUIRE(h.count == wsup_num_tensors(c));
  REQUIRE(h.dims_offset == h.header_bytes + h.count * h.record_bytes);
  REQUIRE(h.dims_offset % 8 == 0);
  REQUIRE(h.strings_offset >= h.dims_offset);
  REQUIRE(h.strings_offset + h.strings_bytes == len);
  const uint64_t n_dims = (h.strings_offset - h.dims_offset) / 8;
  const auto* dims = reinterpret_cast<const int64_t*>(t + h.dims_offset);
  const char* strings = t + h.strings_offset;
  bool strided = false;
  // dims_index -> (ndim, shape and strides) of the first tensor there: with
  // WSUP_MANIFEST_DIMS_UNIQUE every other tensor there has the same.
  std::map<uint64_t, std::vector<int64_t>> at_index;
  CHECK((h.flags & WSUP_MANIFEST_DIMS_UNIQUE) != 0);
  for (uint64_t i = 0; i < h.count; ++i) {
    wsup_tensor_record r;
    std::memcpy(&r, t + h.header_bytes + i * h.record_bytes, sizeof r);
    const char* want_name = wsup_tensor_name(c, i);
    REQUIRE(want_name != nullptr);
    INFO("tensor " << i << " '" << want_name << "'");
    REQUIRE(r.name_offset + r.name_bytes < h.strings_bytes);
    CHECK(std::string(strings + r.name_offset) == want_name);
    CHECK(std::strlen(strings + r.name_offset) == r.name_bytes);
    REQUIRE(r.dtype_offset + r.dtype_bytes < h.strings_bytes);
    CHECK(std::string(strings + r.dtype_offset) == wsup_tensor_dtype(c, want_name));
    CHECK(std::strlen(strings + r.dtype_offset) == r.dtype_bytes);
    CHECK(r.data == reinterpret_cast<uintptr_t>(wsup_tensor_data(c, want_name)));
    CHECK(r.nbytes == wsup_tensor_nbytes(c, want_name));
    REQUIRE(static_cast<int64_t>(r.ndim) == wsup_tensor_ndim(c, want_name));
    REQUIRE(r.dims_index + 2 * r.ndim <= n_dims);
    std::vector<int64_t> key = {static_cast<int64_t>(r.ndim)};
    key.insert(key.end(), dims + r.dims_index, dims + r.dims_index + 2 * r.ndim);
    auto [first, fresh] = at_index.emplace(r.dims_index, key);
    CHECK((fresh || first->second == key));
    uint64_t contiguous = 1;
    for (uint64_t d = r.ndim; d-- > 0;) {
      INFO("dimension " << d);
      CHECK(dims[r.dims_index + d] == wsup_tensor_dim(c, want_name, static_cast<int>(d)));
      const int64_t stride = dims[r.dims_index + r.ndim + d];
      CHECK(stride == wsup_tensor_stride(c, want_name, static_cast<int>(d)));
      if (static_cast<uint64_t>(stride) != contiguous) strided = true;
      contiguous *= static_cast<uint64_t>(std::max<int64_t>(dims[r.dims_index + d], 1));
    }
  }
  CHECK(((h.flags & WSUP_MANIFEST_STRIDED) != 0) == strided);
  // Built once: the same block again.
  size_t again = 0;
  CHECK(wsup_manifest_table(c, &again) == t);
  CHECK(again == len);
  CHECK(wsup_manifest_table(c, nullptr) == t);
  return h.flags & WSUP_MANIFEST_STRIDED;
}

}  // namespace wsup::test
