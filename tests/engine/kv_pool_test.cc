// The engine's side of the node's KV pool, in process: the block ids of a
// pooled cache (engine/kv_memory.h), the host mapping of a pool made of
// memfds, and the scheduler opening and closing the pool between steps
// (engine/scheduler.h) with the tiny Llama: what a sequence computes does
// not depend on where its blocks are, a closing pool waits for the
// sequences that hold its blocks, and a request that needs the pool waits
// for it.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <atomic>
#include <future>
#include <fstream>
#include <mutex>
#include <sstream>

#include "checkpoint/checkpoint.h"
#include "engine/kv_memory.h"
#include "engine/kv_pool_link.h"
#include "engine/runner.h"
#include "engine/scheduler.h"
#include "wire/kv_journal.h"
#include "testkit/test_util.h"
#include "tests/engine/tiny_runner.h"

using namespace wsup;
using namespace wsup::engine;

namespace {

constexpr uint64_t kBlock = 32768;  // llama-tiny-f32: 2 layers x 2 (k, v) x 2 heads x 16 positions x 64 x 4 bytes

// A pool allocation as a holder makes one: a memfd sealed against growing
// and shrinking, writable.
UniqueFd PoolMemfd(uint64_t bytes) {
  int fd = ::memfd_create("test-kv-pool", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  REQUIRE(fd >= 0);
  REQUIRE(::ftruncate(fd, static_cast<off_t>(bytes)) == 0);
  REQUIRE(::fcntl(fd, F_ADD_SEALS, F_SEAL_GROW | F_SEAL_SHRINK) == 0);
  return UniqueFd(fd);
}

// The permissions /proc/self/maps shows for the mapping that holds p.
std::string MapsPerms(const void* p) {
  std::ifstream in("/proc/self/maps");
  std::string line;
  const auto a = reinterpret_cast<uintptr_t>(p);
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string range, perms;
    ls >> range >> perms;
    auto dash = range.find('-');
    uintptr_t lo = std::stoull(range.substr(0, dash), nullptr, 16), hi = std::stoull(range.substr(dash + 1), nullptr, 16);
    if (a >= lo && a < hi) return perms;
  }
  return "";
}

TEST_CASE("kv layout: a private cache starts at id 0, a pooled one after the pool's span", "[kv_pool]") {
  auto priv = KvLayout::Private(kBlock, 16, 10 * kBlock + 5);
  REQUIRE(priv.ok());
  CHECK(priv->scratch_first == 0);
  CHECK(priv->scratch_blocks == 10);
  CHECK(priv->pool_blocks == 0);
  CHECK_FALSE(priv->pooled());
  CHECK(priv->spare() == 10);

  // A pool of two allocations whose span is not a whole number of blocks:
  // the block that straddles its end is nobody's.
  auto pooled = KvLayout::Pooled(kBlock, 16, {3 * kBlock + 4096, 2 * kBlock}, 4 * kBlock);
  REQUIRE(pooled.ok());
  CHECK(pooled->pool_span == 5 * kBlock + 4096);
  CHECK(pooled->pool_blocks == 5);
  CHECK(pooled->scratch_first == 6);
  CHECK(pooled->scratch_blocks == 4);
  CHECK(pooled->id_count() == 10);
  CHECK(pooled->spare() == 10);
  CHECK(pooled->span() == 11 * kBlock);

  auto tiny_scratch = KvLayout::Pooled(kBlock, 16, {4 * kBlock}, kBlock - 1);
  REQUIRE_FALSE(tiny_scratch.ok());
  CHECK(tiny_scratch.error().message().find("--kv-scratch-mib") != std::string::npos);
  auto tiny_pool = KvLayout::Pooled(kBlock, 16, {4096}, 4 * kBlock);
  REQUIRE_FALSE(tiny_pool.ok());
  CHECK(tiny_pool.error().message().find("pool_mib") != std::string::npos);
  auto no_cache = KvLayout::Private(kBlock, 16, kBlock - 1);
  REQUIRE_FALSE(no_cache.ok());
  CHECK(no_cache.error().message().find("--kv-cache-mib") != std::string::npos);
}

TEST_CASE("kv memory (host): the pool is mapped in place, shared with its memfd, and let go", "[kv_pool]") {
  auto layout = KvLayout::Pooled(kBlock, 16, {64 * 1024, 64 * 1024}, 2 * kBlock);
  REQUIRE(layout.ok());
  auto mem = KvMemory::CreateHost(*layout);
  REQUIRE(mem.ok());
  uint8_t* base = (*mem)->base();
  CHECK(MapsPerms(base).substr(0, 3) == "---");  // reserved, not mapped
  uint8_t* scratch = base + layout->scratch_first * kBlock;
  scratch[0] = 7;  // the scratch is there from the start
  CHECK(MapsPerms(scratch).substr(0, 2) == "rw");

  std::vector<UniqueFd> fds;
  fds.push_back(PoolMemfd(64 * 1024));
  fds.push_back(PoolMemfd(64 * 1024));
  REQUIRE((*mem)->MapPool(fds).ok());
  CHECK((*mem)->pool_mapped());
  CHECK(MapsPerms(base).substr(0, 4) == "rw-s");
  base[10] = 42;                 // allocation 0
  base[64 * 1024 + 3] = 43;      // allocation 1, right after it
  uint8_t byte = 0;
  REQUIRE(::pread(fds[0].get(), &byte, 1, 10) == 1);
  CHECK(byte == 42);
  REQUIRE(::pread(fds[1].get(), &byte, 1, 3) == 1);
  CHECK(byte == 43);

  REQUIRE((*mem)->UnmapPool().ok());
  CHECK_FALSE((*mem)->pool_mapped());
  CHECK(MapsPerms(base).substr(0, 3) == "---");
  CHECK(scratch[0] == 7);  // the scratch is untouched
  // The bytes stay the node's: mapped again, they are still there.
  REQUIRE((*mem)->MapPool(fds).ok());
  CHECK(base[10] == 42);
  REQUIRE((*mem)->UnmapPool().ok());

  std::vector<UniqueFd> one;
  one.push_back(PoolMemfd(64 * 1024));
  auto short_fds = (*mem)->MapPool(one);
  REQUIRE_FALSE(short_fds.ok());
  CHECK(MapsPerms(base).substr(0, 3) == "---");
}

TEST_CASE("role requests: active with the pool, active on scratch, standby - bad bodies named", "[kv_pool]") {
  auto a = ParseRoleRequest(R"({"role": "active", "kv": "pool"})");
  REQUIRE(a.ok());
  CHECK(a->role == "active");
  CHECK(a->pool);
  auto s = ParseRoleRequest(R"({"role": "standby"})");
  REQUIRE(s.ok());
  CHECK_FALSE(s->pool);
  CHECK(ParseRoleRequest(R"({"role": "active", "kv": "scratch"})").ok());
  auto bad_role = ParseRoleRequest(R"({"role": "leader"})");
  REQUIRE_FALSE(bad_role.ok());
  CHECK(bad_role.error().message().find("active, standby") != std::string::npos);
  auto standby_pool = ParseRoleRequest(R"({"role": "standby", "kv": "pool"})");
  REQUIRE_FALSE(standby_pool.ok());
  CHECK(standby_pool.error().message().find("only the active engine") != std::string::npos);
  CHECK_FALSE(ParseRoleRequest("[1]").ok());
  CHECK_FALSE(ParseRoleRequest("{").ok());
  CHECK_FALSE(ParseRoleRequest(R"({"role": "active", "kv": 3})").ok());
}

// ---------------------------------------------------------------- scheduler

using testing::TinyRunner;

using Outcomes = testing::SchedulerEvents;

// A started scheduler over TinyRunner's KV cache as a pool member: 4
// scratch blocks beside one 1 MiB pool allocation; out collects what it
// says.
struct PooledScheduler {
  std::unique_ptr<ModelRunner> runner = PooledRunner();
  Outcomes out;
  Scheduler sched{runner.get(), SchedulerOptions{}, out.Sink()};
  PooledScheduler() { sched.Start(); }

