// Engine-made layouts with real processes (holder --layout engine, engines
// --layout engine): four engines started at once on an empty holder (one
// publishes, three attach, all serve the goldens); another revision
// publishes its own layout; a writer SIGKILLed mid-publish leaves nothing
// committed, its memory released, and the next engine publishes.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include "client/client.h"
#include "tests/engine/engine_fixture.h"

using namespace std::chrono_literals;
using nlohmann::json;
using wsup::test::Proc;
using wsup::test::TempDir;

namespace {

const char* kModel = "llama-tiny-f32";

// An engine started without waiting for it: its ready fd is read later, so
// several can start at once.
struct Launched {
  Proc proc;
  int ready_read = -1;
  ~Launched() {
    if (ready_read >= 0) ::close(ready_read);
  }
};

std::unique_ptr<Launched> Launch(const TempDir& dir, const std::string& sock, const std::string& name,
                                 std::vector<std::string> extra = {},
                                 std::vector<std::pair<std::string, std::string>> env = {}) {
  std::vector<std::string> argv = {wsup::test::BinPath("wsup-engine"), "--model", wsup::test::TestData(kModel),
                                   "--port", "0", "--ready-fd", "3", "--kv-cache-mib", "4", "--threads", "1",
                                   "--log-level", "info", "--weight-cache", "daemon", "--socket", sock,
                                   "--layout", "engine"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) std::abort();
  auto l = std::make_unique<Launched>();
  l->proc.log = dir.Join(name + ".log");
  l->proc.child = wsup::test::Child::Start(argv, l->proc.log, {fds[1]}, env);
  ::close(fds[1]);
  l->ready_read = fds[0];
  return l;
}

bool AwaitReady(Launched& l, std::chrono::milliseconds limit = 120s) {
  auto line = wsup::test::ReadLine(l.ready_read, limit);
  ::close(l.ready_read);
  l.ready_read = -1;
  if (!line) return false;
  l.proc.ready = true;
  auto colon = line->rfind(':');
  if (colon != std::string::npos) l.proc.port = std::atoi(line->c_str() + colon + 1);
  return l.proc.port > 0;
}

Proc StartLayoutHolder(const TempDir& dir, const std::string& sock) {
  return wsup::test::StartWithReadyFd({wsup::test::BinPath("wsup-holder"), "--layout", "engine", "--socket", sock,
                                       "--backend", "host", "--ready-fd", "3", "--log-level", "info"},
                                      dir.Join("holder.log"));
}

wsup::InfoMsg HolderInfo(const std::string& sock) {
  auto info = wsup::QueryHolderInfo(sock, 5000);
  REQUIRE(info.ok());
  return *info;
}

}  // namespace

TEST_CASE("layouts: four engines at once on an empty holder - one publishes, three attach, all serve the goldens",
          "[engine][layout]") {
  TempDir dir;
  const std::string sock = dir.Join("h.sock");
  Proc holder = StartLayoutHolder(dir, sock);
  INFO(holder.Log());
  REQUIRE(holder.ready);
  std::vector<std::unique_ptr<Launched>> engines;
  for (int i = 0; i < 4; ++i) engines.push_back(Launch(dir, sock, "engine" + std::to_string(i)));
  int published = 0, attached = 0;
  for (auto& e : engines) {
    INFO(e->proc.Log());
    REQUIRE(AwaitReady(*e));
    json st = wsup::test::GetJson(e->proc.port, "/wsup/status");
    CHECK(st["weights"]["layout"] == "engine");
    std::string source = st["weights"]["source"];
    if (source == "published") ++published;
    if (source == "holder") ++attached;
    CHECK(wsup::test::AllOutputs(e->proc.port, kModel) == wsup::test::GoldenOutputs(kModel));
  }
  CHECK(published == 1);
  CHECK(attached == 3);
  wsup::InfoMsg info = HolderInfo(sock);
  REQUIRE(info.layouts.size() == 1);
  CHECK(info.layouts[0].state == "committed");
  CHECK(info.layouts[0].attaches == 4);
  CHECK(info.layouts[0].fingerprint.Get("transform") == "fuse_gate_up/v1");
  CHECK(info.layouts[0].fingerprint.Get("engine") == "wsup-engine");
  // The layout is the engine's own, not the checkpoint's: gate and up fused.
  auto inspect = wsup::test::Run({wsup::test::BinPath("wsup"), "cache", "info", "--socket", sock, "--json"}, 30s);
  INFO(inspect.output);
  REQUIRE(inspect.exit_code == 0);
  json j = json::parse(inspect.output);
  REQUIRE(j["layouts"].size() == 1);
  CHECK(j["layouts"][0]["state"] == "committed");
  CHECK(j["layouts"][0]["tensors"].get<int>() > 0);
  CHECK(j["layouts"][0]["bytes"].get<int64_t>() > 0);
  CHECK(j["layouts"][0]["fingerprint"]["layout"] == "engine");
  // Every engine's log names its own outcome; one wrote, none loaded a copy.
  int wrote = 0;
  for (auto& e : engines) {
    if (e->proc.Log().find("published the engine layout") != std::string::npos) ++wrote;
  }
  CHECK(wrote == 1);
  // One lease was ever granted: nobody else began writing a second copy.
  const std::string log = holder.Log();
  size_t leases = 0;
  for (size_t at = log.find("lease granted"); at != std::string::npos; at = log.find("lease granted", at + 1)) {
    ++leases;
  }
  CHECK(leases == 1);
  for (auto& e : engines) {
    e->proc.child.Kill(SIGTERM);
    CHECK(e->proc.child.Wait(20s) == 0);
  }
}

