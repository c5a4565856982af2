// The C ABI (client/wsup_client.h) over the C++ client (client/client.h).
// Every entry point catches everything: no exception may cross into C.

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "client/client.h"
#include "client/kv_pool.h"
#include "client/publish.h"
#include "client/torch_allocator.h"
#include "client/wsup_client.h"
#include "wire/death_word.h"
#include "wire/kv_journal.h"

#ifndef WSUP_VERSION_STRING
#define WSUP_VERSION_STRING "0.0.0"
#endif

struct wsup_attachment {
  int status = WSUP_OK;
  std::string error;
  wsup::AttachOutcome outcome;
  std::string source = "disk";
  std::string diffs_json = "[]";
  std::string holder_fp_json = "{}";
  std::unique_ptr<wsup::Attachment> att;
  std::unique_ptr<wsup::Publication> pub;  // wsup_publish_begin gave this handle the write lease
  // wsup_manifest_table's block, built on the first call. Readers of a
  // const handle may race to build it, hence the lock; uint64_t storage
  // keeps every field 8-byte aligned.
  mutable std::mutex table_mu;
  mutable std::vector<uint64_t> table;
  mutable size_t table_bytes = 0;
};

struct wsup_kv_pool {
  int status = WSUP_OK;
  std::string error;
  std::string json = "{}";
  wsup::KvPoolFds pool;
};

static_assert(WSUP_KV_TOKEN_HASH_SEED == wsup::kTokenHashSeed, "wsup_client.h states the journal's seed");
static_assert(sizeof(wsup_manifest_header) == 64 && alignof(wsup_manifest_header) == 8,
              "wsup_client.h documents a 64-byte header");
static_assert(sizeof(wsup_tensor_record) == 64 && offsetof(wsup_tensor_record, dims_index) == 56,
              "wsup_client.h documents 64-byte records of eight 8-byte fields");