  static std::unique_ptr<ModelRunner> PooledRunner() {
    REQUIRE(test::HaveTestData("llama-tiny-f32"));
    auto runner = TinyRunner();
    REQUIRE(runner->AllocatePooledKv({{1 << 20}}, 4 * kBlock, 16).ok());
    return runner;
  }
};

GenRequest Req(uint64_t id, int max_tokens) {
  GenRequest g;
  g.id = id;
  g.prompt = {72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100};  // "Hello, world"
  g.max_tokens = max_tokens;
  return g;
}

// A callback's outcome, waited for by the test.
struct Done {
  std::atomic<bool> called{false};
  Status st;
  std::mutex mu;
  Scheduler::PoolDone Fn() {
    return [this](Status s) {
      std::lock_guard<std::mutex> lk(mu);
      st = s;
      called = true;
    };
  }
};

// One rank's pool as a holder hands it out: a memfd, and fetches that give
// a dup of it (after `gate`, when one is given).
struct TestPool {
  explicit TestPool(uint64_t bytes = 1 << 20) : fd(PoolMemfd(bytes)) {}
  UniqueFd fd;
  Scheduler::PoolFetch Fetch(std::shared_future<void> gate = {}) const {
    const int raw = fd.get();
    return [raw, gate]() -> Result<std::vector<std::vector<UniqueFd>>> {
      if (gate.valid()) gate.wait();
      std::vector<std::vector<UniqueFd>> fds(1);
      fds[0].push_back(UniqueFd(::dup(raw)));
      return fds;
    };
  }
};

TEST_CASE("scheduler over a pool: scratch first, the pool when opened, the same tokens either way", "[kv_pool]") {
  REQUIRE(test::HaveTestData("llama-tiny-f32"));
  // The tokens of a private cache, for comparison.
  std::vector<int32_t> want;
  {
    auto runner = TinyRunner();
    REQUIRE(runner->AllocateKv(1 << 20, 16).ok());
    Outcomes out;
    Scheduler sched(runner.get(), SchedulerOptions{}, out.Sink());
    sched.Start();
    REQUIRE(sched.Submit(Req(1, 100)).ok());
    REQUIRE(test::WaitFor([&] { return out.Done(1); }, std::chrono::seconds(60)));
    want = out.Tokens(1);
    REQUIRE(want.size() == 100);
  }

  auto runner = TinyRunner();
  // 4 scratch blocks (64 positions), 32 pool blocks.
  REQUIRE(runner->AllocatePooledKv({{1 << 20}}, 4 * kBlock, 16).ok());
  CHECK(runner->kv_layout().scratch_first == 32);
  Outcomes out;
  Scheduler sched(runner.get(), SchedulerOptions{}, out.Sink());
  sched.Start();
  CHECK(sched.max_sequence_tokens() == 512);  // the model's context: scratch and pool hold 576

  // 12 + 40 positions fit the scratch: served before any pool.
  REQUIRE(sched.Submit(Req(1, 40)).ok());
  REQUIRE(test::WaitFor([&] { return out.Done(1); }, std::chrono::seconds(60)));
  CHECK(out.Tokens(1) == std::vector<int32_t>(want.begin(), want.begin() + 40));
  CHECK_FALSE(sched.stats().pool_mapped);

  // 112 positions need the pool: the request waits for it.
  REQUIRE(sched.Submit(Req(2, 100)).ok());
  REQUIRE(test::WaitFor([&] { return sched.stats().waiting == 1; }, std::chrono::seconds(10)));
  CHECK_FALSE(out.Done(2));

  TestPool pool;
  const int pool_fd = pool.fd.get();
  Done opened;
  sched.OpenPool(pool.Fetch(), opened.Fn());
  REQUIRE(test::WaitFor([&] { return opened.called.load(); }, std::chrono::seconds(10)));
  REQUIRE(opened.st.ok());
  REQUIRE(test::WaitFor([&] { return out.Done(2); }, std::chrono::seconds(60)));
  CHECK(out.Tokens(2) == want);
  // Its KV went to the pool (its blocks came from there first): the memfd's
  // bytes are no longer all zero.
  {
    std::vector<char> bytes(1 << 20);
    REQUIRE(::pread(pool_fd, bytes.data(), bytes.size(), 0) == static_cast<ssize_t>(bytes.size()));
    CHECK(std::any_of(bytes.begin(), bytes.end(), [](char c) { return c != 0; }));
  }
  SchedulerStats st = sched.stats();
  CHECK(st.pool_mapped);
  CHECK(st.total_blocks == 34);  // 4 scratch and 32 pool blocks, two of them the KV journal's (64 entries)
  CHECK(st.journal);
  CHECK(st.journal_blocks == 2);
  CHECK(st.pool_blocks_in_use == 0);
}

TEST_CASE_METHOD(PooledScheduler,
                 "scheduler over a pool: closing waits for the sequences that hold its blocks",
                 "[kv_pool]") {
  TestPool pool;
  auto fetch = pool.Fetch();
  Done opened;
  sched.OpenPool(fetch, opened.Fn());
  REQUIRE(test::WaitFor([&] { return opened.called.load(); }, std::chrono::seconds(10)));
  REQUIRE(opened.st.ok());

  // A long sequence on the pool, then the pool is closed under it.
  REQUIRE(sched.Submit(Req(1, 400)).ok());
  REQUIRE(test::WaitFor([&] { return out.Tokens(1).size() >= 2; }, std::chrono::seconds(30)));
  Done closed;
  sched.ClosePool(closed.Fn());
  // New requests are served from the scratch meanwhile.
  REQUIRE(sched.Submit(Req(2, 8)).ok());
  REQUIRE(test::WaitFor([&] { return out.Done(2); }, std::chrono::seconds(30)));
  // The close is done only after the sequence that held pool blocks ended.
  REQUIRE(test::WaitFor([&] { return closed.called.load(); }, std::chrono::seconds(120)));
  REQUIRE(closed.st.ok());
  CHECK(out.Done(1));
  CHECK(out.Tokens(1).size() == 400);
  SchedulerStats st = sched.stats();
  CHECK_FALSE(st.pool_mapped);
  CHECK(st.pool_blocks_in_use == 0);
  CHECK(st.total_blocks == 4);

  // Opened again (a later promotion): mapped once more, blocks handed out.
  Done again;
  sched.OpenPool(fetch, again.Fn());
  REQUIRE(test::WaitFor([&] { return again.called.load(); }, std::chrono::seconds(10)));
  REQUIRE(again.st.ok());
  CHECK(sched.stats().pool_mapped);
}

TEST_CASE_METHOD(PooledScheduler,
                 "scheduler over a pool: a fetch that fails leaves the engine on its scratch - a private cache refuses",
                 "[kv_pool]") {
  Done failed;
  sched.OpenPool([]() -> Result<std::vector<std::vector<UniqueFd>>> { return Unavailable("holder down (test)"); },
                 failed.Fn());
  REQUIRE(test::WaitFor([&] { return failed.called.load(); }, std::chrono::seconds(10)));
  REQUIRE_FALSE(failed.st.ok());
  CHECK(failed.st.error().message().find("holder down") != std::string::npos);
  CHECK_FALSE(sched.stats().pool_mapped);
  // A pool of another shape is refused by the mapping, and nothing stays mapped.
  Done wrong;
  sched.OpenPool(
      []() -> Result<std::vector<std::vector<UniqueFd>>> {
        std::vector<std::vector<UniqueFd>> fds(1);
        fds[0].push_back(PoolMemfd(1 << 20));
        fds[0].push_back(PoolMemfd(1 << 20));
        return fds;
      },
      wrong.Fn());
  REQUIRE(test::WaitFor([&] { return wrong.called.load(); }, std::chrono::seconds(10)));
  REQUIRE_FALSE(wrong.st.ok());
  CHECK_FALSE(sched.stats().pool_mapped);
  REQUIRE(sched.Submit(Req(1, 8)).ok());
  REQUIRE(test::WaitFor([&] { return out.Done(1); }, std::chrono::seconds(30)));
  CHECK(out.Tokens(1).size() == 8);
  // More than scratch and pool together hold: refused at once, naming the pool.
  auto small_runner = TinyRunner();
  REQUIRE(small_runner->AllocatePooledKv({{8 * kBlock}}, 4 * kBlock, 16).ok());  // 192 positions in all
  Scheduler small(small_runner.get(), SchedulerOptions{}, out.Sink());
  auto refused = small.Submit(Req(2, 200));
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.error().message().find("[kv] pool_mib") != std::string::npos);
  // 176 positions (one of the pool's blocks is its journal's): fits once the pool is open.
  CHECK(small.Submit(Req(2, 164)).ok());
  CHECK_FALSE(small.Submit(Req(3, 165)).ok());

