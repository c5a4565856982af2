// The engine's side of the KV journal (engine/pool_journal.h) over a pool
// in a host buffer: one engine describes a sequence and dies; the next
// finds it, keeps its pages until the clock says, and gives them to the
// request that resumes it, or says why not.
#include <catch2/catch.hpp>

#include <cstring>
#include <map>
#include <vector>

#include "engine/clock.h"
#include "engine/pool_journal.h"

using namespace wsup;
using namespace wsup::engine;

namespace {

constexpr int kPoolBlocks = 32;
constexpr uint64_t kBlockBytes = 4096;

KvLayout PooledLayout() {
  KvLayout kv;
  kv.block_size = 16;
  kv.block_bytes = kBlockBytes;
  kv.pool_span = kPoolBlocks * kBlockBytes;
  kv.pool_blocks = kPoolBlocks;
  kv.scratch_first = kPoolBlocks + 1;
  kv.scratch_blocks = 4;
  return kv;
}

// The pool's bytes, as the runner reads and writes them.
struct HostPool {
  std::vector<uint8_t> bytes = std::vector<uint8_t>(kPoolBlocks * kBlockBytes, 0);
  int writes = 0;
  PoolBytes Io() {
    return PoolBytes{[this](uint64_t off, void* out, size_t n) {
                       std::memcpy(out, bytes.data() + off, n);
                       return Status::Ok();
                     },
                     [this](uint64_t off, const void* in, size_t n) {
                       ++writes;
                       std::memcpy(bytes.data() + off, in, n);
                       return Status::Ok();
                     }};
  }
};

std::vector<int32_t> Tokens(size_t n, int salt) {
  std::vector<int32_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = static_cast<int32_t>((i * 13 + static_cast<size_t>(salt)) % 256);
  return t;
}

}  // namespace

TEST_CASE("pool journal: a dead engine's sequence is found, kept until its bound, and adopted by its resume") {
  const KvJournalGeometry g = PoolJournalGeometry(PooledLayout(), 512, 8, 42);
  REQUIRE(g.Check().ok());
  HostPool pool;
  FakeEngineClock clock(1'000);
  const std::vector<int32_t> prompt = Tokens(40, 1);
  const std::vector<int32_t> generated = {7, 8, 9};
  std::vector<int32_t> blocks;
  {
    PoolJournal dead(g, pool.Io(), clock, 500);
    CHECK(dead.blocks() == static_cast<int>(g.journal_blocks()));
    dead.Open();
    REQUIRE(dead.on());
    CHECK(dead.found() == 0);
    for (int b = 0; b < 4; ++b) blocks.push_back(dead.blocks() + b);
    JournalHash hash;
    // Its whole prompt is cached, and three tokens generated: the KV of
    // 42 positions is complete (the newest token's is computed next).
    dead.Describe("req-1", prompt, generated, prompt.size(), blocks, &hash);
    CHECK(hash.hashed == 42);
    CHECK(hash.chain.size() == 2);  // two full blocks of 16
    // Without a request id, or with KV on the scratch: not described.
    JournalHash other;
    dead.Describe("", prompt, generated, prompt.size(), blocks, &other);
    dead.Describe("req-2", prompt, generated, prompt.size(), {kPoolBlocks + 1, kPoolBlocks + 2, kPoolBlocks + 3},
                  &other);
    CHECK(other.hashed == 0);
    CHECK(dead.entries() == 1);
    const int before = pool.writes;
    dead.Flush();
    CHECK(pool.writes == before + 1);
    dead.Flush();  // nothing changed: nothing written
    CHECK(pool.writes == before + 1);
  }

  PoolJournal next(g, pool.Io(), clock, 500);
  next.Open();
  CHECK(next.found() == 1);
  CHECK(next.on());
  CHECK(next.entries() == 0);  // a fresh journal of its own
  REQUIRE(next.keeping());
  CHECK(next.keep_until_ms() == 1'500);
  CHECK(next.pages_kept() == 3);
  const std::vector<bool> kept = next.Kept(kPoolBlocks);
  for (int b = 0; b < kPoolBlocks; ++b) {
    const bool want = b < next.blocks() || (b >= blocks[0] && b < blocks[0] + 3);
    CHECK(kept[static_cast<size_t>(b)] == want);
  }

  // Resumes it cannot serve, each for its reason.
  std::vector<int32_t> resumed = prompt;
  resumed.insert(resumed.end(), generated.begin(), generated.end());
  CHECK_FALSE(next.Adopt(true, false, "req-1", resumed).adopted);
  CHECK_FALSE(next.Adopt(true, true, "", resumed).adopted);
  CHECK_FALSE(next.Adopt(true, true, "req-9", resumed).adopted);
  CHECK(next.recomputed() == 3);
  CHECK(next.recomputed_reasons() ==
        std::map<std::string, uint64_t>{{"pool_not_granted", 1}, {"no_request_id", 1}, {"missing", 1}});

  // Its own resume adopts the 42 positions in their pages.
  PoolAdoption a = next.Adopt(true, true, "req-1", resumed);
  REQUIRE(a.adopted);
  CHECK(a.count == 42);
  CHECK(a.pages == std::vector<uint32_t>{static_cast<uint32_t>(blocks[0]), static_cast<uint32_t>(blocks[1]),
                                         static_cast<uint32_t>(blocks[2])});
  CHECK(next.adopted_sequences() == 1);
  CHECK(next.adopted_tokens() == 42);
  CHECK_FALSE(next.keeping());
  CHECK(next.Release("test").empty());
}

TEST_CASE("pool journal: pages nobody resumes are released - a journal that cannot be written is off") {
  const KvJournalGeometry g = PoolJournalGeometry(PooledLayout(), 512, 8, 42);
  HostPool pool;
  FakeEngineClock clock;
  {
    PoolJournal dead(g, pool.Io(), clock, 0);
    dead.Open();
    JournalHash hash;
    dead.Describe("req-1", Tokens(20, 2), {5}, 20, {dead.blocks(), dead.blocks() + 1}, &hash);
    dead.Flush();
  }
  // Keeping off: released at once, nothing kept.
  PoolJournal off(g, pool.Io(), clock, 0);
  off.Open();
  CHECK(off.found() == 1);
  CHECK_FALSE(off.keeping());
  CHECK(off.released_blocks() == 2);

  // A pool that refuses writes: no journal, counted, and nothing to flush.
  PoolBytes refusing = pool.Io();
  refusing.write = [](uint64_t, const void*, size_t) -> Status { return IoError("test: the pool refuses writes"); };
  PoolJournal broken(g, refusing, clock, 1000);
  broken.Open();
  CHECK_FALSE(broken.on());
  CHECK(broken.errors() == 1);
  JournalHash hash;
  broken.Describe("req-2", Tokens(20, 3), {5}, 20, {broken.blocks()}, &hash);
  CHECK(broken.entries() == 0);

  // No pool: no geometry, no blocks.
  KvLayout priv;
  priv.block_size = 16;
  priv.block_bytes = kBlockBytes;
  priv.scratch_blocks = 8;
  PoolJournal none(PoolJournalGeometry(priv, 512, 8, 42), pool.Io(), clock, 1000);
  CHECK(none.blocks() == 0);
}