namespace {

using nlohmann::json;

int StatusCode(wsup::Code code) {
  switch (code) {
    case wsup::Code::kOk: return WSUP_OK;
    case wsup::Code::kInvalidArgument: return WSUP_ERR_INVALID_ARGUMENT;
    case wsup::Code::kNotFound: return WSUP_ERR_NOT_FOUND;
    case wsup::Code::kIo: return WSUP_ERR_IO;
    case wsup::Code::kCorrupt: return WSUP_ERR_CORRUPT;
    case wsup::Code::kRefused: return WSUP_ERR_REFUSED;
    case wsup::Code::kMismatch: return WSUP_ERR_MISMATCH;
    case wsup::Code::kTimeout: return WSUP_ERR_TIMEOUT;
    case wsup::Code::kUnavailable: return WSUP_ERR_UNAVAILABLE;
    case wsup::Code::kInternal: return WSUP_ERR_INTERNAL;
  }
  return WSUP_ERR_INTERNAL;
}

void Fail(wsup_attachment* a, const wsup::Error& e) {
  a->status = StatusCode(e.code());
  a->error = e.ToString();
}

const wsup::ManifestEntry* Entry(const wsup_attachment* a, const char* name) {
  if (a == nullptr || name == nullptr || !a->att) return nullptr;
  return a->att->Find(name).entry;
}

// Reads an integer option, refusing anything else with the key's name.
wsup::Result<int> IntOption(const json& opts, const char* key, int fallback) {
  auto it = opts.find(key);
  if (it == opts.end()) return fallback;
  if (!it->is_number_integer()) {
    return wsup::InvalidArgument(std::string("options_json: '") + key + "' must be an integer");
  }
  auto v = it->get<int64_t>();
  if (v < -1'000'000'000 || v > 1'000'000'000) {
    return wsup::InvalidArgument(std::string("options_json: '") + key + "' is out of range");
  }
  return static_cast<int>(v);
}

wsup::Result<std::string> StringOption(const json& opts, const char* key, const std::string& fallback) {
  auto it = opts.find(key);
  if (it == opts.end()) return fallback;
  if (!it->is_string()) return wsup::InvalidArgument(std::string("options_json: '") + key + "' must be a string");
  return it->get<std::string>();
}

// What wsup_attach and wsup_publish_begin share: the options and the
// client's fingerprint, from the caller's arguments.
struct Request {
  json opts = json::object();
  wsup::AttachOptions o;
  wsup::Fingerprint ours;
};

wsup::Result<Request> Prepare(const char* socket_path, const char* mode, const char* fingerprint_json,
                              const char* checkpoint_dir, const char* options_json) {
  Request req;
  json& opts = req.opts;
  if (options_json != nullptr && *options_json) {
    WSUP_ASSIGN_OR_RETURN(opts, wsup::ParseMessageBody(options_json, "options_json"));
  }
  wsup::AttachOptions& o = req.o;
  o.socket_path = socket_path ? socket_path : "";
  WSUP_ASSIGN_OR_RETURN(o.mode, wsup::ParseAttachMode(mode ? mode : ""));
  WSUP_ASSIGN_OR_RETURN(o.client_name, StringOption(opts, "client_name", "engine"));
  WSUP_ASSIGN_OR_RETURN(o.timeout_ms, IntOption(opts, "timeout_ms", 10'000));
  WSUP_ASSIGN_OR_RETURN(o.device, IntOption(opts, "device", 0));
  if (o.timeout_ms <= 0) return wsup::InvalidArgument("options_json: 'timeout_ms' must be positive");

  bool have_fp = fingerprint_json != nullptr && *fingerprint_json;
  bool have_dir = checkpoint_dir != nullptr && *checkpoint_dir;
  wsup::Fingerprint& ours = req.ours;
  if (o.mode != wsup::AttachMode::kOff) {
    if (have_fp == have_dir) {
      return wsup::InvalidArgument("give exactly one of fingerprint_json and checkpoint_dir to wsup_attach");
    }
    if (have_fp) {
      WSUP_ASSIGN_OR_RETURN(json j, wsup::ParseMessageBody(fingerprint_json, "fingerprint_json"));
      WSUP_ASSIGN_OR_RETURN(ours, wsup::Fingerprint::FromJson(j));
    } else {
      wsup::ShardSpec shard;
      WSUP_ASSIGN_OR_RETURN(shard.tp_size, IntOption(opts, "tp_size", 1));
      WSUP_ASSIGN_OR_RETURN(shard.tp_rank, IntOption(opts, "tp_rank", 0));
      WSUP_ASSIGN_OR_RETURN(shard.ep_size, IntOption(opts, "ep_size", 1));
      WSUP_ASSIGN_OR_RETURN(shard.ep_rank, IntOption(opts, "ep_rank", 0));
      WSUP_ASSIGN_OR_RETURN(std::string backend, StringOption(opts, "backend", "host"));
      WSUP_ASSIGN_OR_RETURN(std::string revision, StringOption(opts, "revision", ""));
      WSUP_ASSIGN_OR_RETURN(wsup::FingerprintInputs in,
                            wsup::LocalFingerprintInputs(checkpoint_dir, revision, shard, backend, o.device));
      WSUP_ASSIGN_OR_RETURN(in.pp_size, IntOption(opts, "pp_size", 1));
      WSUP_ASSIGN_OR_RETURN(in.pp_rank, IntOption(opts, "pp_rank", 0));
      WSUP_ASSIGN_OR_RETURN(in.dp_size, IntOption(opts, "dp_size", 1));
      WSUP_ASSIGN_OR_RETURN(ours, wsup::ComputeFingerprint(checkpoint_dir, in));
    }
  }
  return req;
}

void SetHolderFingerprint(wsup_attachment* a) {
  if (a->att) {
    a->holder_fp_json =
        a->att->holder_fingerprint().ToJson().dump(-1, ' ', false, json::error_handler_t::replace);
  }
}

// The engine's identity of an engine-made layout (options "engine",
// "engine_version", "transform"), added to the fingerprint. `required`:
// the fingerprint must end up naming an engine, from the options or as
// given; otherwise the options are applied only when "engine" is there.
wsup::Status AddEngineIdentity(Request* req, bool required) {
  if (req->o.mode == wsup::AttachMode::kOff) return wsup::Status::Ok();
  const bool named = req->opts.contains("engine");
  if (!named && (!required || wsup::IsEngineLayout(req->ours))) return wsup::Status::Ok();
  wsup::EngineLayoutId id;
  WSUP_ASSIGN_OR_RETURN(id.engine, StringOption(req->opts, "engine", ""));
  WSUP_ASSIGN_OR_RETURN(id.version, StringOption(req->opts, "engine_version", ""));
  WSUP_ASSIGN_OR_RETURN(id.transform, StringOption(req->opts, "transform", ""));
  if (id.engine.empty() || id.version.empty()) {
    return wsup::InvalidArgument("options_json: 'engine' and 'engine_version' name the engine whose layout "
                                 "this is (and 'transform' what it does to the checkpoint); give them to "
                                 "wsup_publish_begin, and the same to wsup_attach to attach that layout");
  }
  wsup::AddEngineLayout(&req->ours, id);
  return wsup::Status::Ok();
}

wsup::Result<uint64_t> WaitOption(const json& opts, int fallback) {
  WSUP_ASSIGN_OR_RETURN(int wait_ms, IntOption(opts, "wait_ms", fallback));
  if (wait_ms < 0) return wsup::InvalidArgument("options_json: 'wait_ms' must be 0 or more");
  return static_cast<uint64_t>(wait_ms);
}

wsup::Status DoAttach(wsup_attachment* a, const char* socket_path, const char* mode, const char* fingerprint_json,
                      const char* checkpoint_dir, const char* options_json) {
  WSUP_ASSIGN_OR_RETURN(Request req, Prepare(socket_path, mode, fingerprint_json, checkpoint_dir, options_json));
  WSUP_RETURN_IF_ERROR(AddEngineIdentity(&req, false));
  WSUP_ASSIGN_OR_RETURN(req.o.layout_wait_ms, WaitOption(req.opts, 0));
  WSUP_ASSIGN_OR_RETURN(wsup::AttachResult r, wsup::Attach(req.o, req.ours));
  a->outcome = std::move(r.outcome);
  a->source = wsup::WeightSourceName(a->outcome.source);
  a->diffs_json = wsup::DiffsToJson(a->outcome.diffs).dump(-1, ' ', false, json::error_handler_t::replace);
  a->att = std::move(r.attachment);
  SetHolderFingerprint(a);
  return wsup::Status::Ok();
}

wsup::Status DoPublishBegin(wsup_attachment* a, const char* socket_path, const char* mode,
                            const char* fingerprint_json, const char* checkpoint_dir, const char* options_json) {
  WSUP_ASSIGN_OR_RETURN(Request req, Prepare(socket_path, mode, fingerprint_json, checkpoint_dir, options_json));
  // The engine's identity: from the options, or already in the fingerprint given.
  WSUP_RETURN_IF_ERROR(AddEngineIdentity(&req, true));
  WSUP_ASSIGN_OR_RETURN(uint64_t wait_ms, WaitOption(req.opts, static_cast<int>(wsup::kDefaultLayoutWaitMs)));
  WSUP_ASSIGN_OR_RETURN(wsup::LayoutResult r, wsup::AttachOrPublish(req.o, req.ours, wait_ms));
  a->outcome = std::move(r.outcome);
  a->source = wsup::WeightSourceName(a->outcome.source);
  a->diffs_json = wsup::DiffsToJson(a->outcome.diffs).dump(-1, ' ', false, json::error_handler_t::replace);
  a->att = std::move(r.attachment);
  a->pub = std::move(r.publication);
  SetHolderFingerprint(a);
  return wsup::Status::Ok();
}

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

// Runs one publish step, keeping the error text on the handle.
template <typename F>
int Step(wsup_attachment* a, F&& f) {
  if (a == nullptr) return WSUP_ERR_INVALID_ARGUMENT;
  try {
    wsup::Status s = f();
    if (s.ok()) return WSUP_OK;
    a->error = s.error().ToString();
    return StatusCode(s.code());
  } catch (const std::bad_alloc&) {
    a->error = "out of memory";
    return WSUP_ERR_INTERNAL;
  } catch (...) {
    a->error = "unexpected exception";
    return WSUP_ERR_INTERNAL;
  }
}

wsup::Status NoLease(const char* call) {
  return wsup::InvalidArgument(std::string(call) +
                               ": this handle holds no write lease (wsup_has_lease is 0): only a handle from "
                               "wsup_publish_begin that got the lease allocates, commits or aborts");
}

// A new handle, filled by `start`; any failure, an exception included, is
// recorded on the handle instead of crossing the C boundary.
template <typename Start>
wsup_attachment* Guarded(Start start, const char* socket_path, const char* mode, const char* fingerprint_json,
                         const char* checkpoint_dir, const char* options_json) {
  wsup_attachment* a = nullptr;
  try {
    a = new wsup_attachment();
    wsup::Status s = start(a, socket_path, mode, fingerprint_json, checkpoint_dir, options_json);
    if (!s.ok()) Fail(a, s.error());
  } catch (const std::bad_alloc&) {
    if (a != nullptr) Fail(a, wsup::Internal("out of memory"));
  } catch (const std::exception& e) {
    if (a != nullptr) Fail(a, wsup::Internal(std::string("unexpected exception: ") + e.what()));
  } catch (...) {
    if (a != nullptr) Fail(a, wsup::Internal("unexpected exception"));
  }
  return a;
}

wsup::LeaseAllocator& Allocator() { return wsup::LeaseAllocator::Process(); }

// The last failure of wsup_torch_malloc or wsup_torch_free, which cannot
// return one: kept for wsup_torch_last_error, and on the target's handle
// (wsup_error) when there is one. Callers hold the allocator's mutex.
std::string& LastTorchError() {
  static std::string* last = new std::string();
  return *last;
}

void TorchFailed(const wsup::Error& e) {
  LastTorchError() = e.ToString();
  if (auto* target = static_cast<wsup_attachment*>(const_cast<void*>(Allocator().target_owner()))) {
    target->error = e.ToString();
  }
}

void TorchFailedNoThrow(const char* what) {
  try {
    LastTorchError() = what;
  } catch (...) {
  }
}

}  // namespace

extern "C" {

wsup_attachment* wsup_attach(const char* socket_path, const char* mode, const char* fingerprint_json,
                             const char* checkpoint_dir, const char* options_json) {
  return Guarded(DoAttach, socket_path, mode, fingerprint_json, checkpoint_dir, options_json);
}

wsup_attachment* wsup_publish_begin(const char* socket_path, const char* mode, const char* fingerprint_json,
                                    const char* checkpoint_dir, const char* options_json) {
  return Guarded(DoPublishBegin, socket_path, mode, fingerprint_json, checkpoint_dir, options_json);
}

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

int wsup_status(const wsup_attachment* a) { return a ? a->status : WSUP_ERR_INVALID_ARGUMENT; }
const char* wsup_error(const wsup_attachment* a) { return a ? a->error.c_str() : "no handle (NULL)"; }
int wsup_from_holder(const wsup_attachment* a) { return a && a->att ? 1 : 0; }
const char* wsup_source(const wsup_attachment* a) { return a ? a->source.c_str() : "disk"; }
const char* wsup_reason(const wsup_attachment* a) { return a ? a->outcome.reason.c_str() : ""; }
const char* wsup_diffs_json(const wsup_attachment* a) { return a ? a->diffs_json.c_str() : "[]"; }
double wsup_attach_ms(const wsup_attachment* a) { return a ? a->outcome.ms : 0.0; }
const char* wsup_holder_fingerprint_json(const wsup_attachment* a) { return a ? a->holder_fp_json.c_str() : "{}"; }

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

int wsup_publish_set_allocator_target(wsup_attachment* a) {
  if (a == nullptr) {
    try {
      std::lock_guard<std::mutex> lock(Allocator().mutex());
      return StatusCode(Allocator().SetTarget(nullptr, nullptr).code());
    } catch (...) {
      return WSUP_ERR_INTERNAL;
    }
  }
  return Step(a, [&]() -> wsup::Status {
    std::lock_guard<std::mutex> lock(Allocator().mutex());
    if (!wsup_has_lease(a)) return NoLease("wsup_publish_set_allocator_target");
    return Allocator().SetTarget(a, a->pub.get());
  });
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

void* wsup_torch_malloc(ssize_t size, int device, void* stream) {
  (void)stream;  // the lease's memory is the same for every stream
  try {
    std::lock_guard<std::mutex> lock(Allocator().mutex());
    auto p = size <= 0 ? wsup::Result<void*>(wsup::InvalidArgument("wsup_torch_malloc of " + std::to_string(size) +
                                                                   " bytes: ask for 1 byte or more"))
                       : Allocator().Malloc(static_cast<uint64_t>(size), device);
    if (p.ok()) return *p;
    TorchFailed(p.error());
  } catch (...) {
    TorchFailedNoThrow("wsup_torch_malloc: out of memory or an unexpected exception");
  }
  return nullptr;
}

void wsup_torch_free(void* ptr, ssize_t size, int device, void* stream) {
  (void)size;  // the carver knows every block's size
  (void)device;
  (void)stream;
  if (ptr == nullptr) return;
  try {
    std::lock_guard<std::mutex> lock(Allocator().mutex());
    wsup::Status s = Allocator().Free(ptr);
    if (!s.ok()) TorchFailed(s.error());
  } catch (...) {
    TorchFailedNoThrow("wsup_torch_free: an unexpected exception");
  }
}

int wsup_torch_reserve(wsup_attachment* a, uint64_t bytes) {
  if (a == nullptr) return WSUP_ERR_INVALID_ARGUMENT;
  try {
    // The error is set under the allocator's lock: wsup_torch_malloc may
    // report to this handle from another thread at the same time.
    std::lock_guard<std::mutex> lock(Allocator().mutex());
    wsup::Status s = Allocator().Reserve(a, bytes);
    if (s.ok()) return WSUP_OK;
    a->error = s.error().ToString();
    return StatusCode(s.code());
  } catch (...) {
    return WSUP_ERR_INTERNAL;
  }
}

int wsup_torch_set_chunk_bytes(uint64_t bytes) {
  if (bytes > wsup::Carver::kMaxBlockBytes) return WSUP_ERR_INVALID_ARGUMENT;
  try {
    std::lock_guard<std::mutex> lock(Allocator().mutex());
    Allocator().SetChunkBytes(bytes);
    return WSUP_OK;
  } catch (...) {
    return WSUP_ERR_INTERNAL;
  }
}

const char* wsup_torch_last_error(void) {
  thread_local std::string copy;
  try {
    std::lock_guard<std::mutex> lock(Allocator().mutex());
    copy = LastTorchError();
  } catch (...) {
    copy.clear();
  }
  return copy.c_str();
}

int wsup_torch_usage(const wsup_attachment* a, uint64_t* granted_bytes, uint64_t* used_bytes, uint64_t* blocks) {
  try {
    std::lock_guard<std::mutex> lock(Allocator().mutex());
    wsup::Carver::Stats st = Allocator().Usage(a);
    if (granted_bytes != nullptr) *granted_bytes = st.granted_bytes;
    if (used_bytes != nullptr) *used_bytes = st.used_bytes;
    if (blocks != nullptr) *blocks = st.blocks;
    return WSUP_OK;
  } catch (...) {
    return WSUP_ERR_INTERNAL;
  }
}

void wsup_detach(wsup_attachment* a) {
  if (a == nullptr) return;
  try {
    std::lock_guard<std::mutex> lock(Allocator().mutex());
    // Blocks torch still holds in the lease keep their memory mapped
    // (client/torch_allocator.h) after the handle is gone.
    Allocator().Closed(a, "the publication's handle was detached", true);
    delete a;
  } catch (...) {
  }
}

wsup_kv_pool* wsup_kv_pool_fetch(const char* socket_path, int timeout_ms) {
  wsup_kv_pool* p = nullptr;
  try {
    p = new wsup_kv_pool();
    if (socket_path == nullptr || *socket_path == '\0' || timeout_ms <= 0) {
      p->status = WSUP_ERR_INVALID_ARGUMENT;
      p->error = "wsup_kv_pool_fetch: give the holder's socket path and a timeout_ms above 0";
      return p;
    }
    auto fetched = wsup::FetchKvPool(socket_path, timeout_ms);
    if (!fetched.ok()) {
      p->status = StatusCode(fetched.error().code());
      p->error = fetched.error().ToString();
      return p;
    }
    p->pool = std::move(*fetched);
    p->json = json{{"id", p->pool.pool.id},
                   {"backend", p->pool.pool.backend},
                   {"device", p->pool.pool.device},
                   {"allocations", p->pool.pool.allocations}}
                  .dump();
  } catch (const std::bad_alloc&) {
    if (p != nullptr) {
      p->status = WSUP_ERR_INTERNAL;
      p->error = "out of memory";
    }
  } catch (...) {
    if (p != nullptr) {
      p->status = WSUP_ERR_INTERNAL;
      p->error = "unexpected exception";
    }
  }
  return p;
}

int wsup_kv_pool_status(const wsup_kv_pool* p) { return p ? p->status : WSUP_ERR_INVALID_ARGUMENT; }

const char* wsup_kv_pool_error(const wsup_kv_pool* p) {
  return p ? p->error.c_str() : "wsup_kv_pool_error: the handle is NULL";
}

const char* wsup_kv_pool_json(const wsup_kv_pool* p) { return p ? p->json.c_str() : "{}"; }

size_t wsup_kv_pool_allocations(const wsup_kv_pool* p) { return p ? p->pool.fds.size() : 0; }

int wsup_kv_pool_fd(const wsup_kv_pool* p, size_t i) {
  return p && i < p->pool.fds.size() ? p->pool.fds[i].get() : -1;
}

uint64_t wsup_kv_pool_allocation_bytes(const wsup_kv_pool* p, size_t i) {
  return p && i < p->pool.pool.allocations.size() ? p->pool.pool.allocations[i] : 0;
}

void wsup_kv_pool_release(wsup_kv_pool* p) { delete p; }

int wsup_arm_death_word(char* err, size_t err_len) {
  try {
    auto r = wsup::ArmDeathWordFromEnv();
    if (r.ok()) return *r ? 1 : 0;
    if (err && err_len > 0) {
      const std::string& m = r.error().message();
      const size_t n = std::min(m.size(), err_len - 1);
      std::memcpy(err, m.data(), n);
      err[n] = '\0';
    }
    return -StatusCode(r.error().code());
  } catch (...) {
    if (err && err_len > 0) err[0] = '\0';
    return -WSUP_ERR_INTERNAL;
  }
}

uint64_t wsup_kv_token_hash(const int32_t* ids, size_t n, uint64_t seed) {
  return ids == nullptr ? seed : wsup::TokenHash(ids, n, seed);
}

const char* wsup_client_version(void) { return WSUP_VERSION_STRING; }

}  // extern "C"