  auto priv_runner = TinyRunner();
  REQUIRE(priv_runner->AllocateKv(4 * kBlock, 16).ok());
  Scheduler priv(priv_runner.get(), SchedulerOptions{}, out.Sink());
  priv.Start();
  Done refused_open;
  priv.OpenPool([]() -> Result<std::vector<std::vector<UniqueFd>>> { return std::vector<std::vector<UniqueFd>>{}; },
                refused_open.Fn());
  REQUIRE(test::WaitFor([&] { return refused_open.called.load(); }, std::chrono::seconds(10)));
  REQUIRE_FALSE(refused_open.st.ok());
  CHECK(refused_open.st.error().message().find("private KV cache") != std::string::npos);
  auto too_big = priv.Submit(Req(3, 100));
  REQUIRE_FALSE(too_big.ok());
  CHECK(too_big.error().message().find("--kv-cache-mib") != std::string::npos);
}

}  // namespace

namespace {

TEST_CASE_METHOD(PooledScheduler,
                 "scheduler over a pool: the pool is mapped beside the steps, not between them",
                 "[kv_pool]") {
  // A sequence on the scratch, generating.
  REQUIRE(sched.Submit(Req(1, 50)).ok());
  REQUIRE(test::WaitFor([&] { return out.Tokens(1).size() >= 2; }, std::chrono::seconds(30)));
  // The pool's fetch blocks until the test lets it go; the steps go on.
  std::promise<void> release;
  std::shared_future<void> go = release.get_future().share();
  TestPool pool;
  Done opened;
  sched.OpenPool(pool.Fetch(go), opened.Fn());
  const size_t before = out.Tokens(1).size();
  CHECK(test::WaitFor([&] { return out.Tokens(1).size() >= before + 3 || out.Done(1); }, std::chrono::seconds(30)));
  CHECK_FALSE(opened.called.load());
  release.set_value();
  REQUIRE(test::WaitFor([&] { return opened.called.load(); }, std::chrono::seconds(10)));
  REQUIRE(opened.st.ok());
  CHECK(sched.stats().pool_mapped);
  // Its blocks are handed out at the next step boundary.
  REQUIRE(test::WaitFor([&] { return sched.stats().total_blocks == 34; }, std::chrono::seconds(10)));
  REQUIRE(test::WaitFor([&] { return out.Done(1); }, std::chrono::seconds(30)));
}

}  // namespace

