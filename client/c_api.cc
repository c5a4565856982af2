// The C ABI (client/wsup_client.h) over the C++ client (client/client.h):
// attach and wsup_publish_begin (the options and the fingerprint, from the
// caller's arguments), the outcome, detach, the death word and the version.
// The rest of the ABI is in the files client/c_api_handle.h lists.

#include <algorithm>
#include <cstring>
#include <exception>
#include <mutex>
#include <new>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

#include "client/c_api_handle.h"
#include "client/client.h"
#include "client/publish.h"
#include "client/wsup_client.h"
#include "wire/death_word.h"

#ifndef WSUP_VERSION_STRING
#define WSUP_VERSION_STRING "0.0.0"
#endif

namespace wsup::capi {

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

wsup::Result<std::string> StringOption(const nlohmann::json& opts, const char* key, const std::string& fallback) {
  auto it = opts.find(key);
  if (it == opts.end()) return fallback;
  if (!it->is_string()) return wsup::InvalidArgument(std::string("options_json: '") + key + "' must be a string");
  return it->get<std::string>();
}

void SetHolderFingerprint(wsup_attachment* a) {
  if (a->att) {
    a->holder_fp_json =
        a->att->holder_fingerprint().ToJson().dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
}

}  // namespace wsup::capi

namespace {

using nlohmann::json;
using wsup::capi::Allocator;
using wsup::capi::Fail;
using wsup::capi::SetHolderFingerprint;
using wsup::capi::StatusCode;
using wsup::capi::StringOption;

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

int wsup_status(const wsup_attachment* a) { return a ? a->status : WSUP_ERR_INVALID_ARGUMENT; }
const char* wsup_error(const wsup_attachment* a) { return a ? a->error.c_str() : "no handle (NULL)"; }
int wsup_from_holder(const wsup_attachment* a) { return a && a->att ? 1 : 0; }
const char* wsup_source(const wsup_attachment* a) { return a ? a->source.c_str() : "disk"; }
const char* wsup_reason(const wsup_attachment* a) { return a ? a->outcome.reason.c_str() : ""; }
const char* wsup_diffs_json(const wsup_attachment* a) { return a ? a->diffs_json.c_str() : "[]"; }
double wsup_attach_ms(const wsup_attachment* a) { return a ? a->outcome.ms : 0.0; }
const char* wsup_holder_fingerprint_json(const wsup_attachment* a) { return a ? a->holder_fp_json.c_str() : "{}"; }

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

const char* wsup_client_version(void) { return WSUP_VERSION_STRING; }

}  // extern "C"
