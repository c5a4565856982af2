#include "client/torch_allocator.h"

#include <algorithm>

namespace wsup {

LeaseAllocator& LeaseAllocator::Process() {
  // Never destroyed: torch may free blocks while the process exits.
  static LeaseAllocator* a = new LeaseAllocator();
  return *a;
}

LeaseAllocator::Pool* LeaseAllocator::Find(const void* owner) const {
  for (const auto& p : pools_) {
    if (p->owner == owner && owner != nullptr) return p.get();
  }
  return nullptr;
}

Status LeaseAllocator::SetTarget(const void* owner, Publication* pub) {
  if (pub == nullptr) {
    Pool* old = target_;
    target_ = nullptr;
    if (old != nullptr) DropIfDone(old);
    return Status::Ok();
  }
  if (pub->done()) {
    return InvalidArgument(
        "this publication was committed or aborted: only one that holds its lease can be the "
        "allocator's target");
  }
  Pool* p = Find(owner);
  if (p == nullptr || p->pub != pub) {
    auto fresh = std::make_unique<Pool>();
    fresh->owner = owner;
    fresh->pub = pub;
    fresh->host = pub->lease().backend != "cuda";
    fresh->device = pub->device();
    Pool* raw = fresh.get();
    fresh->carver = std::make_unique<Carver>(
        [raw](uint64_t bytes) -> Result<Carver::Grant> {
          if (raw->pub == nullptr) return Internal("a grant asked of a closed pool; this is a wsup bug");
          WSUP_ASSIGN_OR_RETURN(Publication::Region r, raw->pub->Allocate(bytes));
          if (!raw->mapping) raw->mapping = raw->pub->mapping();
          return Carver::Grant{r.alloc, reinterpret_cast<uint64_t>(r.data), r.size};
        },
        chunk_bytes_);
    if (p != nullptr) p->owner = nullptr;  // an older pool of a handle that published again
    pools_.push_back(std::move(fresh));
    p = raw;
  }
  Pool* old = target_;
  target_ = p;
  if (old != nullptr && old != p) DropIfDone(old);
  return Status::Ok();
}

void LeaseAllocator::Closed(const void* owner, const std::string& why, bool owner_gone) {
  Pool* p = Find(owner);
  if (p == nullptr) return;
  p->pub = nullptr;
  p->carver->CloseSource(why);
  if (owner_gone) {
    p->owner = nullptr;
    if (target_ == p) target_ = nullptr;
  }
  DropIfDone(p);
}

void LeaseAllocator::DropIfDone(Pool* p) {
  if (p == target_ || p->pub != nullptr || p->carver->stats().blocks != 0) return;
  pools_.erase(std::remove_if(pools_.begin(), pools_.end(), [p](const auto& q) { return q.get() == p; }),
               pools_.end());
}

Status LeaseAllocator::Reserve(const void* owner, uint64_t bytes) {
  Pool* p = Find(owner);
  if (p == nullptr || p->pub == nullptr) {
    return InvalidArgument(
        "wsup_torch_reserve: this handle has no open pool; call wsup_publish_set_allocator_target with it "
        "while it holds the write lease first");
  }
  return p->carver->Reserve(bytes);
}

Result<void*> LeaseAllocator::Malloc(uint64_t bytes, int device) {
  if (target_ == nullptr) {
    return InvalidArgument(
        "wsup_torch_malloc: no publication is the allocator's target; call "
        "wsup_publish_set_allocator_target with a handle that holds a write lease first");
  }
  if (!target_->host && device != target_->device) {
    return InvalidArgument("wsup_torch_malloc: memory asked for on cuda device " + std::to_string(device) +
                           " but the target lease's memory is on device " + std::to_string(target_->device) +
                           "; allocate on that device inside the pool");
  }
  WSUP_ASSIGN_OR_RETURN(uint64_t at, target_->carver->Allocate(bytes));
  return reinterpret_cast<void*>(at);
}

Status LeaseAllocator::Free(void* ptr) {
  const auto at = reinterpret_cast<uint64_t>(ptr);
  for (const auto& p : pools_) {
    if (!p->carver->Owns(at)) continue;
    Pool* pool = p.get();
    WSUP_RETURN_IF_ERROR(pool->carver->Free(at));
    DropIfDone(pool);
    return Status::Ok();
  }
  return InvalidArgument("wsup_torch_free: the address is in no lease this allocator carved (" +
                         std::to_string(pools_.size()) +
                         " pools); it was not allocated by wsup_torch_malloc");
}

void LeaseAllocator::SetChunkBytes(uint64_t bytes) {
  chunk_bytes_ = bytes == 0 ? Carver::kDefaultChunkBytes : bytes;
  for (const auto& p : pools_) p->carver->set_chunk_bytes(chunk_bytes_);
}

const void* LeaseAllocator::target_owner() const { return target_ != nullptr ? target_->owner : nullptr; }

Carver::Stats LeaseAllocator::Usage(const void* owner) const {
  Pool* p = Find(owner);
  return p != nullptr ? p->carver->stats() : Carver::Stats{};
}

}  // namespace wsup