namespace {

TEST_CASE_METHOD(PooledScheduler, "scheduler over a pool: role requests take effect in their order",
                 "[kv_pool]") {
  TestPool pool;
  auto fetch = pool.Fetch();
  // Busy with a sequence, so that requests meet queued ones; whichever way
  // they interleave with the steps, the last one decides.
  REQUIRE(sched.Submit(Req(1, 400)).ok());
  for (int round = 0; round < 10; ++round) {
    Done first, second;
    sched.ClosePool(first.Fn());
    sched.OpenPool(fetch, second.Fn());
    REQUIRE(test::WaitFor([&] { return first.called.load() && second.called.load(); }, std::chrono::seconds(30)));
    INFO("round " << round << ": close then open");
    REQUIRE(second.st.ok());
    CHECK(sched.stats().pool_mapped);
    Done third, fourth;
    sched.OpenPool(fetch, third.Fn());
    sched.ClosePool(fourth.Fn());
    REQUIRE(test::WaitFor([&] { return third.called.load() && fourth.called.load(); }, std::chrono::seconds(60)));
    INFO("round " << round << ": open then close");
    REQUIRE(fourth.st.ok());
    CHECK_FALSE(sched.stats().pool_mapped);
  }
}

// ---------------------------------------------------------------- prefetch

// A fetch that counts, gives one memfd's dup, and waits for `gate` first
// when one is set.
struct CountingFetch {
  TestPool pool;
  std::atomic<int> fetches{0}, prepares{0}, drops{0};
  std::shared_future<void> gate;
  PoolPrefetch::Fetch Fetch() {
    return [this]() -> Result<PoolFds> {
      ++fetches;
      if (gate.valid()) gate.wait();
      return pool.Fetch()();
    };
  }
  PoolPrefetch::Prepare Prepare(Status result = Status::Ok()) {
    return [this, result](const PoolFds& fds) -> Status {
      if (fds.size() != 1 || fds[0].size() != 1 || !fds[0][0].valid()) return Internal("no fd to prepare");
      ++prepares;
      return result;
    };
  }
  PoolPrefetch::Drop Drop() {
    return [this] { ++drops; };
  }
};

TEST_CASE("pool prefetch: fetched and imported ahead, taken once - a take without one fetches", "[kv_pool]") {
  CountingFetch c;
  std::promise<void> open;
  c.gate = open.get_future().share();
  PoolPrefetch p(c.Fetch());
  p.Start(c.Prepare());
  p.Start(c.Prepare());  // one in flight: nothing more
  // The take waits for the prefetch in flight, and gets its fds.
  auto taken = std::async(std::launch::async, [&] {
    bool ahead = false;
    auto fds = p.Take(&ahead);
    return std::make_pair(ahead, fds.ok() && fds->size() == 1 && fds->at(0).at(0).valid());
  });
  CHECK(taken.wait_for(std::chrono::milliseconds(50)) == std::future_status::timeout);
  open.set_value();
  auto [ahead, good] = taken.get();
  CHECK(ahead);
  CHECK(good);
  CHECK(c.fetches == 1);
  CHECK(c.prepares == 1);
  // Taken once: the next take fetches.
  bool again = true;
  REQUIRE(p.Take(&again).ok());
  CHECK_FALSE(again);
  CHECK(c.fetches == 2);
}

TEST_CASE("pool prefetch: a discard drops what was prepared, and one in flight ends unprepared", "[kv_pool]") {
  CountingFetch c;
  PoolPrefetch p(c.Fetch());
  p.Start(c.Prepare());
  REQUIRE(test::WaitFor([&] { return c.prepares.load() == 1; }, std::chrono::seconds(10)));
  p.Start(c.Prepare());  // kept already: nothing more
  p.Discard(c.Drop());
  CHECK(c.drops == 1);
  bool ahead = true;
  REQUIRE(p.Take(&ahead).ok());
  CHECK_FALSE(ahead);
  CHECK(c.fetches == 2);

  // Discarded while its fetch waits: it finishes without preparing.
  std::promise<void> open;
  c.gate = open.get_future().share();
  p.Start(c.Prepare());
  REQUIRE(test::WaitFor([&] { return c.fetches.load() == 3; }, std::chrono::seconds(10)));
  p.Discard(c.Drop());
  open.set_value();
  REQUIRE(p.Take(&ahead).ok());  // waits for the prefetch, then fetches
  CHECK_FALSE(ahead);
  CHECK(c.prepares == 1);
  CHECK(c.fetches == 4);
}

TEST_CASE("pool prefetch: an import that fails keeps nothing - the take fetches", "[kv_pool]") {
  CountingFetch c;
  PoolPrefetch p(c.Fetch());
  p.Start(c.Prepare(Unavailable("the device is busy")));
  bool ahead = true;
  REQUIRE(p.Take(&ahead).ok());
  CHECK_FALSE(ahead);
  CHECK(c.prepares == 1);
  CHECK(c.fetches == 2);
}

}  // namespace