TEST_CASE("layouts: an engine with another revision publishes its own layout and never gets the first",
          "[engine][layout]") {
  TempDir dir;
  const std::string sock = dir.Join("h.sock");
  Proc holder = StartLayoutHolder(dir, sock);
  INFO(holder.Log());
  REQUIRE(holder.ready);
  auto r1 = Launch(dir, sock, "r1", {"--revision", "r1"});
  INFO(r1->proc.Log());
  REQUIRE(AwaitReady(*r1));
  CHECK(wsup::test::GetJson(r1->proc.port, "/wsup/status")["weights"]["source"] == "published");
  auto r2 = Launch(dir, sock, "r2", {"--revision", "r2"});
  INFO(r2->proc.Log());
  REQUIRE(AwaitReady(*r2));
  CHECK(wsup::test::GetJson(r2->proc.port, "/wsup/status")["weights"]["source"] == "published");
  CHECK(wsup::test::AllOutputs(r2->proc.port, kModel) == wsup::test::GoldenOutputs(kModel));
  auto again = Launch(dir, sock, "r1-again", {"--revision", "r1"});
  INFO(again->proc.Log());
  REQUIRE(AwaitReady(*again));
  CHECK(wsup::test::GetJson(again->proc.port, "/wsup/status")["weights"]["source"] == "holder");
  wsup::InfoMsg info = HolderInfo(sock);
  REQUIRE(info.layouts.size() == 2);
  CHECK(info.layouts[0].fingerprint.Get("revision") == "r1");
  CHECK(info.layouts[0].attaches == 2);
  CHECK(info.layouts[1].fingerprint.Get("revision") == "r2");
  CHECK(info.layouts[1].attaches == 1);
  CHECK(info.layouts[0].layout_hash == info.layouts[1].layout_hash);  // same tensors, another identity
}

