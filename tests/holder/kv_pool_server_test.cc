// The node's KV pool against a real wsup-holder (holder/kv_pool.h): made at
// start with --kv-pool-mib, served to any asker as writable fds of the same
// memory, reported by `info` and `wsup cache info`, and adopted by a holder
// restarted from the kept fds (--adopt-kv-pool) under the same id with the
// same bytes. A kept pool whose record is bad or disagrees with its fds is
// logged, its fds closed, and a fresh pool made: the holder still serves.
// The [gpu] case runs the same on the cuda backend and is skipped with a
// message where there is no GPU.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "client/client.h"
#include "client/kv_pool.h"
#include "client/wsup_client.h"
#include "common/fs.h"
#include "gpu/cuda_driver.h"
#include "supervisor/cache_commands.h"
#include "tests/gpu_skip.h"
#include "tests/holder/holder_fixture.h"
#include "wire/kv_journal.h"
#include "wire/kv_pool_record.h"

namespace wsup {
namespace {

using namespace std::chrono_literals;
using test::Has, test::HolderProcess, test::StartHolder, test::TempDir;

constexpr uint64_t kMiB = 1ull << 20;

std::vector<std::string> CheckpointArgs() { return {"--model", test::TestData("llama-tiny-f32")}; }

// Maps fd shared read-write, runs fn on the bytes, unmaps.
template <typename Fn>
void WithMapping(int fd, uint64_t size, Fn fn) {
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  REQUIRE(p != MAP_FAILED);
  fn(static_cast<uint8_t*>(p));
  REQUIRE(::munmap(p, size) == 0);
}

uint8_t Pattern(uint64_t i) { return static_cast<uint8_t>(i * 7 + 3); }

void WritePattern(int fd, uint64_t size) {
  WithMapping(fd, size, [&](uint8_t* b) {
    for (uint64_t i = 0; i < size; i += 4093) b[i] = Pattern(i);
    b[size - 1] = 0xab;
  });
}

bool HasPattern(int fd, uint64_t size) {
  bool ok = true;
  WithMapping(fd, size, [&](uint8_t* b) {
    for (uint64_t i = 0; i < size; i += 4093) ok = ok && b[i] == Pattern(i);
    ok = ok && b[size - 1] == 0xab;
  });
  return ok;
}

Result<KvPoolFds> Fetch(const HolderProcess& h) { return FetchKvPool(h.socket, 5000); }

// The holder holds an fd of the same file as `fd` (a kept fd it did not
// close). By file, not by number: a closed number is soon taken again.
bool HolderHolds(const HolderProcess& h, int fd) {
  struct stat want {};
  REQUIRE(::fstat(fd, &want) == 0);
  const std::string dir = "/proc/" + std::to_string(h.child.pid()) + "/fd";
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    struct stat st {};
    if (::stat(e.path().c_str(), &st) == 0 && st.st_dev == want.st_dev && st.st_ino == want.st_ino)
      return true;
  }
  return false;
}

UniqueFd Memfd(uint64_t size, int seals) {
  UniqueFd fd(::memfd_create("test-kv", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  REQUIRE(fd.valid());
  REQUIRE(::ftruncate(fd.get(), static_cast<off_t>(size)) == 0);
  REQUIRE(::fcntl(fd.get(), F_ADD_SEALS, seals) == 0);
  return fd;
}

void KillAndWait(HolderProcess& h) {
  h.child.Kill(SIGKILL);
  REQUIRE(h.child.Wait(10s) != -1);
}

TEST_CASE("a holder with --kv-pool-mib serves one writable memfd, the same memory to every asker",
          "[holder][kv]") {
  TempDir dir;
  std::vector<std::string> args = CheckpointArgs();
  args.insert(args.end(), {"--kv-pool-mib", "4"});
  HolderProcess h = StartHolder(dir, "h", args);
  REQUIRE(h.WaitReady());

  auto p1 = Fetch(h);
  REQUIRE(p1.ok());
  CHECK(p1->pool.id.size() == 32);
  CHECK(p1->pool.id.find_first_not_of("0123456789abcdef") == std::string::npos);
  CHECK(p1->pool.backend == "host");
  CHECK(p1->pool.device == -1);
  REQUIRE(p1->pool.allocations == std::vector<uint64_t>{4 * kMiB});
  REQUIRE(p1->fds.size() == 1);
  WritePattern(p1->fds[0].get(), 4 * kMiB);

  // A second asker gets the same pool: the bytes written through the first.
  auto p2 = Fetch(h);
  REQUIRE(p2.ok());
  CHECK(p2->pool.id == p1->pool.id);
  REQUIRE(p2->fds.size() == 1);
  CHECK(HasPattern(p2->fds[0].get(), 4 * kMiB));
  struct stat a {
  }, b{};
  REQUIRE(::fstat(p1->fds[0].get(), &a) == 0);
  REQUIRE(::fstat(p2->fds[0].get(), &b) == 0);
  CHECK(a.st_ino == b.st_ino);
  // Every page is allocated at the start (a pool the machine cannot hold
  // fails the start, not an engine later).
  CHECK(static_cast<uint64_t>(a.st_blocks) * 512 >= 4 * kMiB);

  auto info = QueryHolderInfo(h.socket, 5000);
  REQUIRE(info.ok());
  REQUIRE(info->kv_pool.has_value());
  CHECK(info->kv_pool->id == p1->pool.id);
  CHECK(info->kv_pool->bytes == 4 * kMiB);
  CHECK(info->kv_pool->allocations == 1);
  CHECK_FALSE(info->kv_pool->adopted);

  CommandOutput text = CacheInfoCommand(h.socket, false);
  CHECK(text.exit_code == 0);
  CHECK(Has(text.out, "kv pool      " + p1->pool.id + ", 4194304 bytes (4.0 MiB) in 1 allocations"));
  CommandOutput js = CacheInfoCommand(h.socket, true);
  REQUIRE(js.exit_code == 0);
  auto j = nlohmann::json::parse(js.out);
  CHECK(j["kv_pool"]["id"] == p1->pool.id);
  CHECK(j["kv_pool"]["bytes"] == 4 * kMiB);
  CHECK(j["kv_pool"]["allocations"] == 1);

  // One line at start with its id and size.
  CHECK(Has(h.Log(),
            "KV pool " + p1->pool.id + ": 4194304 bytes (4 MiB) in 1 allocations in host memory: made"));
}

TEST_CASE("a holder without a pool answers kv_pool with not_found naming the flag", "[holder][kv]") {
  TempDir dir;
  HolderProcess h = StartHolder(dir, "h", CheckpointArgs());
  REQUIRE(h.WaitReady());
  auto p = Fetch(h);
  REQUIRE_FALSE(p.ok());
  CHECK(p.error().code() == Code::kNotFound);
  CHECK(Has(p.error().message(), "--kv-pool-mib"));
  CHECK(Has(p.error().message(), "[kv] pool_mib"));
  auto info = QueryHolderInfo(h.socket, 5000);
  REQUIRE(info.ok());
  CHECK_FALSE(info->kv_pool.has_value());
  CHECK(Has(CacheInfoCommand(h.socket, false).out, "kv pool      none"));

  // An unknown request names kv_pool among those the holder knows.
  auto ch = Channel::Connect(h.socket, 5000);
  REQUIRE(ch.ok());
  auto reply = ch->Call({{"type", "kv_pools"}}, 5000);
  REQUIRE(reply.ok());
  REQUIRE(reply->type() == "error");
  CHECK(Has(reply->msg.value("message", ""), "kv_pool"));
}

TEST_CASE("the C ABI fetches the pool for an engine of another language, and names what went wrong",
          "[holder][kv][capi]") {
  TempDir dir;
  std::vector<std::string> args = CheckpointArgs();
  args.insert(args.end(), {"--kv-pool-mib", "4"});
  HolderProcess h = StartHolder(dir, "h", args);
  REQUIRE(h.WaitReady());
  wsup_kv_pool* p = wsup_kv_pool_fetch(h.socket.c_str(), 5000);
  REQUIRE(p != nullptr);
  INFO(wsup_kv_pool_error(p));
  REQUIRE(wsup_kv_pool_status(p) == WSUP_OK);
  CHECK(std::string(wsup_kv_pool_error(p)).empty());
  auto j = nlohmann::json::parse(wsup_kv_pool_json(p));
  CHECK(j["backend"] == "host");
  CHECK(j["id"].get<std::string>().size() == 32);
  CHECK(j["allocations"] == nlohmann::json::array({4 * kMiB}));
  REQUIRE(wsup_kv_pool_allocations(p) == 1);
  CHECK(wsup_kv_pool_allocation_bytes(p, 0) == 4 * kMiB);
  CHECK(wsup_kv_pool_fd(p, 1) == -1);
  CHECK(wsup_kv_pool_allocation_bytes(p, 1) == 0);
  // The same memory as the C++ client's, and it outlives the handle in a dup.
  UniqueFd kept(::dup(wsup_kv_pool_fd(p, 0)));
  REQUIRE(kept.valid());
  WritePattern(kept.get(), 4 * kMiB);
  wsup_kv_pool_release(p);
  auto again = Fetch(h);
  REQUIRE(again.ok());
  CHECK(again->pool.id == j["id"]);
  CHECK(HasPattern(again->fds[0].get(), 4 * kMiB));

  // The journal's token hash, as the engines compute it.
  const int32_t ids[] = {1, 2, 300, -4};
  CHECK(wsup_kv_token_hash(ids, 4, WSUP_KV_TOKEN_HASH_SEED) == TokenHash(ids, 4));
  CHECK(wsup_kv_token_hash(ids + 2, 2, wsup_kv_token_hash(ids, 2, WSUP_KV_TOKEN_HASH_SEED)) == TokenHash(ids, 4));

  // Bad input: an error code and a message naming the fix, never a crash.
  wsup_kv_pool* bad = wsup_kv_pool_fetch(nullptr, 5000);
  CHECK(wsup_kv_pool_status(bad) == WSUP_ERR_INVALID_ARGUMENT);
  CHECK(Has(wsup_kv_pool_error(bad), "socket path"));
  CHECK(wsup_kv_pool_allocations(bad) == 0);
  CHECK(std::string(wsup_kv_pool_json(bad)) == "{}");
  wsup_kv_pool_release(bad);
  bad = wsup_kv_pool_fetch(h.socket.c_str(), 0);
  CHECK(wsup_kv_pool_status(bad) == WSUP_ERR_INVALID_ARGUMENT);
  wsup_kv_pool_release(bad);
  const std::string nowhere = dir.Join("no-holder.sock");
  bad = wsup_kv_pool_fetch(nowhere.c_str(), 500);
  CHECK(wsup_kv_pool_status(bad) != WSUP_OK);
  CHECK(Has(wsup_kv_pool_error(bad), nowhere));
  wsup_kv_pool_release(bad);
  wsup_kv_pool_release(nullptr);
  CHECK(wsup_kv_pool_status(nullptr) == WSUP_ERR_INVALID_ARGUMENT);

  // A holder without a pool: not found, naming the flag.
  TempDir dir2;
  HolderProcess none = StartHolder(dir2, "h", CheckpointArgs());
  REQUIRE(none.WaitReady());
  bad = wsup_kv_pool_fetch(none.socket.c_str(), 5000);
  CHECK(wsup_kv_pool_status(bad) == WSUP_ERR_NOT_FOUND);
  CHECK(Has(wsup_kv_pool_error(bad), "--kv-pool-mib"));
  wsup_kv_pool_release(bad);
}

TEST_CASE("a holder of engine-made layouts makes and serves the pool too", "[holder][kv]") {
  TempDir dir;
  HolderProcess h = StartHolder(dir, "h", {"--layout", "engine", "--kv-pool-mib", "2"});
  REQUIRE(h.WaitReady());
  auto p = Fetch(h);
  REQUIRE(p.ok());
  CHECK(p->pool.allocations == std::vector<uint64_t>{2 * kMiB});
  WritePattern(p->fds[0].get(), 2 * kMiB);
  auto info = QueryHolderInfo(h.socket, 5000);
  REQUIRE(info.ok());
  CHECK(info->layout == "engine");
  REQUIRE(info->kv_pool.has_value());
  CHECK(info->kv_pool->id == p->pool.id);
}

TEST_CASE("holder: --kv-pool-mib out of range is a usage error naming the flag", "[holder][kv]") {
  TempDir dir;
  for (const char* mib : {"-1", "16777217"}) {
    auto r = test::Run({test::BinPath("wsup-holder"), "--socket", dir.Join("h.sock"), "--layout", "engine",
                        "--kv-pool-mib", mib},
                       30s);
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK(Has(r.output, "--kv-pool-mib"));
  }
}

TEST_CASE("a holder restarted from the kept fds serves the same pool: same id, same bytes", "[holder][kv]") {
  TempDir dir;
  std::vector<std::string> args = CheckpointArgs();
  args.insert(args.end(), {"--kv-pool-mib", "4"});
  HolderProcess h1 = StartHolder(dir, "h1", args);
  REQUIRE(h1.WaitReady());
  auto kept = Fetch(h1);
  REQUIRE(kept.ok());
  WritePattern(kept->fds[0].get(), 4 * kMiB);
  KillAndWait(h1);  // the test keeps the fds, as the supervisor does

  std::string record = dir.Join("holder-0.kvpool.json");
  REQUIRE(WriteKvPoolRecord(record, KvPoolRecord{kept->pool, {3}}).ok());
  args.insert(args.end(), {"--adopt-kv-pool", record});
  HolderProcess h2 = StartHolder(dir, "h2", args, {kept->fds[0].get()});
  REQUIRE(h2.WaitReady());
  INFO(h2.Log());
  auto again = Fetch(h2);
  REQUIRE(again.ok());
  CHECK(again->pool.id == kept->pool.id);
  CHECK(again->pool.allocations == kept->pool.allocations);
  CHECK(HasPattern(again->fds[0].get(), 4 * kMiB));
  auto info = QueryHolderInfo(h2.socket, 5000);
  REQUIRE(info.ok());
  REQUIRE(info->kv_pool.has_value());
  CHECK(info->kv_pool->adopted);
  CHECK(Has(h2.Log(), "KV pool " + kept->pool.id));
  CHECK(Has(h2.Log(), "adopted from kept fds"));

  SECTION("another --kv-pool-mib: the kept pool is adopted as it is, and the difference logged") {
    KillAndWait(h2);
    HolderProcess h3 =
        StartHolder(dir, "h3", {"--layout", "engine", "--kv-pool-mib", "8", "--adopt-kv-pool", record},
                    {kept->fds[0].get()});
    REQUIRE(h3.WaitReady());
    auto p = Fetch(h3);
    REQUIRE(p.ok());
    CHECK(p->pool.id == kept->pool.id);
    CHECK(p->pool.bytes() == 4 * kMiB);
    CHECK(HasPattern(p->fds[0].get(), 4 * kMiB));
    CHECK(Has(h3.Log(), "--kv-pool-mib 8 asks for 8388608"));
  }
}

TEST_CASE(
    "a kept pool whose record is bad or disagrees with its fds is logged, closed and replaced by a new one",
    "[holder][kv]") {
  TempDir dir;
  HolderProcess h1 = StartHolder(dir, "h1", {"--layout", "engine", "--kv-pool-mib", "4"});
  REQUIRE(h1.WaitReady());
  auto kept = Fetch(h1);
  REQUIRE(kept.ok());
  KillAndWait(h1);
  const std::string record = dir.Join("holder-0.kvpool.json");

  struct Case {
    std::string name;
    std::string says;          // in the holder's log
    std::vector<int> inherit;  // become fds 3, 4, ...
    bool closes = true;        // the fds it named are closed in the holder
  };
  int pipe_fds[2];
  REQUIRE(::pipe2(pipe_fds, O_CLOEXEC) == 0);
  UniqueFd pipe_rd(pipe_fds[0]), pipe_wr(pipe_fds[1]);
  UniqueFd sealed = Memfd(4 * kMiB, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE);
  UniqueFd small = Memfd(2 * kMiB, F_SEAL_SHRINK | F_SEAL_GROW);
  UniqueFd other = Memfd(4 * kMiB, F_SEAL_SHRINK | F_SEAL_GROW);
  const int pool_fd = kept->fds[0].get();

  std::vector<Case> cases;
  SECTION("wrong fd count") {
    auto j = KvPoolRecordToJson(KvPoolRecord{kept->pool, {3}});
    j["fds"] = {3, 4};
    REQUIRE(WriteFileAtomic(record, j.dump(), 0600).ok());
    cases.push_back({"wrong fd count", "names 2 fds for 1 allocations", {pool_fd, other.get()}});
  }
  SECTION("an fd that is not a memfd") {
    REQUIRE(WriteKvPoolRecord(record, KvPoolRecord{kept->pool, {3}}).ok());
    cases.push_back({"a pipe", "is not a memfd", {pipe_rd.get()}});
  }
  SECTION("a write-sealed memfd") {
    REQUIRE(WriteKvPoolRecord(record, KvPoolRecord{kept->pool, {3}}).ok());
    cases.push_back({"sealed", "sealed against writing", {sealed.get()}});
  }
  SECTION("a memfd of another size") {
    REQUIRE(WriteKvPoolRecord(record, KvPoolRecord{kept->pool, {3}}).ok());
    cases.push_back({"small", "holds 2097152 bytes", {small.get()}});
  }
  SECTION("garbage JSON") {
    REQUIRE(WriteFileAtomic(record, "{\"format\": \"wsup-kv-pool-record\", \"fds\": [3", 0600).ok());
    // Unreadable, it names no fds: the inherited one stays open, unused.
    cases.push_back({"garbage", "holder-0.kvpool.json", {pool_fd}, false});
  }
  SECTION("a missing file") {
    std::filesystem::remove(record);
    cases.push_back({"missing", "holder-0.kvpool.json: cannot open", {}, false});
  }
  for (const Case& c : cases) {
    INFO(c.name);
    HolderProcess h =
        StartHolder(dir, "h-" + c.name,
                    {"--layout", "engine", "--kv-pool-mib", "4", "--adopt-kv-pool", record}, c.inherit);
    REQUIRE(h.WaitReady());
    std::string log = h.Log();
    INFO(log);
    CHECK(Has(log, "--adopt-kv-pool: " + record));
    CHECK(Has(log, c.says));
    CHECK(Has(log, "not adopted and its fds are closed: a new pool is made"));
    auto fresh = Fetch(h);
    REQUIRE(fresh.ok());
    CHECK(fresh->pool.id != kept->pool.id);
    CHECK(fresh->pool.bytes() == 4 * kMiB);
    auto info = QueryHolderInfo(h.socket, 5000);
    REQUIRE(info.ok());
    REQUIRE(info->kv_pool.has_value());
    CHECK_FALSE(info->kv_pool->adopted);
    for (int fd : c.inherit) CHECK(HolderHolds(h, fd) == !c.closes);
  }

  SECTION("without --kv-pool-mib a refused pool leaves the holder without one") {
    REQUIRE(WriteKvPoolRecord(record, KvPoolRecord{kept->pool, {3}}).ok());
    HolderProcess h =
        StartHolder(dir, "h-none", {"--layout", "engine", "--adopt-kv-pool", record}, {sealed.get()});
    REQUIRE(h.WaitReady());
    CHECK(Has(h.Log(), "without --kv-pool-mib this holder serves no pool"));
    auto p = Fetch(h);
    REQUIRE_FALSE(p.ok());
    CHECK(p.error().code() == Code::kNotFound);
  }
}

TEST_CASE("a cuda holder makes the pool on its GPU, and a restarted one adopts it under the same id",
          "[holder][kv][gpu]") {
  WSUP_GPU_SKIP_IF(test::NoGpuReason(), "holder_kv_pool_test");
  TempDir dir;
  std::vector<std::string> args = {"--layout", "engine", "--backend",     "cuda",
                                   "--device", "0",      "--kv-pool-mib", "64"};
  HolderProcess h1 = StartHolder(dir, "h1", args);
  REQUIRE(h1.WaitReady());
  INFO(h1.Log());
  auto kept = Fetch(h1);
  REQUIRE(kept.ok());
  CHECK(kept->pool.backend == "cuda");
  CHECK(kept->pool.device == 0);
  CHECK(kept->pool.bytes() >= 64 * kMiB);
  KillAndWait(h1);

  std::string record = dir.Join("holder-0.kvpool.json");
  std::vector<int> numbers, inherit;
  for (size_t i = 0; i < kept->fds.size(); ++i) {
    numbers.push_back(3 + static_cast<int>(i));
    inherit.push_back(kept->fds[i].get());
  }
  REQUIRE(WriteKvPoolRecord(record, KvPoolRecord{kept->pool, numbers}).ok());
  args.insert(args.end(), {"--adopt-kv-pool", record});
  HolderProcess h2 = StartHolder(dir, "h2", args, inherit);
  REQUIRE(h2.WaitReady());
  INFO(h2.Log());
  auto again = Fetch(h2);
  REQUIRE(again.ok());
  CHECK(again->pool.id == kept->pool.id);
  CHECK(again->pool.allocations == kept->pool.allocations);

  // A host memfd is no VMM memory: refused, and a new pool made.
  KillAndWait(h2);
  UniqueFd not_vmm = Memfd(kept->pool.allocations[0], F_SEAL_SHRINK | F_SEAL_GROW);
  std::vector<int> wrong = inherit;
  wrong[0] = not_vmm.get();
  HolderProcess h3 = StartHolder(dir, "h3", args, wrong);
  REQUIRE(h3.WaitReady());
  auto fresh = Fetch(h3);
  REQUIRE(fresh.ok());
  CHECK(fresh->pool.id != kept->pool.id);
  CHECK(Has(h3.Log(), "not adopted and its fds are closed"));
}

}  // namespace
}  // namespace wsup