TEST_CASE("scheduler over a pool: the KV journal describes each running sequence and frees it at its end",
          "[kv_pool][kv_journal]") {
  REQUIRE(test::HaveTestData("llama-tiny-f32"));
  auto runner = TinyRunner();
  REQUIRE(runner->AllocatePooledKv({{1 << 20}}, 4 * kBlock, 16).ok());
  Outcomes out;
  SchedulerOptions so;
  so.max_batch = 8;
  Scheduler sched(runner.get(), so, out.Sink());
  const KvJournalGeometry g = [&] {
    KvJournalGeometry x;
    x.block_bytes = kBlock;
    x.block_size = 16;
    x.pool_blocks = 32;
    x.entries = 8;
    x.max_pages = 32;  // the model's 512 positions
    return x;
  }();
  REQUIRE(g.journal_blocks() == 1);

  // What an engine before this one left: one sequence. It is read (and
  // counted) when the pool opens, then a fresh journal replaces it.
  TestPool pool;
  {
    std::vector<uint8_t> old(g.bytes());
    auto w = KvJournalWriter::Create(old.data(), g);
    REQUIRE(w.ok());
    REQUIRE(w->Put("dead-engine-seq", 42, 20, {5, 6}).ok());
    REQUIRE(::pwrite(pool.fd.get(), old.data(), old.size(), 0) == static_cast<ssize_t>(old.size()));
  }
  sched.Start();
  Done opened;
  sched.OpenPool(pool.Fetch(), opened.Fn());
  REQUIRE(test::WaitFor([&] { return opened.called.load(); }, std::chrono::seconds(10)));
  REQUIRE(opened.st.ok());
  REQUIRE(test::WaitFor([&] { return sched.stats().journal; }, std::chrono::seconds(10)));
  CHECK(sched.stats().journal_found == 1);
  auto read_pool = [&] {
    std::vector<uint8_t> bytes(g.bytes());
    REQUIRE(::pread(pool.fd.get(), bytes.data(), bytes.size(), 0) == static_cast<ssize_t>(bytes.size()));
    return KvJournalReader::Read(bytes.data(), bytes.size(), g);
  };
  {
    auto fresh = read_pool();
    CHECK(fresh.header_ok());
    CHECK(fresh.entries().empty());
  }

  // A long generation with a request id: while it runs, the journal in the
  // pool names it, and what it names is the request's own tokens.
  GenRequest r = Req(1, 300);
  r.request_id = "front-req-0001";
  const std::vector<int32_t> prompt = r.prompt;
  REQUIRE(sched.Submit(r).ok());
  GenRequest anon = Req(2, 300);  // no request id: not journaled
  REQUIRE(sched.Submit(anon).ok());
  REQUIRE(test::WaitFor([&] { return out.Tokens(1).size() >= 40; }, std::chrono::seconds(60)));
  KvJournalReader mid = read_pool();
  REQUIRE(mid.header_ok());
  CHECK(mid.dropped().empty());
  REQUIRE(mid.entries().size() == 1);
  const KvJournalEntry e = mid.entries().begin()->second;
  CHECK(e.request_id == "front-req-0001");
  CHECK(e.count >= prompt.size() + 39);
  CHECK(e.pages.size() == (e.count + 15) / 16);
  for (uint32_t p : e.pages) {
    CHECK(p >= g.first_block());
    CHECK(p < g.pool_blocks);
  }
  CHECK(sched.stats().journal_entries == 1);
  REQUIRE(test::WaitFor([&] { return out.Done(1) && out.Done(2); }, std::chrono::seconds(120)));
  // Its tokens (prompt, then generated) hash as the entry says: a promoted
  // engine resuming this stream would adopt it.
  std::vector<int32_t> all = prompt;
  const auto gen = out.Tokens(1);
  all.insert(all.end(), gen.begin(), gen.end());
  KvJournalMiss why{};
  KvJournalReader other = mid;
  std::vector<int32_t> changed = all;
  changed[3] ^= 1;  // a resume of other tokens would not
  CHECK_FALSE(other.Take("front-req-0001", changed, &why).ok());
  CHECK(why == KvJournalMiss::kHashMismatch);
  INFO("entry count " << e.count << ", tokens " << all.size());
  CHECK(mid.Take("front-req-0001", all, &why).ok());
  CHECK(read_pool().entries().empty());  // ended: freed
  CHECK(sched.stats().journal_entries == 0);
  CHECK(sched.stats().journal_errors == 0);
  CHECK(sched.stats().journal_writes > 40);
}

