// The C ABI's attach handle and the helpers its files share. The C ABI
// (client/wsup_client.h) is implemented over the C++ client in one file per
// part of that header: c_api.cc (attach, the outcome, detach),
// c_api_manifest.cc (the tensors and the manifest table), c_api_publish.cc
// (engine-made layouts: the write lease's steps), c_api_torch.cc (the torch
// allocator) and c_api_kv_pool.cc (the node's KV pool and its journal).
// Private to client/. Every entry point catches everything: no exception
// may cross into C.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <new>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "client/client.h"
#include "client/publish.h"
#include "client/torch_allocator.h"
#include "client/wsup_client.h"
#include "common/status.h"

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

// Hidden: libwsup_client.so exports the C ABI, not these.
#pragma GCC visibility push(hidden)

namespace wsup::capi {

// The C status code of `code`.
int StatusCode(Code code);

// Records a failure on the handle (wsup_status, wsup_error).
void Fail(wsup_attachment* a, const Error& e);

// Reads a string option ("options_json", or a field of "entries_json"),
// refusing anything else with the key's name.
Result<std::string> StringOption(const nlohmann::json& opts, const char* key, const std::string& fallback);

// Keeps the holder's fingerprint on the handle, as JSON, once attached.
void SetHolderFingerprint(wsup_attachment* a);

// The refusal of a publish step on a handle without the write lease.
Status NoLease(const char* call);

// The process's torch allocator; its mutex serializes every publish step
// and torch call (wsup_client.h, "The torch allocator").
inline LeaseAllocator& Allocator() { return LeaseAllocator::Process(); }

// Runs one publish step, keeping the error text on the handle.
template <typename F>
int Step(wsup_attachment* a, F&& f) {
  if (a == nullptr) return WSUP_ERR_INVALID_ARGUMENT;
  try {
    Status s = f();
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

}  // namespace wsup::capi

#pragma GCC visibility pop
