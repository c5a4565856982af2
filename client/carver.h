// Carver: hands out many small blocks from a few large grants, for an
// allocator that asks often (torch's caching allocator through
// wsup_torch_malloc, client/torch_allocator.h) while the grants come from a
// holder one round trip each (a layout's write lease, client/publish.h).
//
// Allocate(n) rounds n up to the alignment and takes the first free range
// that fits, grants in address order and ranges in address order within a
// grant (first fit). When none fits it asks its grant source for
// max(n, chunk_bytes) more and carves from that. Free() gives a block back
// and merges it with the free ranges beside it, inside its grant only: a
// block never spans two grants, because each grant is one allocation of
// the layout and a committed tensor must lie in one. Grants are never given
// back (a grant belongs to the layout for good), so freed ranges are only
// ever reused by later blocks: a loader that frees its temporaries costs
// no more grants than its peak.
//
// Addresses are plain integers: host pointers or CUDA device pointers,
// whatever the source grants; the carver never touches the memory.
//
// Not thread-safe: the caller serializes every call (a mutex).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <unordered_map>

#include "common/status.h"

namespace wsup {

class Carver {
 public:
  struct Grant {
    uint32_t alloc = 0;  // the layout's allocation index
    uint64_t base = 0;   // address of its first byte
    uint64_t size = 0;   // at least the bytes asked for
  };
  // Asked for at least `bytes` more; an error ends the Allocate() that asked.
  using GrantSource = std::function<Result<Grant>(uint64_t bytes)>;

  static constexpr uint64_t kDefaultChunkBytes = 1ull << 30;
  static constexpr uint64_t kDefaultAlignment = 512;      // torch's smallest block
  static constexpr uint64_t kMaxBlockBytes = 1ull << 40;  // a layout's largest allocation

  // alignment: a power of two; grants must start at a multiple of it.
  explicit Carver(GrantSource source, uint64_t chunk_bytes = kDefaultChunkBytes,
                  uint64_t alignment = kDefaultAlignment);

  // The address of a new block of at least `bytes` (1 to kMaxBlockBytes).
  Result<uint64_t> Allocate(uint64_t bytes);
  // Asks the source for a grant of max(bytes, the chunk size) now, before
  // any block needs it, so that a loader's first allocations find it ready
  // (the Python client asks for it while the loader builds its model).
  Status Reserve(uint64_t bytes);
  // Gives back a block Allocate() returned; anything else (an unknown or
  // already freed address) is an error and changes nothing.
  Status Free(uint64_t address);

  // Grants asked for from now on: at least this many bytes (at least 1).
  void set_chunk_bytes(uint64_t bytes) { chunk_bytes_ = bytes == 0 ? 1 : bytes; }
  uint64_t chunk_bytes() const { return chunk_bytes_; }
  // No more blocks: every Allocate() from now on fails with `why` (the
  // lease is committed or gone); Free() still takes blocks back.
  void CloseSource(const std::string& why);
  bool source_open() const { return static_cast<bool>(source_); }

  // The block that starts at `address`: its size, or 0 when none does.
  uint64_t BlockSize(uint64_t address) const;
  // True when `address` lies in one of the grants.
  bool Owns(uint64_t address) const;

  struct Stats {
    uint64_t grants = 0;
    uint64_t granted_bytes = 0;
    uint64_t blocks = 0;      // live
    uint64_t used_bytes = 0;  // in live blocks (rounded sizes)
    uint64_t free_ranges = 0;
    uint64_t largest_free = 0;
  };
  Stats stats() const;

 private:
  struct GrantRanges {
    uint32_t alloc = 0;
    uint64_t size = 0;
    std::map<uint64_t, uint64_t> free;  // start -> bytes, never touching each other
  };
  // The grant that holds `address`, or grants_.end().
  std::map<uint64_t, GrantRanges>::iterator GrantOf(uint64_t address);
  std::map<uint64_t, GrantRanges>::const_iterator GrantOf(uint64_t address) const;
  // `bytes` rounded up to the alignment, or why a block (or reservation:
  // `what`) of that size cannot be carved at all.
  Result<uint64_t> Check(uint64_t bytes, const char* what) const;
  // Takes `bytes` from the first range of `g` that fits; 0 when none does.
  static uint64_t TakeFirstFit(GrantRanges& g, uint64_t bytes);
  // A new grant of at least `ask` bytes from the source, free in full.
  Result<GrantRanges*> Grow(uint64_t ask);

  GrantSource source_;
  std::string closed_why_;
  uint64_t chunk_bytes_;
  uint64_t alignment_;
  std::map<uint64_t, GrantRanges> grants_;         // by base address
  std::unordered_map<uint64_t, uint64_t> blocks_;  // live: address -> bytes
  uint64_t used_bytes_ = 0;
};

}  // namespace wsup