// ---- Adoption: streams cut by a crash resume from the dead engine's KV ----

namespace {

// A prompt of n tokens (the tiny model's vocabulary is 256 bytes).
std::vector<int32_t> LongPrompt(size_t n, int salt) {
  std::vector<int32_t> p(n);
  for (size_t i = 0; i < n; ++i)
    p[i] = static_cast<int32_t>((i * 31 + static_cast<size_t>(salt) * 7 + 5) % 256);
  return p;
}

constexpr int kCutTokens = 48;
constexpr uint64_t kAdoptPool = 4 << 20;  // 128 blocks of 16 positions

struct CutStream {
  std::string id;
  std::vector<int32_t> prompt;
  std::vector<int32_t> want;       // an uninterrupted run's tokens
  std::vector<int32_t> delivered;  // what the client had when the engine died
};

// The streams, each with its tokens from a private cache, uninterrupted.
std::vector<CutStream> Uninterrupted(std::vector<CutStream> streams) {
  auto runner = TinyRunner();
  REQUIRE(runner->AllocateKv(4 << 20, 16).ok());
  Outcomes out;
  SchedulerOptions so;
  so.max_batch = 8;
  Scheduler sched(runner.get(), so, out.Sink());
  sched.Start();
  for (size_t i = 0; i < streams.size(); ++i) {
    GenRequest g;
    g.id = i + 1;
    g.prompt = streams[i].prompt;
    g.max_tokens = kCutTokens;
    REQUIRE(sched.Submit(g).ok());
  }
  for (size_t i = 0; i < streams.size(); ++i) {
    REQUIRE(test::WaitFor([&] { return out.Done(i + 1); }, std::chrono::seconds(120)));
    streams[i].want = out.Tokens(i + 1);
    REQUIRE(streams[i].want.size() == kCutTokens);
  }
  return streams;
}

// An active engine on the pool runs the streams (paced: 10 ms a step) and
// "dies" once every stream has at least `min_tokens`: its scheduler stops
// after a whole step, and nothing writes the pool any more. Each stream's
// client got everything the engine produced, or only `short_of[i]` tokens
// when given (the engine had run ahead of the stream).
void RunAndDie(const TestPool& pool, std::vector<CutStream>* streams, size_t min_tokens,
               const std::map<size_t, size_t>& short_of = {}) {
  auto runner = TinyRunner();
  REQUIRE(runner->AllocatePooledKv({{kAdoptPool}}, 4 * kBlock, 16).ok());
  Outcomes out;
  SchedulerOptions so;
  so.max_batch = 8;
  so.min_step_ms = 10;
  Scheduler sched(runner.get(), so, out.Sink());
  sched.Start();
  Done opened;
  sched.OpenPool(pool.Fetch(), opened.Fn());
  REQUIRE(
      test::WaitFor([&] { return opened.called.load() && sched.stats().journal; }, std::chrono::seconds(10)));
  REQUIRE(opened.st.ok());
  for (size_t i = 0; i < streams->size(); ++i) {
    GenRequest g;
    g.id = i + 1;
    g.prompt = (*streams)[i].prompt;
    g.max_tokens = kCutTokens;
    g.request_id = (*streams)[i].id;
    REQUIRE(sched.Submit(g).ok());
  }
  REQUIRE(test::WaitFor(
      [&] {
        for (size_t i = 0; i < streams->size(); ++i) {
          if (out.Tokens(i + 1).size() < min_tokens) return false;
        }
        return true;
      },
      std::chrono::seconds(60)));
  sched.Stop();
  for (size_t i = 0; i < streams->size(); ++i) {
    auto got = out.Tokens(i + 1);
    REQUIRE(got.size() < kCutTokens);  // cut in the middle
    auto s = short_of.find(i);
    if (s != short_of.end()) got.resize(s->second);
    (*streams)[i].delivered = got;
  }
}

// The resumed request the front sends: the prompt and the streamed tokens,
// under the stream's id, for what remains.
GenRequest Resumed(uint64_t id, const CutStream& c) {
  GenRequest g;
  g.id = id;
  g.prompt = c.prompt;
  g.prompt.insert(g.prompt.end(), c.delivered.begin(), c.delivered.end());
  g.max_tokens = kCutTokens - static_cast<int>(c.delivered.size());
  g.request_id = c.id;
  g.resumed = true;
  return g;
}

// The promoted engine: its scheduler over the same pool, not opened yet.
struct Promoted {
  std::unique_ptr<ModelRunner> runner = TinyRunner();
  Outcomes out;
  std::unique_ptr<Scheduler> sched;
  explicit Promoted(SchedulerOptions so) {
    REQUIRE(runner->AllocatePooledKv({{kAdoptPool}}, 4 * kBlock, 16).ok());
    so.max_batch = 8;
    sched = std::make_unique<Scheduler>(runner.get(), so, out.Sink());
    sched->Start();
  }
  void Open(const TestPool& pool) {
    Done opened;
    sched->OpenPool(pool.Fetch(), opened.Fn());
    REQUIRE(test::WaitFor([&] { return opened.called.load(); }, std::chrono::seconds(10)));
    REQUIRE(opened.st.ok());
  }
  // The stream as its client sees it: what it had, then the continuation.
  std::vector<int32_t> Whole(uint64_t id, const CutStream& c) {
    REQUIRE(test::WaitFor([&] { return out.Done(id); }, std::chrono::seconds(120)));
    std::vector<int32_t> all = c.delivered;
    auto more = out.Tokens(id);
    all.insert(all.end(), more.begin(), more.end());
    return all;
  }
};

TEST_CASE(
    "scheduler over a pool: streams cut by a crash adopt the dead engine's KV and go on token for token",
    "[kv_pool][kv_journal]") {
  REQUIRE(test::HaveTestData("llama-tiny-f32"));
  std::vector<CutStream> streams = Uninterrupted({{"cut-long", LongPrompt(400, 1)},
                                                  {"cut-behind", LongPrompt(150, 2)},
                                                  {"cut-short", LongPrompt(20, 3)},
                                                  {"nobody-resumes", LongPrompt(100, 4)}});
  TestPool pool(kAdoptPool);
  // "cut-behind"'s client had 8 tokens when the engine had 20 or more.
  RunAndDie(pool, &streams, 20, {{1, 8}});

  SchedulerOptions so;
  so.adopt_wait_ms = 60'000;  // the test opens the pool when it wants
  so.adopt_keep_ms = 5'000;
  Promoted b(so);
  // Resumed before the pool is here: held, not computed from the scratch.
  for (uint64_t i = 0; i < 3; ++i) REQUIRE(b.sched->Submit(Resumed(i + 1, streams[i])).ok());
  REQUIRE(test::WaitFor([&] { return b.sched->stats().resume_held == 3; }, std::chrono::seconds(10)));
  CHECK(b.sched->stats().waiting == 3);
  CHECK(b.out.Tokens(1).empty());
  // A request that is not a resume is served at once from the scratch.
  REQUIRE(b.sched->Submit(Req(9, 4)).ok());
  REQUIRE(test::WaitFor([&] { return b.out.Done(9); }, std::chrono::seconds(60)));
  CHECK(b.sched->stats().resume_held == 3);

  b.Open(pool);
  // The pool's first step boundary reads the journal and admits the held
  // resumes at once: what stays kept is the stream nobody resumed.
  REQUIRE(test::WaitFor([&] { return b.sched->stats().journal; }, std::chrono::seconds(10)));
  const int unclaimed = b.sched->stats().adoptable_blocks;
  CHECK(unclaimed >= 8);  // 100 + 19 or more positions
  for (uint64_t i = 0; i < 3; ++i) {
    INFO("stream " << streams[i].id << ", delivered " << streams[i].delivered.size());
    CHECK(b.Whole(i + 1, streams[i]) == streams[i].want);
  }
  SchedulerStats st = b.sched->stats();
  CHECK(st.adopted_sequences == 3);
  // Every position but the last of each resumed request, except the one
  // behind its engine: whole pages of its 150 + 8 tokens (144 positions).
  const size_t full = (400 + streams[0].delivered.size() - 1) + (20 + streams[2].delivered.size() - 1);
  CHECK(st.adopted_tokens == full + 144);
  CHECK(st.adopted_by_page == 1);
  CHECK(st.recomputed_sequences == 0);
  CHECK(st.resume_held == 0);
  CHECK(st.resume_held_total == 3);
  // The stream nobody resumed keeps its pages until the bound, then they are free.
  CHECK(st.journal_found == 4);
  REQUIRE(test::WaitFor([&] { return b.sched->stats().adoptable_blocks == 0; }, std::chrono::seconds(30)));
  CHECK(b.sched->stats().released_blocks == static_cast<uint64_t>(unclaimed));
  CHECK(b.sched->stats().pool_blocks_in_use == 0);
  CHECK(b.sched->stats().free_blocks == b.sched->stats().total_blocks);
}

TEST_CASE("scheduler over a pool: a damaged journal is computed in full, identical, each for its reason",
          "[kv_pool][kv_journal]") {
  REQUIRE(test::HaveTestData("llama-tiny-f32"));
  std::vector<CutStream> streams = Uninterrupted({{"wrong-hash", LongPrompt(120, 5)},
                                                  {"page-out-of-range", LongPrompt(120, 6)},
                                                  {"torn", LongPrompt(120, 7)},
                                                  {"intact", LongPrompt(120, 8)}});
  TestPool pool(kAdoptPool);
  RunAndDie(pool, &streams, 8);

  // The dead engine's journal, damaged three ways: each entry rewritten
  // whole (a valid checksum) with a wrong hash, or with a page past the
  // pool, and one left half-written (an odd seq).
  std::vector<uint8_t> bytes(kAdoptPool);
  REQUIRE(::pread(pool.fd.get(), bytes.data(), bytes.size(), 0) == static_cast<ssize_t>(bytes.size()));
  auto g = KvJournalGeometry::FromHeader(bytes.data(), bytes.size());
  REQUIRE(g.ok());
  KvJournalReader r = KvJournalReader::Read(bytes.data(), bytes.size(), *g);
  REQUIRE(r.entries().size() == 4);
  auto w = KvJournalWriter::Create(bytes.data(), *g);
  REQUIRE(w.ok());
  for (const auto& c : streams) {
    KvJournalEntry e = r.entries().at(c.id);
    if (c.id == "wrong-hash") e.token_hash ^= 1;
    if (c.id == "page-out-of-range") e.pages.back() = g->pool_blocks;
    REQUIRE(w->Put(c.id, e.token_hash, e.count, e.pages, e.chain).ok());
  }
  const size_t torn_seq = kKvJournalHeaderBytes + g->entry_bytes() * 2;  // the third Put's slot
  bytes[torn_seq] |= 1;
  REQUIRE(::pwrite(pool.fd.get(), bytes.data(), g->bytes(), 0) == static_cast<ssize_t>(g->bytes()));

  SchedulerOptions so;
  so.adopt_wait_ms = 60'000;
  Promoted b(so);
  b.Open(pool);
  for (uint64_t i = 0; i < streams.size(); ++i) REQUIRE(b.sched->Submit(Resumed(i + 1, streams[i])).ok());
  // And a resume the journal never heard of.
  CutStream stranger = Uninterrupted({{"stranger", LongPrompt(30, 9)}})[0];
  stranger.delivered.assign(stranger.want.begin(), stranger.want.begin() + 5);
  REQUIRE(b.sched->Submit(Resumed(10, stranger)).ok());
  for (uint64_t i = 0; i < streams.size(); ++i) {
    INFO("stream " << streams[i].id);
    CHECK(b.Whole(i + 1, streams[i]) == streams[i].want);
  }
  CHECK(b.Whole(10, stranger) == stranger.want);
  SchedulerStats st = b.sched->stats();
  CHECK(st.adopted_sequences == 1);
  CHECK(st.recomputed_sequences == 4);
  CHECK(st.recomputed_reasons ==
        std::map<std::string, uint64_t>{
            {"hash_mismatch", 1}, {"page_out_of_range", 1}, {"torn", 1}, {"missing", 1}});
  // Refused entries' pages went back at once (the torn one's were never
  // trusted); only the adopted one's were used.
  CHECK(st.adoptable_blocks == 0);
  CHECK(st.pool_blocks_in_use == 0);
}

TEST_CASE("scheduler over a pool: a resume whose pool never comes runs from the scratch after the bound",
          "[kv_pool][kv_journal]") {
  REQUIRE(test::HaveTestData("llama-tiny-f32"));
  // 12 + 48 positions: the scratch holds them.
  std::vector<CutStream> streams = Uninterrupted({{"no-pool", LongPrompt(12, 11)}});
  streams[0].delivered.assign(streams[0].want.begin(), streams[0].want.begin() + 8);
  SchedulerOptions so;
  so.adopt_wait_ms = 200;
  Promoted b(so);
  REQUIRE(b.sched->Submit(Resumed(1, streams[0])).ok());
  CHECK(b.Whole(1, streams[0]) == streams[0].want);
  SchedulerStats st = b.sched->stats();
  CHECK(st.resume_held_total == 1);
  CHECK(st.resume_held_max_ms >= 200);
  CHECK(st.recomputed_reasons == std::map<std::string, uint64_t>{{"pool_not_granted", 1}});
  // With holding off, a resume is not held at all.
  SchedulerOptions off;
  off.adopt_wait_ms = 0;
  Promoted c(off);
  REQUIRE(c.sched->Submit(Resumed(1, streams[0])).ok());
  CHECK(c.Whole(1, streams[0]) == streams[0].want);
  CHECK(c.sched->stats().resume_held_total == 0);
}

}  // namespace
