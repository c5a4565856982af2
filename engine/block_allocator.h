// BlockAllocator: which of the KV cache's blocks are free, as the
// scheduler hands them to sequences. Block ids are a KvLayout's
// (engine/kv_memory.h): the node's pool's 0..pool_blocks-1, then the
// engine's scratch from scratch_first.
//
// The scratch's blocks are always handed out. The pool's only between
// OpenPool() and ClosePool(), while the pool is mapped here and not being
// let go; a pool block freed outside that span is dropped, and OpenPool()
// lists every pool block again except those it is told to keep (the KV
// journal's, and a dead engine's pages kept for their resumes). Take()
// hands out the pool's first, so that the scratch stays free for the
// probes and the first requests after a promotion; within a kind, the
// lowest free ids (a freed block is used again before one never used).
//
// Thread-safety: none; the scheduler thread owns it.
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "engine/kv_memory.h"

namespace wsup::engine {

class BlockAllocator {
 public:
  explicit BlockAllocator(const KvLayout& kv);

  int free_count() const { return static_cast<int>(free_pool_.size() + free_scratch_.size()); }
  int pool_in_use() const { return pool_in_use_; }  // pool blocks held by sequences
  bool pool_open() const { return pool_open_; }     // the pool's blocks are handed out
  bool is_pool(int32_t block) const { return block < pool_blocks_; }

  // Appends `need` free blocks to *blocks. Unavailable, taking nothing,
  // when fewer are free (the caller waits for some to come back).
  Status Take(int need, std::vector<int32_t>* blocks);
  // Gives *blocks back and clears it: each to the list of its kind, a pool
  // block dropped while the pool's are not handed out.
  void Free(std::vector<int32_t>* blocks);
  // Pool blocks a sequence adopted (a dead engine's pages, kept out of the
  // free lists by OpenPool): appended to *blocks and held from now on.
  void Adopt(const std::vector<uint32_t>& pages, std::vector<int32_t>* blocks);
  // A kept pool block that nobody will adopt: free while the pool's are
  // handed out, else dropped.
  void Release(uint32_t block);
  // Hands the pool's blocks out: every one that `kept` (by block id) does
  // not mark. Blocks held by sequences must be marked too.
  void OpenPool(const std::vector<bool>& kept);
  // Hands them out no more; the held ones are dropped as they come back.
  void ClosePool();

 private:
  int pool_blocks_;
  bool pool_open_ = false;
  int pool_in_use_ = 0;
  // Handed out from the back: the lowest ids first.
  std::vector<int32_t> free_scratch_, free_pool_;
};

}  // namespace wsup::engine
