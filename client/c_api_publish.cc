// The C ABI's engine-made layouts (client/wsup_client.h): the write
// lease's steps after wsup_publish_begin (c_api.cc): allocate, commit (with
// the entries, from JSON), abort. Each takes the torch allocator's lock,
// since the allocator may carve from the same lease on another thread.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "client/c_api_handle.h"
#include "client/client.h"
#include "client/publish.h"
#include "client/wsup_client.h"

namespace wsup::capi {

wsup::Status NoLease(const char* call) {
  return wsup::InvalidArgument(std::string(call) +
                               ": this handle holds no write lease (wsup_has_lease is 0): only a handle from "
                               "wsup_publish_begin that got the lease allocates, commits or aborts");
}

}  // namespace wsup::capi

namespace {

using nlohmann::json;
using wsup::capi::Allocator;
using wsup::capi::NoLease;
using wsup::capi::SetHolderFingerprint;
using wsup::capi::StatusCode;
using wsup::capi::Step;
using wsup::capi::StringOption;

wsup::Result<uint64_t> U64Field(const json& e, const char* key, size_t i) {
  auto it = e.find(key);
  if (it == e.end() || !it->is_number_unsigned()) {
    return wsup::InvalidArgument("entries_json[" + std::to_string(i) + "]: '" + key +
                                 "' must be a non-negative integer");
  }
  return it->get<uint64_t>();
}

wsup::Result<std::vector<int64_t>> DimsField(const json& e, const char* key, size_t i, bool required) {
  std::vector<int64_t> out;
  auto it = e.find(key);
  if (it == e.end()) {
    if (required) return wsup::InvalidArgument("entries_json[" + std::to_string(i) + "]: '" + key + "' is missing");
    return out;
  }
  if (!it->is_array() || it->size() > 8) {
    return wsup::InvalidArgument("entries_json[" + std::to_string(i) + "]: '" + key +
                                 "' must be an array of at most 8 integers");
  }
  for (const auto& d : *it) {
    if (!d.is_number_integer()) {
      return wsup::InvalidArgument("entries_json[" + std::to_string(i) + "]: '" + key + "' must hold integers");
    }
    out.push_back(d.get<int64_t>());
  }
  return out;
}

// entries_json: [{name, dtype, shape, strides?, alloc, offset, nbytes?}];
// nbytes defaults to what shape (and strides) span in dtype.
wsup::Result<std::vector<wsup::ManifestEntry>> ParseEntries(const char* entries_json) {
  if (entries_json == nullptr) return wsup::InvalidArgument("entries_json is NULL; pass a JSON array of entries");
  auto parsed = json::parse(entries_json, nullptr, false);
  if (parsed.is_discarded() || !parsed.is_array()) {
    return wsup::InvalidArgument("entries_json is not a JSON array of {name, dtype, shape, alloc, offset} objects");
  }
  std::vector<wsup::ManifestEntry> out;
  for (size_t i = 0; i < parsed.size(); ++i) {
    const json& e = parsed[i];
    if (!e.is_object()) return wsup::InvalidArgument("entries_json[" + std::to_string(i) + "] is not an object");
    wsup::ManifestEntry m;
    WSUP_ASSIGN_OR_RETURN(m.name, StringOption(e, "name", ""));
    WSUP_ASSIGN_OR_RETURN(m.dtype, StringOption(e, "dtype", ""));
    WSUP_ASSIGN_OR_RETURN(m.shape, DimsField(e, "shape", i, true));
    WSUP_ASSIGN_OR_RETURN(m.strides, DimsField(e, "strides", i, false));
    WSUP_ASSIGN_OR_RETURN(uint64_t alloc, U64Field(e, "alloc", i));
    if (alloc > 0xffffffffull) return wsup::InvalidArgument("entries_json[" + std::to_string(i) + "]: 'alloc' is too large");
    m.alloc = static_cast<uint32_t>(alloc);
    WSUP_ASSIGN_OR_RETURN(m.offset, U64Field(e, "offset", i));
    if (e.contains("nbytes")) {
      WSUP_ASSIGN_OR_RETURN(m.nbytes, U64Field(e, "nbytes", i));
    } else {
      auto dtype = wsup::ParseDType(m.dtype);
      if (!dtype.ok()) {
        return wsup::InvalidArgument("entries_json[" + std::to_string(i) + "]: dtype '" + m.dtype.substr(0, 32) +
                                     "' is not a safetensors dtype (F32, BF16, F16, F8_E4M3, I64, ...)");
      }
      const std::vector<int64_t> strides = m.strides.empty() ? wsup::ContiguousStrides(m.shape) : m.strides;
      uint64_t span = 1;
      bool empty = false;
      for (size_t d = 0; d < m.shape.size() && d < strides.size(); ++d) {
        if (m.shape[d] <= 0) empty = true;
        if (!empty) span += static_cast<uint64_t>(m.shape[d] - 1) * static_cast<uint64_t>(std::max<int64_t>(strides[d], 0));
      }
      m.nbytes = empty ? 0 : span * wsup::DTypeSize(*dtype);
    }
    out.push_back(std::move(m));
  }
  return out;
}

}  // namespace

