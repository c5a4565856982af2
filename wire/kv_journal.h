// The KV journal: how an active engine says, inside the node's KV pool,
// which sequences' KV the pool holds, so that after its crash the promoted
// engine can adopt those pages for the streams the front resumes instead of
// computing the prompt and the streamed tokens again (docs/kv_journal.md).
//
// The journal is the first journal_blocks() blocks of the pool; the KV
// blocks a sequence may use start after it. It is a header and a fixed
// number of fixed-size entries, one per sequence the engine runs:
//
//   header (64 bytes, little-endian):
//     magic "WSUPKVJ1" | version u32 | entry_bytes u32 | entries u32 |
//     max_pages u32 | block_size u32 | pool_blocks u32 | first_block u32 |
//     pad u32 | block_bytes u64 | header checksum u64 | reserved
//   entry (entry_bytes(max_pages) bytes):
//     seq u64 (odd while being written) | id_len u32 | count u32 |
//     page_count u32 | pad u32 | token_hash u64 | id[48] |
//     pages u32[max_pages] | checksum u64
//
// `count` positions of the sequence have their KV complete in `pages`
// (block ids of the pool, in position order, page_count of them), and
// token_hash is TokenHash() of their token ids (prompt, then generated). The
// writer bumps seq to odd, writes the body, writes the checksum and bumps
// seq to even: a crash mid-write leaves an odd seq or a checksum that does
// not match, and the entry is ignored. An entry with count 0 is free.
//
// The reader (the promoted engine, once the pool is its own: the writer is
// dead) trusts nothing: a header that does not match its own geometry
// drops the whole journal; an entry is used only if its seq is even, its
// checksum matches, its id is printable, its pages lie in the pool's KV
// blocks, it has enough pages for its count, and no other valid entry
// claims any of its pages (then neither is used). Lookup() then adopts an
// entry only for the same request id whose first `count` tokens hash the
// same; anything else is a reason to compute, counted by kind.
//
// Thread-safety: values; a writer and a reader each belong to one thread.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace wsup {

inline constexpr uint32_t kKvJournalVersion = 2;
inline constexpr size_t kKvJournalIdBytes = 48;  // request ids longer than this are not journaled
inline constexpr size_t kKvJournalHeaderBytes = 64;

// FNV-1a (64 bits) over the ids as 4-byte little-endian integers: cheap to
// extend one token at a time, which the writer does after every step.
inline constexpr uint64_t kTokenHashSeed = 0xcbf29ce484222325ull;  // TokenHash of no tokens
uint64_t TokenHash(const int32_t* ids, size_t n, uint64_t seed = kTokenHashSeed);

struct KvJournalGeometry {
  uint64_t block_bytes = 0;  // one KV block, every layer
  uint32_t block_size = 0;   // positions per block
  uint32_t pool_blocks = 0;  // whole blocks in the pool
  uint32_t entries = 0;      // sequences it can describe (the engine's max batch)
  uint32_t max_pages = 0;    // pages per sequence (its longest sequence / block_size, rounded up)
  // What the KV bytes mean: a hash of the model, its sharding and the
  // engine's KV layout. A journal of another kv_format is not read.
  uint64_t kv_format = 0;

  // The geometry a journal's header states (for tools and tests: an
  // engine reads only journals of its own geometry).
  static Result<KvJournalGeometry> FromHeader(const uint8_t* journal, size_t size);

  uint64_t entry_bytes() const;
  uint64_t bytes() const;            // header and entries
  uint32_t journal_blocks() const;   // pool blocks it takes, rounded up
  uint32_t first_block() const { return journal_blocks(); }
  // Refused: zero sizes, or a journal that leaves no KV block in the pool.
  Status Check() const;
};

// Why a resumed sequence was not adopted (docs/kv_journal.md names them).
enum class KvJournalMiss {
  kNoJournal,      // the header did not match (no journal, or another geometry)
  kMissing,        // no valid entry for the request id
  kTorn,           // its entry was being written when the engine died (or is damaged)
  kHashMismatch,   // the tokens it describes are not the resumed request's
  kPastPages,      // its count needs more pages than it lists
  kPageOutOfRange, // a page outside the pool's KV blocks
  kPageClaimedTwice,  // another entry claims one of its pages
  kShorter,           // the resumed request is too short to adopt a whole page of the entry
};
const char* KvJournalMissName(KvJournalMiss m);