TEST_CASE("layouts: a writer SIGKILLed mid-publish commits nothing, its memory is released, the next engine "
          "publishes",
          "[engine][layout]") {
  TempDir dir;
  const std::string sock = dir.Join("h.sock");
  Proc holder = StartLayoutHolder(dir, sock);
  INFO(holder.Log());
  REQUIRE(holder.ready);
  const std::vector<std::pair<std::string, std::string>> hook = {{"WSUP_ENGINE_TEST_HOOK", "stop_after_alloc"}};
  auto stuck_writing = [&](uint64_t waiters) {
    return wsup::test::WaitFor(
        [&] {
          wsup::InfoMsg i = HolderInfo(sock);
          return i.layouts.size() == 1 && i.layouts[0].state == "writing" && i.layouts[0].arena_bytes > 0 &&
                 i.layouts[0].waiters == waiters;
        },
        60s);
  };

  // Alone: killed after its grant, before writing.
  auto first = Launch(dir, sock, "killed-alone", {}, hook);
  INFO(first->proc.Log());
  REQUIRE(stuck_writing(0));
  first->proc.child.Kill(SIGKILL);
  CHECK(first->proc.child.Wait(20s) != -1);
  CHECK(wsup::test::WaitFor([&] { return HolderInfo(sock).layouts.empty(); }, 20s));
  wsup::InfoMsg empty = HolderInfo(sock);
  CHECK(empty.arena_bytes == 0);
  CHECK(empty.allocations == 0);
  CHECK(empty.tensors == 0);

  // With an engine waiting: the waiter gets the lease and publishes.
  auto second = Launch(dir, sock, "killed-waited-for", {}, hook);
  INFO(second->proc.Log());
  REQUIRE(stuck_writing(0));
  auto next = Launch(dir, sock, "next");
  INFO(next->proc.Log());
  REQUIRE(stuck_writing(1));
  second->proc.child.Kill(SIGKILL);
  CHECK(second->proc.child.Wait(20s) != -1);
  REQUIRE(AwaitReady(*next));
  json st = wsup::test::GetJson(next->proc.port, "/wsup/status");
  CHECK(st["weights"]["source"] == "published");
  CHECK(wsup::test::AllOutputs(next->proc.port, kModel) == wsup::test::GoldenOutputs(kModel));
  wsup::InfoMsg info = HolderInfo(sock);
  REQUIRE(info.layouts.size() == 1);
  CHECK(info.layouts[0].state == "committed");
  // Only the committed layout's memory is held: the killed writers' is gone.
  CHECK(info.arena_bytes == info.layouts[0].arena_bytes);
  CHECK(info.allocations == 1);
  const std::string log = holder.Log();
  CHECK(log.find("writing --writer_lost--> released") != std::string::npos);
  CHECK(log.find("writing --commit--> committed") != std::string::npos);
}

TEST_CASE("layouts: --layout engine needs a holder and the CPU - bad values are usage errors", "[engine][layout]") {
  TempDir dir;
  const std::string model = wsup::test::TestData(kModel);
  struct Case {
    std::vector<std::string> flags;
    const char* says;
  };
  const std::vector<Case> cases = {
      {{"--layout", "engine"}, "--layout engine publishes to or attaches from a holder"},
      {{"--layout", "fused"}, "--layout"},
      {{"--layout", "engine", "--weight-cache", "client", "--socket", dir.Join("h.sock"), "--device", "cuda:0"},
       "host-memory layouts only"},
  };
  for (const auto& c : cases) wsup::test::CheckUsageError(model, c.flags, c.says);
  // A holder of the checkpoint's own tensors is another layout: daemon mode
  // refuses it naming the field, client mode loads from disk.
  const std::string ckpt_sock = dir.Join("ckpt.sock");
  Proc ckpt_holder = wsup::test::StartHolder(dir, model, ckpt_sock, {}, "ckpt-holder.log");
  REQUIRE(ckpt_holder.ready);
  auto d = wsup::test::Run({wsup::test::BinPath("wsup-engine"), "--model", model, "--port", "0", "--kv-cache-mib", "4",
                            "--weight-cache", "daemon", "--socket", ckpt_sock, "--layout", "engine"},
                           60s);
  INFO(d.output);
  CHECK(d.exit_code == 78);
  CHECK(d.output.find("layout: ours=engine holder=(absent)") != std::string::npos);

  // Client mode with no holder: loads from disk and says why.
  Proc c = wsup::test::StartEngine(dir, kModel,
                                   {"--weight-cache", "client", "--socket", dir.Join("absent.sock"), "--layout",
                                    "engine"},
                                   "client.log");
  INFO(c.Log());
  REQUIRE(c.ready);
  json st = wsup::test::GetJson(c.port, "/wsup/status");
  CHECK(st["weights"]["source"] == "disk");
  CHECK(st["weights"]["miss_reason"].get<std::string>().find("holder unavailable") != std::string::npos);
  CHECK(wsup::test::AllOutputs(c.port, kModel) == wsup::test::GoldenOutputs(kModel));
}