extern "C" {

int wsup_has_lease(const wsup_attachment* a) { return a && a->pub && !a->pub->done() ? 1 : 0; }

int wsup_publish_alloc(wsup_attachment* a, uint64_t bytes, void** data, uint64_t* size, uint32_t* alloc) {
  return Step(a, [&]() -> wsup::Status {
    std::lock_guard<std::mutex> lock(Allocator().mutex());
    if (!wsup_has_lease(a)) return NoLease("wsup_publish_alloc");
    if (data == nullptr) return wsup::InvalidArgument("wsup_publish_alloc: data is NULL");
    WSUP_ASSIGN_OR_RETURN(wsup::Publication::Region r, a->pub->Allocate(bytes));
    *data = r.data;
    if (size != nullptr) *size = r.size;
    if (alloc != nullptr) *alloc = r.alloc;
    return wsup::Status::Ok();
  });
}

int wsup_publish_commit(wsup_attachment* a, const char* entries_json) {
  return Step(a, [&]() -> wsup::Status {
    std::lock_guard<std::mutex> lock(Allocator().mutex());
    if (!wsup_has_lease(a)) return NoLease("wsup_publish_commit");
    WSUP_ASSIGN_OR_RETURN(std::vector<wsup::ManifestEntry> entries, ParseEntries(entries_json));
    WSUP_ASSIGN_OR_RETURN(wsup::AttachResult r, a->pub->Commit(std::move(entries)));
    Allocator().Closed(a, "the layout was committed: its memory is the layout's now, and no more can be carved "
                          "from it; allocate outside the lease's pool", false);
    a->outcome = std::move(r.outcome);
    a->source = wsup::WeightSourceName(a->outcome.source);
    a->att = std::move(r.attachment);
    a->pub.reset();
    {
      std::lock_guard<std::mutex> lock(a->table_mu);  // a block of the old attachment, if any, is stale
      a->table.clear();
      a->table_bytes = 0;
    }
    SetHolderFingerprint(a);
    a->error.clear();
    return wsup::Status::Ok();
  });
}

int wsup_publish_abort(wsup_attachment* a, const char* reason) {
  return Step(a, [&]() -> wsup::Status {
    std::lock_guard<std::mutex> lock(Allocator().mutex());
    if (!wsup_has_lease(a)) return NoLease("wsup_publish_abort");
    Allocator().Closed(a, "the lease was given up (wsup_publish_abort)", false);
    wsup::Status s = a->pub->Abort(reason != nullptr ? reason : "");
    a->pub.reset();
    a->outcome.reason = "aborted";
    return s;
  });
}

double wsup_publish_grant_ms(const wsup_attachment* a) {
  if (a == nullptr || !a->pub) return 0.0;
  std::lock_guard<std::mutex> lock(Allocator().mutex());
  return a->pub->grant_ms();
}

int wsup_publish_locate(const wsup_attachment* a, const void* ptr, uint32_t* alloc, uint64_t* offset) {
  try {
    std::lock_guard<std::mutex> lock(Allocator().mutex());
    if (!wsup_has_lease(a) || alloc == nullptr || offset == nullptr) return WSUP_ERR_INVALID_ARGUMENT;
    wsup::Status s = a->pub->Locate(ptr, alloc, offset);
    return s.ok() ? WSUP_OK : StatusCode(s.code());
  } catch (...) {
    return WSUP_ERR_INTERNAL;
  }
}

}  // extern "C"
