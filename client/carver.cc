#include "client/carver.h"

#include <algorithm>
#include <utility>

namespace wsup {

Carver::Carver(GrantSource source, uint64_t chunk_bytes, uint64_t alignment)
    : source_(std::move(source)), chunk_bytes_(chunk_bytes == 0 ? 1 : chunk_bytes), alignment_(alignment) {
  if (alignment_ == 0 || (alignment_ & (alignment_ - 1)) != 0) alignment_ = kDefaultAlignment;
}

void Carver::CloseSource(const std::string& why) {
  source_ = nullptr;
  closed_why_ = why;
}

std::map<uint64_t, Carver::GrantRanges>::iterator Carver::GrantOf(uint64_t address) {
  auto it = grants_.upper_bound(address);
  if (it == grants_.begin()) return grants_.end();
  --it;
  return address - it->first < it->second.size ? it : grants_.end();
}

std::map<uint64_t, Carver::GrantRanges>::const_iterator Carver::GrantOf(uint64_t address) const {
  auto it = grants_.upper_bound(address);
  if (it == grants_.begin()) return grants_.end();
  --it;
  return address - it->first < it->second.size ? it : grants_.end();
}

uint64_t Carver::TakeFirstFit(GrantRanges& g, uint64_t bytes) {
  for (auto it = g.free.begin(); it != g.free.end(); ++it) {
    if (it->second < bytes) continue;
    const uint64_t at = it->first;
    const uint64_t left = it->second - bytes;
    g.free.erase(it);
    if (left > 0) g.free.emplace(at + bytes, left);
    return at;
  }
  return 0;
}

Result<uint64_t> Carver::Check(uint64_t bytes, const char* what) const {
  if (bytes == 0 || bytes > kMaxBlockBytes) {
    return InvalidArgument(std::string(what) + " of " + std::to_string(bytes) + " bytes: ask for 1 byte to 1 TiB");
  }
  if (!source_) {
    // Once the lease is gone its memory is no one's to hand out: a block
    // in a committed layout would change what its readers see.
    return Unavailable(std::string("no ") + what + " can be carved: " +
                       (closed_why_.empty() ? std::string("no grant source") : closed_why_));
  }
  return (bytes + alignment_ - 1) / alignment_ * alignment_;
}

Result<uint64_t> Carver::Allocate(uint64_t bytes) {
  auto checked = Check(bytes, "block");
  if (!checked.ok()) return checked.error();
  const uint64_t size = *checked;
  for (auto& [base, g] : grants_) {
    if (uint64_t at = TakeFirstFit(g, size)) {
      blocks_.emplace(at, size);
      used_bytes_ += size;
      return at;
    }
  }
  const uint64_t ask = std::max(size, chunk_bytes_);
  auto grown = Grow(ask);
  if (!grown.ok())
    return grown.error().With("carving a block of " + std::to_string(size) + " bytes from a new grant of " +
                              std::to_string(ask) + " bytes");
  const uint64_t at = TakeFirstFit(**grown, size);
  blocks_.emplace(at, size);
  used_bytes_ += size;
  return at;
}

Status Carver::Reserve(uint64_t bytes) {
  auto checked = Check(bytes, "reservation");
  if (!checked.ok()) return checked.error();
  auto grown = Grow(std::max(*checked, chunk_bytes_));
  if (!grown.ok()) return grown.error().With("reserving a grant of " + std::to_string(*checked) + " bytes");
  return Status::Ok();
}

Result<Carver::GrantRanges*> Carver::Grow(uint64_t ask) {
  auto got = source_(ask);
  if (!got.ok()) return got.error();
  const Grant grant = *got;
  if (grant.base == 0 || grant.base % alignment_ != 0 || grant.size < ask ||
      grant.base + grant.size < grant.base) {
    return Internal("a grant at " + std::to_string(grant.base) + " of " + std::to_string(grant.size) +
                    " bytes does not answer a request for " + std::to_string(ask) + " bytes aligned to " +
                    std::to_string(alignment_) + "; this is a wsup bug");
  }
  auto next = grants_.lower_bound(grant.base);
  const bool overlaps_next = next != grants_.end() && next->first < grant.base + grant.size;
  const bool overlaps_prev =
      next != grants_.begin() && std::prev(next)->first + std::prev(next)->second.size > grant.base;
  if (overlaps_next || overlaps_prev) {
    return Internal("a grant at " + std::to_string(grant.base) + " of " + std::to_string(grant.size) +
                    " bytes overlaps an earlier one; this is a wsup bug");
  }
  GrantRanges& g = grants_[grant.base];
  g.alloc = grant.alloc;
  // Whole multiples of the alignment only, so every block stays aligned.
  g.size = grant.size / alignment_ * alignment_;
  g.free.emplace(grant.base, g.size);
  return &g;
}

Status Carver::Free(uint64_t address) {
  auto b = blocks_.find(address);
  if (b == blocks_.end()) {
    return InvalidArgument("free of " + std::to_string(address) + ": no block starts there" +
                           (Owns(address) ? " (it is inside a grant: freed twice, or not a block's start)"
                                          : " (it is in none of the grants: not allocated here)"));
  }
  const uint64_t size = b->second;
  auto g = GrantOf(address);
  if (g == grants_.end()) return Internal("a block outside every grant; this is a wsup bug");
  blocks_.erase(b);
  used_bytes_ -= size;
  auto& free = g->second.free;
  uint64_t start = address;
  uint64_t len = size;
  auto next = free.lower_bound(address);
  if (next != free.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first;
      len += prev->second;
      free.erase(prev);
    }
  }
  if (next != free.end() && next->first == address + size) {
    len += next->second;
    free.erase(next);
  }
  free.emplace(start, len);
  return Status::Ok();
}

uint64_t Carver::BlockSize(uint64_t address) const {
  auto b = blocks_.find(address);
  return b == blocks_.end() ? 0 : b->second;
}

bool Carver::Owns(uint64_t address) const { return GrantOf(address) != grants_.end(); }

Carver::Stats Carver::stats() const {
  Stats s;
  s.grants = grants_.size();
  s.blocks = blocks_.size();
  s.used_bytes = used_bytes_;
  for (const auto& [base, g] : grants_) {
    s.granted_bytes += g.size;
    s.free_ranges += g.free.size();
    for (const auto& [at, len] : g.free) s.largest_free = std::max(s.largest_free, len);
  }
  return s;
}

}  // namespace wsup
