// The C ABI's torch allocator (client/wsup_client.h, over
// client/torch_allocator.h): a model's tensors carved out of a handle's
// write lease. Every call serializes on the allocator's one lock.

#include <sys/types.h>

#include <exception>
#include <mutex>
#include <string>

#include "client/c_api_handle.h"
#include "client/carver.h"
#include "client/torch_allocator.h"
#include "client/wsup_client.h"

namespace {

using wsup::capi::Allocator;
using wsup::capi::NoLease;
using wsup::capi::StatusCode;
using wsup::capi::Step;

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

}  // extern "C"