class KvJournalWriter {
 public:
  // Over `journal` (geometry.bytes() of it, the start of the pool): writes
  // the header and frees every entry.
  static Result<KvJournalWriter> Create(uint8_t* journal, const KvJournalGeometry& g);

  // Sets the sequence `request_id`'s entry (taking a free one the first
  // time): `count` positions hashing to token_hash are in `pages`, and
  // chain[i] is the hash of the first (i + 1) x block_size of them (as
  // many as there are full pages, or fewer). Refused when the id is too
  // long, there is no free entry, or the pages are more than max_pages:
  // the sequence is then simply not journaled.
  Status Put(std::string_view request_id, uint64_t token_hash, uint32_t count,
             const std::vector<uint32_t>& pages, const std::vector<uint64_t>& chain = {});
  // Frees the sequence's entry (it finished or was cancelled).
  void Remove(std::string_view request_id);
  size_t used() const { return slots_.size(); }
  // Byte range [offset, offset + length) last written (for a writer that
  // keeps the journal in a host copy and copies it to the device).
  std::pair<uint64_t, uint64_t> last_write() const { return last_write_; }

 private:
  KvJournalWriter(uint8_t* journal, const KvJournalGeometry& g) : base_(journal), g_(g) {}
  void WriteEntry(uint32_t slot, std::string_view id, uint64_t token_hash, uint32_t count,
                  const std::vector<uint32_t>& pages, const std::vector<uint64_t>& chain);
  uint8_t* base_;
  KvJournalGeometry g_;
  std::map<std::string, uint32_t, std::less<>> slots_;
  std::vector<uint32_t> free_;
  std::pair<uint64_t, uint64_t> last_write_{0, 0};
};

struct KvJournalEntry {
  std::string request_id;
  uint64_t token_hash = 0;
  uint32_t count = 0;
  std::vector<uint32_t> pages;
  std::vector<uint64_t> chain;  // hashes at the full pages' ends
};

// What a resumed request takes over from an entry.
struct KvJournalAdoption {
  uint32_t count = 0;           // positions whose KV it has; it computes from here on
  std::vector<uint32_t> pages;  // their blocks, in position order (count / block_size, rounded up)
  std::vector<uint32_t> spare;  // the entry's other pages: free again
  bool by_page = false;         // validated at a page boundary (the engine had run ahead of the stream)
};

class KvJournalReader {
 public:
  // Reads and validates a journal (a copy is fine: nothing writes it any
  // more). Never fails: a bad header gives a reader with no entries whose
  // misses say kNoJournal.
  static KvJournalReader Read(const uint8_t* journal, size_t size, const KvJournalGeometry& g);

  bool header_ok() const { return header_ok_; }
  // Valid entries, by request id.
  const std::map<std::string, KvJournalEntry, std::less<>>& entries() const { return entries_; }
  // Entries dropped while reading, by reason.
  const std::map<KvJournalMiss, int>& dropped() const { return dropped_; }

  // What a resumed request with these token ids (prompt, then the tokens
  // already streamed) adopts, or why nothing. It adopts at most
  // tokens.size() - 1 positions (the last token is computed again: its
  // logits give the next token): all of the entry's count when the tokens
  // cover it and hash the same, else (the engine had generated tokens the
  // stream never got) the longest whole-page prefix whose chain hash
  // matches. An entry is taken at most once, adopted or not: the pages of
  // one refused (another hash, too short) are appended to `freed`.
  Result<KvJournalAdoption> Take(std::string_view request_id, const std::vector<int32_t>& tokens,
                                 KvJournalMiss* why, std::vector<uint32_t>* freed = nullptr);
  // Pages of valid entries not taken yet (the pool keeps them out of use).
  size_t pages_held() const;
  // Pages of valid entries nobody took (to free back to the pool after the
  // bound), and forgets those entries.
  std::vector<uint32_t> Release();

 private:
  bool header_ok_ = false;
  uint32_t block_size_ = 0;
  std::map<std::string, KvJournalEntry, std::less<>> entries_;
  std::map<std::string, KvJournalMiss, std::less<>> invalid_;  // ids of entries dropped, and why
  std::map<KvJournalMiss, int> dropped_;
};

}  // namespace wsup
