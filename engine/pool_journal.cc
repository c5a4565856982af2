#include "engine/pool_journal.h"

#include <spdlog/spdlog.h>

#include <algorithm>

namespace wsup::engine {

KvJournalGeometry PoolJournalGeometry(const KvLayout& kv, int64_t max_pos, int max_batch, uint64_t kv_format) {
  KvJournalGeometry g;
  if (!kv.pooled()) return g;
  g.block_bytes = kv.block_bytes;
  g.block_size = static_cast<uint32_t>(kv.block_size);
  g.pool_blocks = static_cast<uint32_t>(kv.pool_blocks);
  g.entries = static_cast<uint32_t>(std::max(1, max_batch));
  g.kv_format = kv_format;
  // The longest sequence's blocks, counting the journal's as usable (an
  // upper bound: the journal cannot depend on its own size).
  const int64_t longest =
      std::min<int64_t>(max_pos, (static_cast<int64_t>(kv.pool_blocks) + kv.scratch_blocks) * kv.block_size);
  g.max_pages = static_cast<uint32_t>((longest + kv.block_size - 1) / kv.block_size);
  return g;
}

PoolJournal::PoolJournal(const KvJournalGeometry& geometry, PoolBytes io, const EngineClock& clock, int64_t keep_ms)
    : geometry_(geometry), io_(std::move(io)), clock_(clock), keep_ms_(keep_ms) {
  // The cache's layout is fixed before the journal exists: so is its size.
  blocks_ = geometry_.Check().ok() ? static_cast<int>(geometry_.journal_blocks()) : 0;
}

void PoolJournal::Open() {
  writer_.reset();
  dirty_lo_ = UINT64_MAX;
  dirty_hi_ = 0;
  if (!geometry_.Check().ok()) return;  // a pool too small for one: no journal, nothing held back
  host_.assign(geometry_.bytes(), 0);
  // What the engine before this one left (a crash leaves its sequences):
  // their pages are kept for the resumed requests until keep_ms.
  previous_.reset();
  Status read = io_.read(0, host_.data(), host_.size());
  if (read.ok()) {
    previous_.emplace(KvJournalReader::Read(host_.data(), host_.size(), geometry_));
    keep_until_ms_ = clock_.NowMs() + keep_ms_;
    found_ = static_cast<int>(previous_->entries().size());
    std::string dropped;
    for (const auto& [why, n] : previous_->dropped()) {
      dropped += std::string(dropped.empty() ? "" : ", ") + std::to_string(n) + " " + KvJournalMissName(why);
    }
    if (found_ > 0 || !dropped.empty()) {
      spdlog::info(
          "KV journal: the previous engine left {} sequences in the pool ({} pages kept for their resumes "
          "for {} ms){}{}",
          found_, previous_->pages_held(), keep_ms_, dropped.empty() ? "" : "; refused: ", dropped);
    }
    // Nothing is handed out yet: the caller lists the free blocks after
    // this, from Kept(), so released pages need no freeing here.
    if (keep_ms_ <= 0) Release("keeping is off");
  } else {
    spdlog::warn("KV journal: cannot read the previous engine's ({}); resumed streams are computed in full",
                 read.ToString());
  }
  auto w = KvJournalWriter::Create(host_.data(), geometry_);
  Status st = w.ok() ? io_.write(0, host_.data(), host_.size()) : w.status();
  ++writes_;
  if (!st.ok()) {
    ++errors_;
    spdlog::warn("KV journal: cannot write it in the pool ({}); sequences are not journaled", st.ToString());
    return;
  }
  writer_.emplace(std::move(*w));
}

void PoolJournal::Close() {
  Flush();
  writer_.reset();
}

void PoolJournal::MarkDirty() {
  const auto [off, len] = writer_->last_write();
  dirty_lo_ = std::min(dirty_lo_, off);
  dirty_hi_ = std::max(dirty_hi_, off + len);
}

void PoolJournal::HashTokens(const std::vector<int32_t>& prompt, const std::vector<int32_t>& generated, size_t upto,
                             JournalHash* hash) const {
  const size_t plen = prompt.size();
  const size_t bs = geometry_.block_size;
  for (size_t i = hash->hashed; i < upto; ++i) {
    const int32_t t = i < plen ? prompt[i] : generated[i - plen];
    hash->hash = TokenHash(&t, 1, hash->hash);
    if (bs > 0 && (i + 1) % bs == 0) hash->chain.push_back(hash->hash);
  }
  hash->hashed = std::max(hash->hashed, upto);
}

void PoolJournal::Describe(const std::string& request_id, const std::vector<int32_t>& prompt,
                           const std::vector<int32_t>& generated, size_t prefilled,
                           const std::vector<int32_t>& blocks, JournalHash* hash) {
  if (!writer_ || request_id.empty()) return;
  const size_t plen = prompt.size();
  // Positions whose KV is complete: the prompt's cached part, then every
  // generated token but the newest (the next step computes its KV).
  const size_t kv = prefilled < plen ? prefilled : plen + (generated.empty() ? 0 : generated.size() - 1);
  if (kv == 0 || kv == hash->hashed) return;
  const size_t bs = geometry_.block_size;
  const size_t pages = (kv + bs - 1) / bs;
  if (pages > blocks.size()) return;
  std::vector<uint32_t> ids(pages);
  for (size_t i = 0; i < pages; ++i) {
    if (blocks[i] < 0 || static_cast<uint32_t>(blocks[i]) >= geometry_.pool_blocks) return;  // on the scratch
    ids[i] = static_cast<uint32_t>(blocks[i]);
  }
  HashTokens(prompt, generated, kv, hash);
  if (!writer_->Put(request_id, hash->hash, static_cast<uint32_t>(kv), ids, hash->chain).ok()) return;
  MarkDirty();
}

void PoolJournal::Remove(const std::string& request_id, const JournalHash& hash) {
  if (!writer_ || request_id.empty() || hash.hashed == 0) return;
  writer_->Remove(request_id);
  MarkDirty();
}

void PoolJournal::Flush() {
  if (!writer_ || dirty_hi_ <= dirty_lo_) return;
  Status st = io_.write(dirty_lo_, host_.data() + dirty_lo_, dirty_hi_ - dirty_lo_);
  ++writes_;
  dirty_lo_ = UINT64_MAX;
  dirty_hi_ = 0;
  if (!st.ok()) {
    ++errors_;
    spdlog::warn("KV journal: writing it in the pool failed ({}); it is dropped for this pool", st.ToString());
    writer_.reset();
  }
}

void PoolJournal::Recompute(const std::string& request_id, size_t tokens, const char* reason) {
  ++recomputed_;
  ++recomputed_reasons_[reason];
  spdlog::info("request {}: resumed, computing its {} tokens again ({})", request_id, tokens, reason);
}

PoolAdoption PoolJournal::Adopt(bool pooled, bool pool_open, const std::string& request_id,
                                const std::vector<int32_t>& prompt) {
  PoolAdoption out;
  if (!pooled) {
    Recompute(request_id, prompt.size(), "private_kv_cache");
  } else if (!pool_open) {
    Recompute(request_id, prompt.size(), "pool_not_granted");
  } else if (request_id.empty()) {
    Recompute(request_id, prompt.size(), "no_request_id");
  } else if (!previous_) {
    Recompute(request_id, prompt.size(), KvJournalMissName(KvJournalMiss::kNoJournal));
  } else {
    KvJournalMiss why = KvJournalMiss::kMissing;
    auto a = previous_->Take(request_id, prompt, &why, &out.released);
    if (!a.ok()) {
      Recompute(request_id, prompt.size(), KvJournalMissName(why));
      return out;
    }
    out.released.insert(out.released.end(), a->spare.begin(), a->spare.end());
    out.adopted = true;
    out.pages = std::move(a->pages);
    out.count = a->count;
    ++adopted_sequences_;
    adopted_tokens_ += a->count;
    if (a->by_page) ++adopted_by_page_;
    spdlog::debug("request {}: adopted {} of {} positions from the previous engine's KV ({} pages)", request_id,
                  a->count, prompt.size(), out.pages.size());
  }
  return out;
}

std::vector<uint32_t> PoolJournal::Release(const char* why) {
  if (!previous_) return {};
  std::vector<uint32_t> pages = previous_->Release();
  if (pages.empty()) return pages;
  released_blocks_ += pages.size();
  spdlog::info("KV journal: {} pages of sequences nobody resumed are free again ({})", pages.size(), why);
  return pages;
}

std::vector<bool> PoolJournal::Kept(int pool_blocks) const {
  std::vector<bool> kept(static_cast<size_t>(pool_blocks), false);
  for (int b = 0; b < std::min(blocks_, pool_blocks); ++b) kept[static_cast<size_t>(b)] = true;
  if (previous_) {
    for (const auto& [id, e] : previous_->entries()) {
      for (uint32_t b : e.pages) kept[b] = true;  // the reader checked they lie in the pool
    }
  }
  return kept;
}

}  // namespace wsup::engine
