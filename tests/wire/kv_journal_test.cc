// The KV journal (wire/kv_journal.h): what a writer leaves is read back
// exactly; a damaged, torn or contradictory journal is never adopted, and
// every refusal names its reason. One case kills a real writer process
// mid-write on shared memory, as a crash of the engine would.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <cstring>
#include <numeric>
#include <vector>

#include "wire/kv_journal.h"

namespace wsup {
namespace {

KvJournalGeometry Geo() {
  return {.block_bytes = 4096,
          .block_size = 16,
          .pool_blocks = 256,
          .entries = 8,
          .max_pages = 40,
          .kv_format = 0x5eed};
}

std::vector<int32_t> Tokens(int n, int salt = 0) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[static_cast<size_t>(i)] = (i * 7919 + salt) % 32000;
  return t;
}

std::vector<uint32_t> Pages(uint32_t first, uint32_t n) {
  std::vector<uint32_t> p(n);
  std::iota(p.begin(), p.end(), first);
  return p;
}

// The byte offset of entry `slot`'s field at `field` (the layout of kv_journal.h).
size_t At(const KvJournalGeometry& g, uint32_t slot, size_t field) {
  return kKvJournalHeaderBytes + g.entry_bytes() * slot + field;
}

TEST_CASE("kv journal: geometry and refusals", "[wire][kv_journal]") {
  KvJournalGeometry g = Geo();
  REQUIRE(g.Check().ok());
  CHECK(g.entry_bytes() % 8 == 0);
  CHECK(g.entry_bytes() == 96 + 16 * g.max_pages);  // docs/kv_journal.md
  CHECK(g.journal_blocks() == (g.bytes() + g.block_bytes - 1) / g.block_bytes);
  CHECK(g.first_block() == g.journal_blocks());
  KvJournalGeometry tiny = g;
  tiny.pool_blocks = g.journal_blocks();
  Status st = tiny.Check();
  REQUIRE_FALSE(st.ok());
  CHECK(st.error().message().find("kv.pool_mib") != std::string::npos);
  KvJournalGeometry zero = g;
  zero.entries = 0;
  CHECK_FALSE(zero.Check().ok());
  // A header says its geometry; a damaged or foreign one is refused by name.
  std::vector<uint8_t> mem(g.bytes());
  REQUIRE(KvJournalWriter::Create(mem.data(), g).ok());
  auto back = KvJournalGeometry::FromHeader(mem.data(), mem.size());
  REQUIRE(back.ok());
  CHECK(back->kv_format == g.kv_format);
  CHECK(back->entries == g.entries);
  CHECK(back->max_pages == g.max_pages);
  CHECK(back->bytes() == g.bytes());
  mem[44] ^= 1;  // block_bytes
  auto damaged = KvJournalGeometry::FromHeader(mem.data(), mem.size());
  REQUIRE_FALSE(damaged.ok());
  CHECK(damaged.error().message().find("checksum") != std::string::npos);
  mem[0] = 'X';
  auto none = KvJournalGeometry::FromHeader(mem.data(), mem.size());
  REQUIRE_FALSE(none.ok());
  CHECK(none.error().message().find("WSUPKVJ1") != std::string::npos);
  // TokenHash extends one token at a time.
  auto t = Tokens(10);
  CHECK(TokenHash(t.data(), 10) == TokenHash(t.data() + 4, 6, TokenHash(t.data(), 4)));
  CHECK(TokenHash(t.data(), 10) != TokenHash(t.data(), 9));
}

TEST_CASE("kv journal: entries written are read back and taken once", "[wire][kv_journal]") {
  KvJournalGeometry g = Geo();
  std::vector<uint8_t> mem(g.bytes(), 0xee);
  auto w = KvJournalWriter::Create(mem.data(), g);
  REQUIRE(w.ok());
  const uint32_t first = g.first_block();
  auto a = Tokens(400, 1);
  auto b = Tokens(37, 2);
  REQUIRE(w->Put("req-a", TokenHash(a.data(), 399), 399, Pages(first, 25)).ok());
  REQUIRE(w->Put("req-b", TokenHash(b.data(), 30), 30, Pages(first + 25, 2)).ok());
  // An update of the same sequence reuses its entry.
  REQUIRE(w->Put("req-b", TokenHash(b.data(), 36), 36, Pages(first + 25, 3)).ok());
  CHECK(w->used() == 2);
  REQUIRE(w->Put("req-c", TokenHash(b.data(), 5), 5, Pages(first + 30, 1)).ok());
  w->Remove("req-c");
  CHECK(w->used() == 2);
  // Refused, and nothing written: too long an id, too many pages.
  CHECK_FALSE(w->Put(std::string(kKvJournalIdBytes + 1, 'x'), 0, 1, Pages(first, 1)).ok());
  CHECK_FALSE(w->Put("bad id", 0, 1, Pages(first, 1)).ok());
  CHECK_FALSE(w->Put("req-d", 0, 1, Pages(first, g.max_pages + 1)).ok());

  auto r = KvJournalReader::Read(mem.data(), mem.size(), g);
  REQUIRE(r.header_ok());
  CHECK(r.entries().size() == 2);
  CHECK(r.dropped().empty());
  KvJournalMiss why{};
  // The resumed request is the prompt and the streamed tokens: one more than the KV.
  auto e = r.Take("req-a", a, &why);
  REQUIRE(e.ok());
  CHECK(e->count == 399);
  CHECK(e->pages == Pages(first, 25));
  CHECK_FALSE(r.Take("req-a", a, &why).ok());
  CHECK(why == KvJournalMiss::kMissing);
  CHECK_FALSE(r.Take("req-c", b, &why).ok());  // removed
  CHECK(why == KvJournalMiss::kMissing);
  // Other tokens (a request id reused for another prompt): not adopted,
  // and the entry's pages are free again.
  std::vector<uint32_t> freed;
  CHECK_FALSE(r.Take("req-b", Tokens(37, 3), &why, &freed).ok());
  CHECK(why == KvJournalMiss::kHashMismatch);
  CHECK(freed == Pages(first + 25, 3));
  CHECK(r.entries().empty());
  CHECK_FALSE(r.Take("req-b", b, &why).ok());  // taken once, adopted or not
  CHECK(why == KvJournalMiss::kMissing);
  // Fewer tokens than the entry, and no chain to check a page by.
  auto again = KvJournalReader::Read(mem.data(), mem.size(), g);
  CHECK_FALSE(again.Take("req-b", Tokens(20, 2), &why).ok());
  CHECK(why == KvJournalMiss::kShorter);
  // What nobody took goes back to the pool.
  auto third = KvJournalReader::Read(mem.data(), mem.size(), g);
  CHECK(third.pages_held() == 28);
  REQUIRE(third.Take("req-a", a, &why).ok());
  CHECK(third.Release() == Pages(first + 25, 3));
  CHECK(third.entries().empty());
  CHECK(third.pages_held() == 0);

  // Full: the ninth sequence is not journaled, the others are untouched.
  auto w2 = KvJournalWriter::Create(mem.data(), g);
  REQUIRE(w2.ok());
  for (uint32_t i = 0; i < g.entries; ++i) {
    REQUIRE(w2->Put("s" + std::to_string(i), 1, 1, {first + i}).ok());
  }
  Status full = w2->Put("s-extra", 1, 1, {first + 100});
  REQUIRE_FALSE(full.ok());
  CHECK(full.error().message().find("entries are in use") != std::string::npos);
  CHECK(KvJournalReader::Read(mem.data(), mem.size(), g).entries().size() == g.entries);
}

TEST_CASE("kv journal: a stream behind its engine adopts whole pages by their chain hash",
          "[wire][kv_journal]") {
  KvJournalGeometry g = Geo();
  std::vector<uint8_t> mem(g.bytes());
  const uint32_t first = g.first_block();
  auto t = Tokens(120, 9);  // the first 100 are the entry's; a stream may have more
  // The engine had computed 100 positions (7 pages, 6 of them full).
  std::vector<uint64_t> chain;
  for (uint32_t i = 1; i <= 6; ++i) chain.push_back(TokenHash(t.data(), i * g.block_size));
  auto put = [&](std::vector<uint64_t> c) {
    auto w = KvJournalWriter::Create(mem.data(), g);
    REQUIRE(w.ok());
    REQUIRE(w->Put("r", TokenHash(t.data(), 100), 100, Pages(first, 7), c).ok());
  };
  auto take = [&](size_t n, std::vector<uint32_t>* freed = nullptr) {
    auto r = KvJournalReader::Read(mem.data(), mem.size(), g);
    std::vector<int32_t> got(t.begin(), t.begin() + static_cast<std::ptrdiff_t>(n));
    KvJournalMiss why = KvJournalMiss::kMissing;
    auto a = r.Take("r", got, &why, freed);
    if (!a.ok()) return std::make_pair(std::string(KvJournalMissName(why)), KvJournalAdoption{});
    return std::make_pair(std::string("adopted"), *a);
  };
  put(chain);
  // The stream got 50 tokens: 49 may be adopted, whole pages of them: 48.
  auto [w50, a50] = take(50);
  REQUIRE(w50 == "adopted");
  CHECK(a50.count == 48);
  CHECK(a50.by_page);
  CHECK(a50.pages == Pages(first, 3));
  CHECK(a50.spare == Pages(first + 3, 4));
  // 48 tokens: the last is computed again, so only two pages.
  CHECK(take(48).second.count == 32);
  // As many tokens as the entry's count: all but the last, by the entry's hash.
  auto [w100, a100] = take(100);
  REQUIRE(w100 == "adopted");
  CHECK(a100.count == 99);
  CHECK_FALSE(a100.by_page);
  CHECK(a100.pages == Pages(first, 7));
  CHECK(a100.spare.empty());
  // Too short for one page: refused, and the entry's pages are free again.
  std::vector<uint32_t> freed;
  CHECK(take(10, &freed).first == "shorter_than_entry");
  CHECK(freed == Pages(first, 7));
  // Another request under the same id: its prefix does not hash the same.
  auto other = Tokens(60, 10);
  auto r = KvJournalReader::Read(mem.data(), mem.size(), g);
  KvJournalMiss why{};
  CHECK_FALSE(r.Take("r", other, &why).ok());
  CHECK(why == KvJournalMiss::kHashMismatch);
  // A writer that gave no chain: a stream behind it adopts nothing.
  put({});
  CHECK(take(50).first == "shorter_than_entry");
  CHECK(take(101).first == "adopted");
  // A chain past the count (7 full pages of 100 positions) is damage.
  std::vector<uint64_t> long_chain = chain;
  long_chain.push_back(TokenHash(t.data(), 7 * g.block_size));
  put(long_chain);
  CHECK(take(50).first == "count_past_pages");
}

TEST_CASE("kv journal: damaged journals are recomputed, each for its reason", "[wire][kv_journal]") {
  KvJournalGeometry g = Geo();
  std::vector<uint8_t> mem(g.bytes());
  const uint32_t first = g.first_block();
  auto t = Tokens(100);
  auto fresh = [&] {
    auto w = KvJournalWriter::Create(mem.data(), g);
    REQUIRE(w.ok());
    REQUIRE(w->Put("one", TokenHash(t.data(), 99), 99, Pages(first, 7)).ok());
    REQUIRE(w->Put("two", TokenHash(t.data(), 50), 50, Pages(first + 10, 4)).ok());
  };
  auto take = [&](const char* id) {
    auto r = KvJournalReader::Read(mem.data(), mem.size(), g);
    KvJournalMiss why = KvJournalMiss::kMissing;
    bool ok = r.Take(id, t, &why).ok();
    return ok ? std::string("adopted") : std::string(KvJournalMissName(why));
  };

  fresh();
  CHECK(take("one") == "adopted");

  SECTION("a header of another geometry drops the whole journal") {
    KvJournalGeometry other = g;
    other.block_size = 32;
    auto r = KvJournalReader::Read(mem.data(), mem.size(), other);
    CHECK_FALSE(r.header_ok());
    KvJournalMiss why{};
    CHECK_FALSE(r.Take("one", t, &why).ok());
    CHECK(why == KvJournalMiss::kNoJournal);
    mem[3] ^= 1;  // the magic
    CHECK(take("one") == "no_journal");
    CHECK(KvJournalReader::Read(mem.data(), g.bytes() - 1, g).header_ok() == false);
  }
  SECTION("another kv_format (another model or engine) drops the whole journal") {
    KvJournalGeometry other = g;
    other.kv_format = g.kv_format + 1;
    auto r = KvJournalReader::Read(mem.data(), mem.size(), other);
    CHECK_FALSE(r.header_ok());
  }
  SECTION("a wrong hash") {
    mem[At(g, 0, 32)] ^= 0x40;     // slot 0 is "one": its token_hash
    CHECK(take("one") == "torn");  // the checksum catches the flipped byte first
    // Rewritten whole with another hash: a valid entry that is not this request's.
    auto w = KvJournalWriter::Create(mem.data(), g);
    REQUIRE(w.ok());
    REQUIRE(w->Put("one", 12345, 99, Pages(first, 7)).ok());
    CHECK(take("one") == "hash_mismatch");
  }
  SECTION("an out-of-range page") {
    auto w = KvJournalWriter::Create(mem.data(), g);
    REQUIRE(w.ok());
    REQUIRE(w->Put("one", TokenHash(t.data(), 99), 99, {first, first + 1, first + 2, first + 3, first + 4, first + 5,
                                                          g.pool_blocks}).ok());
    REQUIRE(w->Put("two", TokenHash(t.data(), 50), 50, {0, first + 20, first + 21, first + 22}).ok());  // the journal's own
    CHECK(take("one") == "page_out_of_range");
    CHECK(take("two") == "page_out_of_range");
  }
  SECTION("a count past its pages") {
    auto w = KvJournalWriter::Create(mem.data(), g);
    REQUIRE(w.ok());
    REQUIRE(w->Put("one", TokenHash(t.data(), 99), 99, Pages(first, 6)).ok());  // 6 x 16 < 99
    CHECK(take("one") == "count_past_pages");
  }
  SECTION("pages claimed by two entries: neither is adopted") {
    auto w = KvJournalWriter::Create(mem.data(), g);
    REQUIRE(w.ok());
    REQUIRE(w->Put("one", TokenHash(t.data(), 99), 99, Pages(first, 7)).ok());
    REQUIRE(w->Put("two", TokenHash(t.data(), 50), 50, Pages(first + 6, 4)).ok());
    REQUIRE(w->Put("three", TokenHash(t.data(), 10), 10, Pages(first + 50, 1)).ok());
    auto r = KvJournalReader::Read(mem.data(), mem.size(), g);
    CHECK(r.dropped().at(KvJournalMiss::kPageClaimedTwice) == 2);
    CHECK(take("one") == "page_claimed_twice");
    CHECK(take("two") == "page_claimed_twice");
    CHECK(take("three") == "adopted");
  }
  SECTION("a torn entry: odd seq, or a body that does not match its checksum") {
    uint64_t seq;
    std::memcpy(&seq, &mem[At(g, 1, 0)], 8);  // slot 1 is "two"
    seq |= 1;
    std::memcpy(&mem[At(g, 1, 0)], &seq, 8);
    CHECK(take("two") == "torn");
    CHECK(take("one") == "adopted");  // its neighbour is fine
    fresh();
    mem[At(g, 1, 96 + 16)] ^= 1;  // its second page's block id
    CHECK(take("two") == "torn");
    fresh();
    mem[At(g, 1, 24)] = 0xff;  // page_count past the entry
    CHECK(take("two") == "torn");
    CHECK(take("two") == "torn");
  }
}

TEST_CASE("kv journal: a writer killed mid-write leaves every entry whole or refused", "[wire][kv_journal]") {
  KvJournalGeometry g = Geo();
  g.pool_blocks = 1024;  // 8 sequences of up to 38 pages, 40 apart
  const size_t size = g.bytes();
  void* shared = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  REQUIRE(shared != MAP_FAILED);
  auto* mem = static_cast<uint8_t*>(shared);
  const uint32_t first = g.first_block();
  auto t = Tokens(640);  // covers every chain hash (38 pages of 16)
  // A counter in the shared page tells the parent the writer is in its loop.
  auto* progress = reinterpret_cast<std::atomic<uint64_t>*>(
      ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  REQUIRE(progress != MAP_FAILED);
  progress->store(0);
  // Everything the writer needs is made before the fork: the child only
  // writes (a child of a threaded process must not allocate).
  auto w = KvJournalWriter::Create(mem, g);
  REQUIRE(w.ok());
  std::vector<std::string> ids;
  for (uint32_t s = 0; s < g.entries; ++s) {
    ids.push_back("seq-" + std::to_string(s));
    REQUIRE(w->Put(ids.back(), TokenHash(t.data(), 1), 1, {first + s * 40}).ok());
  }
  std::vector<std::vector<uint32_t>> prefixes;  // pages[s] cut to n pages, for every n
  for (uint32_t n = 0; n <= 38; ++n) prefixes.emplace_back(Pages(0, n));
  std::vector<std::vector<uint64_t>> chains;  // the chain hashes of n full pages, for every n
  for (uint32_t n = 0; n <= 38; ++n) {
    chains.emplace_back();
    for (uint32_t i = 1; i <= n; ++i) chains.back().push_back(TokenHash(t.data(), i * g.block_size));
  }
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    // Sequences growing one token per step, as an engine's do, for ever.
    for (uint64_t step = 1;; ++step) {
      for (uint32_t s = 0; s < g.entries; ++s) {
        const uint32_t count = static_cast<uint32_t>(1 + (step + s * 37) % 590);
        const uint32_t n = (count + g.block_size - 1) / g.block_size;
        auto& p = prefixes[n];
        for (uint32_t i = 0; i < n; ++i) p[i] = first + s * 40 + i;
        (void)w->Put(ids[s], TokenHash(t.data(), count), count, p, chains[count / g.block_size]);
      }
      progress->store(step, std::memory_order_relaxed);
    }
  }
  // Bounded: the writer may have died on its own.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (progress->load() < 2000 && std::chrono::steady_clock::now() < deadline) {
  }
  REQUIRE(progress->load() >= 2000);
  REQUIRE(::kill(pid, SIGKILL) == 0);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  CHECK(WIFSIGNALED(status));

  // Every entry the reader accepts describes exactly the tokens it claims;
  // the one being written when the writer died (if any) is refused as torn.
  auto r = KvJournalReader::Read(mem, size, g);
  REQUIRE(r.header_ok());
  int adopted = 0, torn = 0;
  for (uint32_t s = 0; s < g.entries; ++s) {
    const std::string id = "seq-" + std::to_string(s);
    KvJournalMiss why{};
    auto e = r.Take(id, t, &why);
    if (e.ok()) {
      ++adopted;  // Take() checked its hash against the tokens
      CHECK(e->count >= 1);
      CHECK(e->pages.size() == (e->count + g.block_size - 1) / g.block_size);
      CHECK(e->pages.front() == first + s * 40);
    } else {
      CHECK(why == KvJournalMiss::kTorn);
      ++torn;
    }
  }
  CHECK(torn <= 1);
  CHECK(adopted + torn == static_cast<int>(g.entries));
  ::munmap(shared, size);
  ::munmap(progress, 4096);
}

}  // namespace
}  // namespace wsup
