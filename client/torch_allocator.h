// LeaseAllocator: the process's allocator behind the C ABI's torch entry
// points (wsup_torch_malloc / wsup_torch_free in client/wsup_client.h, the
// two functions torch.cuda.memory.CUDAPluggableAllocator calls), which
// carves torch's memory out of one publication's write lease so that a
// model loaded by its own loader lands in memory the holder granted.
//
// One pool per publication that was ever a target: a Carver
// (client/carver.h) over the lease's grants, and a share of the writer's
// GrantMapping. The target is the pool new blocks come from; frees go to
// whichever pool holds the address. A pool outlives its publication (its
// commit, its abort, its handle's wsup_detach) for as long as any block of
// it is live, and with it the mapping: a torch tensor in the lease stays
// readable until torch frees it, whatever happens to the handle. Once
// the lease is gone no more grants can be had (the pool says why), and
// the pool is dropped when its last block is freed.
//
// Owners are opaque keys (the C ABI's handles); nothing here dereferences
// them. Thread-safety: every call, and every call into a Publication that
// is or was a target, with mutex() held (the C ABI does so).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "client/carver.h"
#include "client/mapping.h"
#include "client/publish.h"
#include "common/status.h"

namespace wsup {

class LeaseAllocator {
 public:
  static LeaseAllocator& Process();
  std::mutex& mutex() { return mu_; }

  // Makes `pub` (owned by `owner`, holding its lease) the target, with the
  // pool it had before if it was one. nullptr clears the target.
  Status SetTarget(const void* owner, Publication* pub);
  // The owner's publication is done (`why` says how): no more grants. With
  // owner_gone the owner's handle is going away too: it stops being the
  // target, and errors are no longer reported to it.
  void Closed(const void* owner, const std::string& why, bool owner_gone);

  // A block of `bytes` from the target on cuda `device` (ignored for host
  // leases). The error names the reason and, where it has one, the target.
  Result<void*> Malloc(uint64_t bytes, int device);
  // Gets the owner's pool a grant of max(bytes, the chunk size) now
  // (Carver::Reserve); the owner must have been made the target before.
  Status Reserve(const void* owner, uint64_t bytes);
  Status Free(void* p);

  // The size of grants asked for from now on (default Carver::kDefaultChunkBytes).
  void SetChunkBytes(uint64_t bytes);
  const void* target_owner() const;
  Carver::Stats Usage(const void* owner) const;
  size_t pools() const { return pools_.size(); }

 private:
  struct Pool {
    const void* owner = nullptr;
    Publication* pub = nullptr;  // null once the lease is gone
    bool host = true;
    int device = -1;
    std::shared_ptr<GrantMapping> mapping;  // keeps the blocks mapped
    std::unique_ptr<Carver> carver;
  };
  Pool* Find(const void* owner) const;
  void DropIfDone(Pool* p);

  std::mutex mu_;
  std::vector<std::unique_ptr<Pool>> pools_;
  Pool* target_ = nullptr;
  uint64_t chunk_bytes_ = Carver::kDefaultChunkBytes;
};

}  // namespace wsup
