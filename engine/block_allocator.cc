#include "engine/block_allocator.h"

#include <algorithm>
#include <string>

namespace wsup::engine {

BlockAllocator::BlockAllocator(const KvLayout& kv) : pool_blocks_(kv.pool_blocks) {
  for (int b = kv.scratch_first + kv.scratch_blocks - 1; b >= kv.scratch_first; --b) free_scratch_.push_back(b);
}

Status BlockAllocator::Take(int need, std::vector<int32_t>* blocks) {
  if (need > free_count()) {
    return Unavailable("the KV cache has " + std::to_string(free_count()) + " free blocks (" +
                       std::to_string(free_pool_.size()) + " of the pool, " + std::to_string(free_scratch_.size()) +
                       " of the scratch) and a sequence needs " + std::to_string(need) +
                       "; it waits until running sequences end and free theirs");
  }
  const int from_pool = std::min<int>(need, static_cast<int>(free_pool_.size()));
  blocks->insert(blocks->end(), free_pool_.end() - from_pool, free_pool_.end());
  free_pool_.resize(free_pool_.size() - static_cast<size_t>(from_pool));
  pool_in_use_ += from_pool;
  const int rest = need - from_pool;
  blocks->insert(blocks->end(), free_scratch_.end() - rest, free_scratch_.end());
  free_scratch_.resize(free_scratch_.size() - static_cast<size_t>(rest));
  return Status::Ok();
}

void BlockAllocator::Free(std::vector<int32_t>* blocks) {
  for (int32_t b : *blocks) {
    if (is_pool(b)) {
      --pool_in_use_;
      if (pool_open_) free_pool_.push_back(b);
    } else {
      free_scratch_.push_back(b);
    }
  }
  blocks->clear();
}

void BlockAllocator::Adopt(const std::vector<uint32_t>& pages, std::vector<int32_t>* blocks) {
  blocks->insert(blocks->end(), pages.begin(), pages.end());
  pool_in_use_ += static_cast<int>(pages.size());
}

void BlockAllocator::Release(uint32_t block) {
  if (pool_open_) free_pool_.push_back(static_cast<int32_t>(block));
}

void BlockAllocator::OpenPool(const std::vector<bool>& kept) {
  pool_open_ = true;
  free_pool_.clear();
  for (int b = pool_blocks_ - 1; b >= 0; --b) {
    const auto i = static_cast<size_t>(b);
    if (i >= kept.size() || !kept[i]) free_pool_.push_back(b);
  }
}

void BlockAllocator::ClosePool() {
  pool_open_ = false;
  free_pool_.clear();
}

}  // namespace wsup::engine
