#include "wire/kv_journal.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "common/enum_names.h"

namespace wsup {

namespace {

constexpr char kMagic[8] = {'W', 'S', 'U', 'P', 'K', 'V', 'J', '1'};
// Entry fields, from the entry's start (docs/kv_journal.md).
constexpr uint64_t kSeq = 0, kChecksum = 8, kIdLen = 16, kCount = 20, kPageCount = 24, kChainCount = 28,
                   kTokenHash = 32, kId = 40, kRecords = 96, kRecordBytes = 16;
static_assert(kId + kKvJournalIdBytes + 8 == kRecords);
// Header fields.
constexpr uint64_t kHeaderChecksum = 56;

uint64_t Fnv(const uint8_t* p, size_t n, uint64_t h = 0xcbf29ce484222325ull) {
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

template <typename T>
T Get(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}
template <typename T>
void Set(uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}

uint64_t Rotl(uint64_t v, int r) { return (v << r) | (v >> (64 - r)); }

// The entries' checksum: eight bytes at a time (an entry of a long
// sequence is tens of kilobytes, rewritten after every step), then
// splitmix64's finalizer. It detects torn and damaged bytes; it is not a
// defence against a writer that lies. `n` is a multiple of 8.
uint64_t WordSum(const uint8_t* p, size_t n, uint64_t h) {
  for (size_t i = 0; i + 8 <= n; i += 8) {
    h = Rotl(h ^ (Get<uint64_t>(p + i) * 0x9e3779b97f4a7c15ull), 31) * 0xbf58476d1ce4e5b9ull;
  }
  h ^= h >> 30;
  h *= 0xbf58476d1ce4e5b9ull;
  h ^= h >> 27;
  h *= 0x94d049bb133111ebull;
  return h ^ (h >> 31);
}

// An entry's checksum with seq `seq`, over its bytes 16 .. the end of its
// page_count records (page_count at most max_pages: the caller checked).
uint64_t EntrySum(const uint8_t* e, uint64_t seq, uint32_t page_count) {
  return WordSum(e + kIdLen, kRecords - kIdLen + kRecordBytes * page_count, seq * 0xd6e8feb86659fd93ull);
}

bool Printable(std::string_view s) {
  for (char c : s) {
    if (c < 0x21 || c > 0x7e) return false;
  }
  return !s.empty();
}

void WriteHeader(uint8_t* h, const KvJournalGeometry& g) {
  std::memset(h, 0, kKvJournalHeaderBytes);
  std::memcpy(h, kMagic, 8);
  Set<uint32_t>(h + 8, kKvJournalVersion);
  Set<uint32_t>(h + 12, static_cast<uint32_t>(g.entry_bytes()));
  Set<uint32_t>(h + 16, g.entries);
  Set<uint32_t>(h + 20, g.max_pages);
  Set<uint32_t>(h + 24, g.block_size);
  Set<uint32_t>(h + 28, g.pool_blocks);
  Set<uint32_t>(h + 32, g.first_block());
  Set<uint64_t>(h + 40, g.block_bytes);
  Set<uint64_t>(h + 48, g.kv_format);
  Set<uint64_t>(h + kHeaderChecksum, Fnv(h, kHeaderChecksum));
}

}  // namespace

uint64_t TokenHash(const int32_t* ids, size_t n, uint64_t seed) {
  uint64_t h = seed;
  for (size_t i = 0; i < n; ++i) {
    uint8_t b[4];
    const uint32_t v = static_cast<uint32_t>(ids[i]);
    for (int k = 0; k < 4; ++k) b[k] = static_cast<uint8_t>(v >> (8 * k));
    h = Fnv(b, 4, h);
  }
  return h;
}

uint64_t KvJournalGeometry::entry_bytes() const { return kRecords + kRecordBytes * max_pages; }

Result<KvJournalGeometry> KvJournalGeometry::FromHeader(const uint8_t* journal, size_t size) {
  if (size < kKvJournalHeaderBytes || std::memcmp(journal, kMagic, 8) != 0) {
    return InvalidArgument("kv journal: no journal here (the magic WSUPKVJ1 is missing)");
  }
  if (Get<uint64_t>(journal + kHeaderChecksum) != Fnv(journal, kHeaderChecksum)) {
    return InvalidArgument("kv journal: the header's checksum does not match (a damaged header)");
  }
  if (Get<uint32_t>(journal + 8) != kKvJournalVersion) {
    return InvalidArgument("kv journal: version " + std::to_string(Get<uint32_t>(journal + 8)) +
                           ", this build reads " + std::to_string(kKvJournalVersion));
  }
  KvJournalGeometry g;
  g.entries = Get<uint32_t>(journal + 16);
  g.max_pages = Get<uint32_t>(journal + 20);
  g.block_size = Get<uint32_t>(journal + 24);
  g.pool_blocks = Get<uint32_t>(journal + 28);
  g.block_bytes = Get<uint64_t>(journal + 40);
  g.kv_format = Get<uint64_t>(journal + 48);
  WSUP_RETURN_IF_ERROR(g.Check());
  if (Get<uint32_t>(journal + 12) != g.entry_bytes() || Get<uint32_t>(journal + 32) != g.first_block()) {
    return InvalidArgument(
        "kv journal: the header's entry size or first block does not follow from its geometry");
  }
  return g;
}

uint64_t KvJournalGeometry::bytes() const { return kKvJournalHeaderBytes + entry_bytes() * entries; }

uint32_t KvJournalGeometry::journal_blocks() const {
  if (block_bytes == 0) return 0;
  return static_cast<uint32_t>((bytes() + block_bytes - 1) / block_bytes);
}

Status KvJournalGeometry::Check() const {
  if (block_bytes == 0 || block_size == 0 || entries == 0 || max_pages == 0) {
    return InvalidArgument("kv journal: block_bytes, block_size, entries and max_pages must all be above 0");
  }
  if (journal_blocks() >= pool_blocks) {
    return InvalidArgument("kv journal: a journal of " + std::to_string(entries) + " entries takes " +
                           std::to_string(journal_blocks()) + " blocks of a pool of " + std::to_string(pool_blocks) +
                           "; make the pool larger (kv.pool_mib) or journal fewer sequences");
  }
  return Status::Ok();
}

const char* KvJournalMissName(KvJournalMiss m) {
  static constexpr EnumNames<KvJournalMiss::kShorter> kNames{
      "no_journal",         "missing",           "torn",
      "hash_mismatch",      "count_past_pages",  "page_out_of_range",
      "page_claimed_twice", "shorter_than_entry"};
  return kNames(m);
}

// ---- writer ----

Result<KvJournalWriter> KvJournalWriter::Create(uint8_t* journal, const KvJournalGeometry& g) {
  WSUP_RETURN_IF_ERROR(g.Check());
  KvJournalWriter w(journal, g);
  std::memset(journal, 0, g.bytes());
  for (uint32_t slot = 0; slot < g.entries; ++slot) {
    w.WriteEntry(slot, {}, 0, 0, {}, {});
    w.free_.push_back(g.entries - 1 - slot);  // taken from the back: slot 0 first
  }
  // The header last: a journal is valid only once every entry is.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  WriteHeader(journal, g);
  w.last_write_ = {0, g.bytes()};
  return w;
}

void KvJournalWriter::WriteEntry(uint32_t slot, std::string_view id, uint64_t token_hash, uint32_t count,
                                 const std::vector<uint32_t>& pages, const std::vector<uint64_t>& chain) {
  uint8_t* e = base_ + kKvJournalHeaderBytes + g_.entry_bytes() * slot;
  const uint64_t seq = Get<uint64_t>(e + kSeq) | 1;  // odd: being written
  Set<uint64_t>(e + kSeq, seq);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  const uint32_t page_count = static_cast<uint32_t>(pages.size());
  const uint32_t chain_count = static_cast<uint32_t>(std::min(chain.size(), pages.size()));
  Set<uint32_t>(e + kIdLen, static_cast<uint32_t>(id.size()));
  Set<uint32_t>(e + kCount, count);
  Set<uint32_t>(e + kPageCount, page_count);
  Set<uint32_t>(e + kChainCount, chain_count);
  Set<uint64_t>(e + kTokenHash, token_hash);
  std::memset(e + kId, 0, kKvJournalIdBytes + 8);
  if (!id.empty()) std::memcpy(e + kId, id.data(), id.size());  // a free entry's id may be a null view
  // Only the records in use are written: the reader never looks past
  // page_count, and a long sequence's entry is rewritten every step.
  for (uint32_t i = 0; i < page_count; ++i) {
    uint8_t* r = e + kRecords + kRecordBytes * i;
    Set<uint32_t>(r, pages[i]);
    Set<uint32_t>(r + 4, 0);
    Set<uint64_t>(r + 8, i < chain_count ? chain[i] : 0);
  }
  // The checksum covers the seq the entry will have once whole.
  const uint64_t done = seq + 1;
  Set<uint64_t>(e + kChecksum, EntrySum(e, done, page_count));
  std::atomic_thread_fence(std::memory_order_seq_cst);
  Set<uint64_t>(e + kSeq, done);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  last_write_ = {kKvJournalHeaderBytes + g_.entry_bytes() * slot, kRecords + kRecordBytes * page_count};
}

Status KvJournalWriter::Put(std::string_view request_id, uint64_t token_hash, uint32_t count,
                            const std::vector<uint32_t>& pages, const std::vector<uint64_t>& chain) {
  if (request_id.empty() || request_id.size() > kKvJournalIdBytes || !Printable(request_id)) {
    return InvalidArgument("kv journal: request id '" + std::string(request_id.substr(0, 64)) +
                           "' is empty, longer than " + std::to_string(kKvJournalIdBytes) +
                           " bytes or not printable; this sequence is not journaled");
  }
  if (pages.size() > g_.max_pages) {
    return InvalidArgument("kv journal: " + std::to_string(pages.size()) + " pages, more than the " +
                           std::to_string(g_.max_pages) + " an entry holds");
  }
  auto it = slots_.find(request_id);
  if (it == slots_.end()) {
    if (free_.empty()) {
      return Unavailable("kv journal: all " + std::to_string(g_.entries) + " entries are in use");
    }
    it = slots_.emplace(std::string(request_id), free_.back()).first;
    free_.pop_back();
  }
  WriteEntry(it->second, request_id, token_hash, count, pages, chain);
  return Status::Ok();
}

void KvJournalWriter::Remove(std::string_view request_id) {
  auto it = slots_.find(request_id);
  if (it == slots_.end()) return;
  WriteEntry(it->second, {}, 0, 0, {}, {});
  free_.push_back(it->second);
  slots_.erase(it);
}

// ---- reader ----

KvJournalReader KvJournalReader::Read(const uint8_t* journal, size_t size, const KvJournalGeometry& g) {
  KvJournalReader r;
  if (!g.Check().ok() || size < g.bytes()) return r;
  uint8_t want[kKvJournalHeaderBytes];
  WriteHeader(want, g);
  if (std::memcmp(want, journal, kKvJournalHeaderBytes) != 0) return r;
  r.header_ok_ = true;
  r.block_size_ = g.block_size;
  const uint32_t first = g.first_block();
  std::map<uint32_t, std::vector<std::string>> claims;
  auto drop = [&r](const std::string& id, KvJournalMiss why) {
    ++r.dropped_[why];
    if (!id.empty()) r.invalid_[id] = why;
  };
  for (uint32_t slot = 0; slot < g.entries; ++slot) {
    const uint8_t* e = journal + kKvJournalHeaderBytes + g.entry_bytes() * slot;
    const uint64_t seq = Get<uint64_t>(e + kSeq);
    const uint32_t id_len = Get<uint32_t>(e + kIdLen);
    const uint32_t page_count = Get<uint32_t>(e + kPageCount);
    std::string id;
    if (id_len <= kKvJournalIdBytes) id.assign(reinterpret_cast<const char*>(e + kId), id_len);
    if (!Printable(id)) id.clear();
    // A page_count past the entry is damage (the checksum's range cannot
    // even be known).
    const bool whole = (seq & 1) == 0 && page_count <= g.max_pages &&
                       Get<uint64_t>(e + kChecksum) == EntrySum(e, seq, page_count);
    if (!whole) {
      drop(id, KvJournalMiss::kTorn);
      continue;
    }
    KvJournalEntry entry;
    entry.count = Get<uint32_t>(e + kCount);
    if (entry.count == 0) continue;  // free
    if (id.empty()) {
      drop(id, KvJournalMiss::kTorn);
      continue;
    }
    entry.request_id = id;
    entry.token_hash = Get<uint64_t>(e + kTokenHash);
    const uint32_t chain_count = Get<uint32_t>(e + kChainCount);
    if (uint64_t{page_count} * g.block_size < entry.count || chain_count > page_count ||
        uint64_t{chain_count} * g.block_size > entry.count) {
      drop(id, KvJournalMiss::kPastPages);
      continue;
    }
    entry.pages.resize(page_count);
    entry.chain.resize(chain_count);
    for (uint32_t i = 0; i < page_count; ++i) {
      const uint8_t* rec = e + kRecords + kRecordBytes * i;
      entry.pages[i] = Get<uint32_t>(rec);
      if (i < chain_count) entry.chain[i] = Get<uint64_t>(rec + 8);
    }
    bool in_range = true;
    for (uint32_t p : entry.pages) in_range = in_range && p >= first && p < g.pool_blocks;
    if (!in_range) {
      drop(id, KvJournalMiss::kPageOutOfRange);
      continue;
    }
    if (r.entries_.count(id)) {  // two entries for one id: neither can be trusted
      drop(id, KvJournalMiss::kTorn);
      r.entries_.erase(id);
      continue;
    }
    if (r.invalid_.count(id)) continue;
    for (uint32_t p : entry.pages) claims[p].push_back(id);
    r.entries_.emplace(id, std::move(entry));
  }
  for (const auto& [page, ids] : claims) {
    if (ids.size() < 2) continue;
    for (const auto& id : ids) {
      if (r.entries_.erase(id) > 0) drop(id, KvJournalMiss::kPageClaimedTwice);
    }
  }
  return r;
}

Result<KvJournalAdoption> KvJournalReader::Take(std::string_view request_id,
                                                const std::vector<int32_t>& tokens, KvJournalMiss* why,
                                                std::vector<uint32_t>* freed) {
  auto miss = [&](KvJournalMiss m) -> Result<KvJournalAdoption> {
    if (why) *why = m;
    return NotFound(std::string("kv journal: ") + KvJournalMissName(m));
  };
  if (!header_ok_) return miss(KvJournalMiss::kNoJournal);
  if (auto bad = invalid_.find(request_id); bad != invalid_.end()) return miss(bad->second);
  auto it = entries_.find(request_id);
  if (it == entries_.end()) return miss(KvJournalMiss::kMissing);
  KvJournalEntry e = std::move(it->second);
  entries_.erase(it);
  auto refuse = [&](KvJournalMiss m) {
    if (freed) freed->insert(freed->end(), e.pages.begin(), e.pages.end());
    return miss(m);
  };
  // At most all tokens but the last: its logits are the next token's.
  const size_t limit = tokens.empty() ? 0 : tokens.size() - 1;
  KvJournalAdoption a;
  if (e.count <= tokens.size()) {
    if (TokenHash(tokens.data(), e.count) != e.token_hash) return refuse(KvJournalMiss::kHashMismatch);
    a.count = static_cast<uint32_t>(std::min<size_t>(e.count, limit));
  } else {
    // The engine had gone further than the stream: whole pages, checked by
    // the chain hash of the longest prefix the tokens cover.
    const size_t k = std::min<size_t>(e.chain.size(), limit / block_size_);
    if (k > 0) {
      if (TokenHash(tokens.data(), k * block_size_) != e.chain[k - 1])
        return refuse(KvJournalMiss::kHashMismatch);
      a.count = static_cast<uint32_t>(k * block_size_);
      a.by_page = true;
    }
  }
  if (a.count == 0) return refuse(KvJournalMiss::kShorter);
  const size_t used = (a.count + block_size_ - 1) / block_size_;
  a.pages.assign(e.pages.begin(), e.pages.begin() + static_cast<std::ptrdiff_t>(used));
  a.spare.assign(e.pages.begin() + static_cast<std::ptrdiff_t>(used), e.pages.end());
  return a;
}

size_t KvJournalReader::pages_held() const {
  size_t n = 0;
  for (const auto& [id, e] : entries_) n += e.pages.size();
  return n;
}

std::vector<uint32_t> KvJournalReader::Release() {
  std::vector<uint32_t> pages;
  for (auto& [id, e] : entries_) pages.insert(pages.end(), e.pages.begin(), e.pages.end());
  entries_.clear();
  return pages;
}

}  // namespace wsup
