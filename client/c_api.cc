// The C ABI (client/wsup_client.h) over the C++ client (client/client.h).
// Every entry point catches everything: no exception may cross into C.

#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "client/client.h"
#include "client/wsup_client.h"

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
};

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

wsup::Status DoAttach(wsup_attachment* a, const char* socket_path, const char* mode, const char* fingerprint_json,
                      const char* checkpoint_dir, const char* options_json) {
  json opts = json::object();
  if (options_json != nullptr && *options_json) {
    WSUP_ASSIGN_OR_RETURN(opts, wsup::ParseMessageBody(options_json, "options_json"));
  }
  wsup::AttachOptions o;
  o.socket_path = socket_path ? socket_path : "";
  WSUP_ASSIGN_OR_RETURN(o.mode, wsup::ParseAttachMode(mode ? mode : ""));
  WSUP_ASSIGN_OR_RETURN(o.client_name, StringOption(opts, "client_name", "engine"));
  WSUP_ASSIGN_OR_RETURN(o.timeout_ms, IntOption(opts, "timeout_ms", 10'000));
  WSUP_ASSIGN_OR_RETURN(o.device, IntOption(opts, "device", 0));
  if (o.timeout_ms <= 0) return wsup::InvalidArgument("options_json: 'timeout_ms' must be positive");

  bool have_fp = fingerprint_json != nullptr && *fingerprint_json;
  bool have_dir = checkpoint_dir != nullptr && *checkpoint_dir;
  wsup::Fingerprint ours;
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
      WSUP_ASSIGN_OR_RETURN(std::string backend, StringOption(opts, "backend", "host"));
      WSUP_ASSIGN_OR_RETURN(std::string revision, StringOption(opts, "revision", ""));
      WSUP_ASSIGN_OR_RETURN(wsup::FingerprintInputs in,
                            wsup::LocalFingerprintInputs(checkpoint_dir, revision, shard, backend, o.device));
      WSUP_ASSIGN_OR_RETURN(in.pp_size, IntOption(opts, "pp_size", 1));
      WSUP_ASSIGN_OR_RETURN(in.pp_rank, IntOption(opts, "pp_rank", 0));
      WSUP_ASSIGN_OR_RETURN(in.dp_size, IntOption(opts, "dp_size", 1));
      WSUP_ASSIGN_OR_RETURN(in.ep_size, IntOption(opts, "ep_size", 1));
      WSUP_ASSIGN_OR_RETURN(ours, wsup::ComputeFingerprint(checkpoint_dir, in));
    }
  }
  WSUP_ASSIGN_OR_RETURN(wsup::AttachResult r, wsup::Attach(o, ours));
  a->outcome = std::move(r.outcome);
  a->source = wsup::WeightSourceName(a->outcome.source);
  a->diffs_json = wsup::DiffsToJson(a->outcome.diffs).dump(-1, ' ', false, json::error_handler_t::replace);
  a->att = std::move(r.attachment);
  if (a->att) {
    a->holder_fp_json =
        a->att->holder_fingerprint().ToJson().dump(-1, ' ', false, json::error_handler_t::replace);
  }
  return wsup::Status::Ok();
}

}  // namespace

extern "C" {

wsup_attachment* wsup_attach(const char* socket_path, const char* mode, const char* fingerprint_json,
                             const char* checkpoint_dir, const char* options_json) {
  wsup_attachment* a = nullptr;
  try {
    a = new wsup_attachment();
    wsup::Status s = DoAttach(a, socket_path, mode, fingerprint_json, checkpoint_dir, options_json);
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

int wsup_status(const wsup_attachment* a) { return a ? a->status : WSUP_ERR_INVALID_ARGUMENT; }
const char* wsup_error(const wsup_attachment* a) { return a ? a->error.c_str() : "no handle (NULL)"; }
int wsup_from_holder(const wsup_attachment* a) { return a && a->att ? 1 : 0; }
const char* wsup_source(const wsup_attachment* a) { return a ? a->source.c_str() : "disk"; }
const char* wsup_reason(const wsup_attachment* a) { return a ? a->outcome.reason.c_str() : ""; }
const char* wsup_diffs_json(const wsup_attachment* a) { return a ? a->diffs_json.c_str() : "[]"; }
double wsup_attach_ms(const wsup_attachment* a) { return a ? a->outcome.ms : 0.0; }
const char* wsup_holder_fingerprint_json(const wsup_attachment* a) { return a ? a->holder_fp_json.c_str() : "{}"; }

int wsup_is_cuda(const wsup_attachment* a) { return a && a->att && a->att->arena().is_cuda() ? 1 : 0; }

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

void wsup_detach(wsup_attachment* a) {
  try {
    delete a;
  } catch (...) {
  }
}

const char* wsup_client_version(void) { return WSUP_VERSION_STRING; }

}  // extern "C"
