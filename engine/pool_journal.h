// PoolJournal: the engine's side of the KV journal in the node's KV pool
// (the format is wire/kv_journal.h, the design docs/kv_journal.md).
//
// Writing: this engine's journal lives in a host copy; the scheduler
// describes its sequences after each step (Describe, Remove) and Flush()
// copies the changed bytes to the pool, once a step. A write that fails
// drops the journal for this pool.
//
// Adoption: when the pool opens here, Open() first reads the journal the
// engine before this one left. Its sequences' pages are kept out of use
// (Kept()) until a resumed request adopts them (Adopt), a request that is
// here needs the blocks, or keep_ms has passed on the clock (Release);
// then a fresh journal is written.
//
// The journal takes the pool's first blocks() blocks, fixed by the
// cache's layout (0 without a pool, or with one too small for a journal);
// they are never handed out.
//
// Thread-safety: none; the scheduler thread owns it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/clock.h"
#include "engine/kv_memory.h"
#include "wire/kv_journal.h"

namespace wsup::engine {

// The journal's geometry for an engine: its cache's layout, its context
// (max_pos), its batch and what its KV bytes mean. Entries 0 without a pool.
KvJournalGeometry PoolJournalGeometry(const KvLayout& kv, int64_t max_pos, int max_batch, uint64_t kv_format);

// A sequence's tokens as the journal hashes them: TokenHash of the first
// `hashed` positions (prompt, then generated), and the hash at each full
// block's end (the entry's chain).
struct JournalHash {
  uint64_t hash = kTokenHashSeed;
  size_t hashed = 0;
  std::vector<uint64_t> chain;
};

// Reads or writes bytes of the pool at an offset (the runner's ReadKvPool
// and WriteKvPool in the engine; a buffer in tests).
struct PoolBytes {
  std::function<Status(uint64_t offset, void* out, size_t n)> read;
  std::function<Status(uint64_t offset, const void* in, size_t n)> write;
};

// What Adopt() gives a resumed request.
struct PoolAdoption {
  bool adopted = false;
  std::vector<uint32_t> pages;     // adopted: its blocks, in position order
  uint32_t count = 0;              // adopted: positions whose KV it has
  std::vector<uint32_t> released;  // pool blocks nobody keeps any more (free them)
};

class PoolJournal {
 public:
  // geometry: PoolJournalGeometry(); keep_ms: how long the previous
  // engine's pages wait for their resumes (0: not at all). The clock
  // outlives the journal.
  PoolJournal(const KvJournalGeometry& geometry, PoolBytes io, const EngineClock& clock, int64_t keep_ms);

  int blocks() const { return blocks_; }
  bool on() const { return writer_.has_value(); }
  int entries() const { return writer_ ? static_cast<int>(writer_->used()) : 0; }
  int found() const { return found_; }
  uint64_t writes() const { return writes_; }
  uint64_t errors() const { return errors_; }

  // The pool was opened here: reads the previous engine's journal (its
  // pages are kept from now), then writes a fresh one. A pool whose
  // journal cannot be written is used without one.
  void Open();
  // The pool goes: the last changes are written, and the journal is off.
  void Close();

  // Describes a sequence after a step: its tokens are the prompt, then
  // generated; `prefilled` of the prompt's are in the cache, in `blocks`.
  // The positions whose KV is complete are described if their blocks are
  // all the pool's (KV on the scratch is nothing another engine could
  // adopt); *hash is extended over them. No-op without a journal or a
  // request id.
  void Describe(const std::string& request_id, const std::vector<int32_t>& prompt,
                const std::vector<int32_t>& generated, size_t prefilled, const std::vector<int32_t>& blocks,
                JournalHash* hash);
  // Frees a described sequence's entry (it ended, or was cancelled).
  void Remove(const std::string& request_id, const JournalHash& hash);
  // Copies the bytes changed since the last flush to the pool.
  void Flush();
  // Extends *hash over the tokens up to position `upto`.
  void HashTokens(const std::vector<int32_t>& prompt, const std::vector<int32_t>& generated, size_t upto,
                  JournalHash* hash) const;

  // A resumed request, at its admission: the previous engine's KV for it,
  // or why not (counted in recomputed_reasons). pooled: the engine has a
  // pool; pool_open: it is open here.
  PoolAdoption Adopt(bool pooled, bool pool_open, const std::string& request_id,
                     const std::vector<int32_t>& prompt);
  // The previous engine's pages still kept, and until when.
  bool keeping() const { return previous_ && !previous_->entries().empty(); }
  int64_t keep_until_ms() const { return keep_until_ms_; }
  int pages_kept() const { return previous_ ? static_cast<int>(previous_->pages_held()) : 0; }
  // Lets the kept pages go (logged with why): they are returned, to free.
  std::vector<uint32_t> Release(const char* why);
  // Forgets the previous journal (the pool is being let go).
  void DropPrevious() { previous_.reset(); }
  // Pool blocks kept from use, by block id: the journal's, and the kept pages.
  std::vector<bool> Kept(int pool_blocks) const;

  // Adoption counters (SchedulerStats).
  uint64_t adopted_sequences() const { return adopted_sequences_; }
  uint64_t adopted_tokens() const { return adopted_tokens_; }
  uint64_t adopted_by_page() const { return adopted_by_page_; }
  uint64_t recomputed() const { return recomputed_; }
  const std::map<std::string, uint64_t>& recomputed_reasons() const { return recomputed_reasons_; }
  uint64_t released_blocks() const { return released_blocks_; }

 private:
  void MarkDirty();
  void Recompute(const std::string& request_id, size_t tokens, const char* reason);

  KvJournalGeometry geometry_;
  PoolBytes io_;
  const EngineClock& clock_;
  int64_t keep_ms_;
  int blocks_ = 0;
  std::optional<KvJournalWriter> writer_;
  std::vector<uint8_t> host_;  // the journal's bytes; the changed range is copied to the pool
  uint64_t dirty_lo_ = UINT64_MAX, dirty_hi_ = 0;
  int found_ = 0;
  uint64_t writes_ = 0, errors_ = 0;
  std::optional<KvJournalReader> previous_;  // since the pool opened
  int64_t keep_until_ms_ = 0;
  uint64_t adopted_sequences_ = 0, adopted_tokens_ = 0, adopted_by_page_ = 0, recomputed_ = 0;
  std::map<std::string, uint64_t> recomputed_reasons_;
  uint64_t released_blocks_ = 0;
};

}  // namespace wsup::engine
