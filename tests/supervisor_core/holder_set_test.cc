// HolderSet (supervisor/holder_set.h) on its own: fake processes, fake
// timers, a keeper that answers without a holder, and a real loop for the
// readiness pipe. Each test drives rows of the holder table (child_fsm.h)
// and checks what is spawned and signalled, what the hooks were told, and
// when a restart comes by the fake clock. Nothing sleeps.
#include <catch2/catch.hpp>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/exit_codes.h"
#include "supervisor/holder_set.h"
#include "tests/supervisor_core/logic_rig.h"

namespace wsup {
namespace {

using logic::FakeProcs;
using logic::FakeTimers;

struct HolderRig : logic::PartRig {
  // What the hooks were told.
  bool stopping = false;
  int all_ready = 0, saves = 0, exits = 0;
  std::vector<std::pair<std::string, int>> fatal;
  std::vector<std::string> down;
  std::vector<HolderRestartRecord> restarted;
  std::vector<ChildSpec> specs;
  std::vector<std::pair<pid_t, int>> signals;
  // The write end of the latest holder's readiness pipe (a copy; the
  // supervisor closes its own after the spawn).
  UniqueFd ready_w;
  // The keeper's answers come from the thread pool: only counted there.
  std::atomic<int> attaches{0};
  std::atomic<bool> attach_fails{false};
  std::unique_ptr<HolderSet> set;

  HolderRig() {
    cfg.weight_cache.mode = CacheMode::kDaemon;
    cfg.weight_cache.socket = dir.Join("holder.sock");
    cfg.holder.command = {dir.Join("holder"), "--socket", "{socket}"};
    procs.on_spawn = [this](pid_t, const std::string&, const ChildSpec& spec) {
      specs.push_back(spec);
      REQUIRE(!spec.pass_fds.empty());
      ready_w.Reset(::fcntl(spec.pass_fds.back(), F_DUPFD_CLOEXEC, 3));
    };
    HolderSet::Hooks h;
    h.stopping = [this] { return stopping; };
    h.fatal = [this](const std::string& why, int code) { fatal.emplace_back(why, code); };
    h.save_state = [this] { saves++; };
    h.all_ready = [this] { all_ready++; };
    h.restarted = [this](const HolderRestartRecord& rec) { restarted.push_back(rec); };
    h.down = [this](const std::string& why) { down.push_back(why); };
    h.exited = [this] { exits++; };
    HolderSet::Keeper k;
    k.attach = [this](const std::string& socket) -> Result<KeptArena> {
      attaches++;
      if (attach_fails) return Unavailable(socket + ": nothing listens");
      return KeptArena{};
    };
    k.keep_layouts = [](const std::string&, const std::vector<CommittedLayout>&, uint64_t) -> Result<LayoutKeepRound> {
      return LayoutKeepRound{};
    };
    k.fetch_kv_pool = [](const std::string&) -> Result<KvPoolFds> { return NotFound("no pool in this test"); };
    set = std::make_unique<HolderSet>(&loop, procs, timers, clock, cfg, dir.path(), std::move(h), std::move(k));
  }
  ~HolderRig() {
    set.reset();
    ready_w.Reset();
  }
  void SayReady(const std::string& line) {
    std::string l = line + "\n";
    REQUIRE(::write(ready_w.get(), l.data(), l.size()) == static_cast<ssize_t>(l.size()));
  }
  bool Ready() {
    SayReady("ready " + cfg.weight_cache.socket);
    return Until([&] { return set->state(0) == ChildState::kReady; });
  }
  // The holder's process exits with `code` and the exit is seen.
  // Fake exits are delivered at once; a restart due now waits for Advance().
  void Exit(int code) {
    pid_t pid = set->pid(0);
    REQUIRE(pid > 0);
    procs.Exit(pid, code);
    REQUIRE(procs.Deliver());
    REQUIRE(set->pid(0) == 0);
  }
};

bool HasFlag(const ChildSpec& spec, const std::string& flag) {
  for (const auto& a : spec.argv) {
    if (a == flag) return true;
  }
  return false;
}

TEST_CASE("holder set: a spawn moves the holder idle --spawn--> starting, recorded, its readiness pipe passed",
          "[holder_set]") {
  HolderRig r;
  CHECK(r.set->state(0) == ChildState::kIdle);
  r.set->Start({});
  REQUIRE(r.set->size() == 1);
  CHECK(r.set->state(0) == ChildState::kStarting);
  REQUIRE(r.specs.size() == 1);
  CHECK(r.set->pid(0) > 0);
  CHECK(r.procs.Spawned("holder") == 1);
  CHECK(HasFlag(r.specs[0], "--ready-fd"));
  CHECK_FALSE(HasFlag(r.specs[0], "--adopt-fds"));  // nothing kept yet
  CHECK(r.saves >= 1);                              // a child never runs unrecorded
  REQUIRE(r.set->Records().size() == 1);
  CHECK(r.set->Records()[0].proc.pid == r.set->pid(0));
  CHECK_FALSE(r.set->AllReady());
  CHECK(r.all_ready == 0);
  CHECK(r.fatal.empty());
}

TEST_CASE("holder set: its readiness line --up--> keeping, the keeper's answer --kept--> ready, and the node is told",
          "[holder_set]") {
  HolderRig r;
  r.set->Start({});
  REQUIRE(r.Ready());
  CHECK(r.attaches == 1);
  CHECK(r.all_ready == 1);
  CHECK(r.set->AllReady());
  CHECK(r.set->last_error(0).empty());
  CHECK(r.restarted.empty());  // a first start is no restart
  auto st = r.set->StatusJson();
  REQUIRE(st.size() == 1);
  CHECK(st[0]["state"] == "ready");
  CHECK(st[0]["ready"] == true);
}

TEST_CASE("holder set: a bare \"ready\" line is taken too", "[holder_set]") {
  HolderRig r;
  r.set->Start({});
  r.SayReady("ready");
  REQUIRE(r.Until([&] { return r.set->state(0) == ChildState::kReady; }));
  CHECK(r.all_ready == 1);
}

TEST_CASE("holder set: a keeper attach that fails kills the holder, and it is started again", "[holder_set]") {
  HolderRig r;
  r.attach_fails = true;
  r.set->Start({});
  r.SayReady("ready " + r.cfg.weight_cache.socket);
  REQUIRE(r.Until([&] { return r.procs.Spawned("holder") == 2; }));
  CHECK(r.all_ready == 0);
  CHECK(r.set->last_error(0).find("keeper attach failed") != std::string::npos);
  CHECK(r.set->restarts(0) == 1);
}

TEST_CASE("holder set: a readiness line that is not a holder's is refused with what to fix, and the holder killed",
          "[holder_set]") {
  HolderRig r;
  r.set->Start({});
  const pid_t first = r.set->pid(0);
  r.SayReady("listening on 9000");
  REQUIRE(r.Until([&] { return r.set->state(0) != ChildState::kStarting || r.set->pid(0) != first; }));
  CHECK(r.attaches == 0);  // never treated as up
  CHECK(r.all_ready == 0);
  CHECK_FALSE(r.procs.Alive(first));
  const std::string err = r.set->last_error(0);
  CHECK(err.find("\"listening on 9000\" is not \"ready <socket>\"") != std::string::npos);
  CHECK(err.find("holder.command") != std::string::npos);
  CHECK(r.set->StatusJson()[0]["last_error"] == err);
  // Its exit goes through the throttle: the first restart is at once.
  REQUIRE(r.Until([&] { return r.procs.Spawned("holder") == 2; }));
  CHECK(r.set->state(0) == ChildState::kStarting);
}

TEST_CASE("holder set: a readiness line naming another socket is refused", "[holder_set]") {
  CHECK(CheckHolderReadyLine("ready /run/a.sock", "/run/a.sock").ok());
  CHECK(CheckHolderReadyLine("ready", "/run/a.sock").ok());
  Status other = CheckHolderReadyLine("ready /tmp/elsewhere.sock", "/run/a.sock");
  REQUIRE_FALSE(other.ok());
  CHECK(other.error().code() == Code::kInvalidArgument);
  CHECK(other.error().message().find("/tmp/elsewhere.sock") != std::string::npos);
  CHECK(other.error().message().find("\"--socket\", \"{socket}\"") != std::string::npos);
  CHECK_FALSE(CheckHolderReadyLine("", "/run/a.sock").ok());
  CHECK_FALSE(CheckHolderReadyLine("readyx", "/run/a.sock").ok());
  CHECK_FALSE(CheckHolderReadyLine(std::string(5000, 'x'), "/run/a.sock").ok());

  HolderRig r;
  r.set->Start({});
  r.SayReady("ready " + r.dir.Join("other.sock"));
  REQUIRE(r.Until([&] { return !r.set->last_error(0).empty(); }));
  CHECK(r.set->state(0) != ChildState::kReady);
  CHECK(r.all_ready == 0);
}

TEST_CASE("holder set: an exit restarts it from the kept fds, at once and then after the throttle's backoff",
          "[holder_set]") {
  HolderRig r;
  r.set->Start({});
  REQUIRE(r.Ready());
  r.Exit(1);
  // The first restart after a quiet period is immediate: the timer is due now.
  CHECK(r.set->state(0) == ChildState::kFailed);
  r.Advance(0);
  REQUIRE(r.procs.Spawned("holder") == 2);
  CHECK(r.set->state(0) == ChildState::kStarting);
  CHECK(HasFlag(r.specs[1], "--adopt-fds"));  // no byte of the checkpoint read again
  REQUIRE(r.Ready());
  REQUIRE(r.restarted.size() == 1);
  CHECK(r.restarted[0].rank == 0);
  CHECK(r.restarted[0].from_fds);
  CHECK(r.restarted[0].reason.find(" exit 1") != std::string::npos);
  CHECK(r.all_ready == 2);

  // The second one within the window waits restart_backoff_ms.
  r.Exit(1);
  r.Advance(999);
  CHECK(r.procs.Spawned("holder") == 2);
  CHECK(r.set->state(0) == ChildState::kFailed);
  r.Advance(1);
  CHECK(r.procs.Spawned("holder") == 3);
  CHECK(r.set->restarts(0) == 2);
}

TEST_CASE("holder set: too many restarts within the window give up, and the node is told why", "[holder_set]") {
  HolderRig r;
  r.set->Start({});
  // max_restarts = 3: three restarts (0, 1000, 2000 ms), then the fourth exit gives up.
  for (int i = 0; i < 3; ++i) {
    r.Exit(1);
    r.Advance(4000);
    REQUIRE(r.procs.Spawned("holder") == i + 2);
  }
  CHECK(r.down.empty());
  r.Exit(1);
  CHECK(r.set->state(0) == ChildState::kDown);
  REQUIRE(r.down.size() == 1);
  CHECK(r.down[0].find("failed 3 times within supervisor.restart_window_ms") != std::string::npos);
  CHECK(r.set->failure(0) == r.down[0]);
  r.Advance(60'000);
  CHECK(r.procs.Spawned("holder") == 4);  // no restart after giving up
  CHECK_FALSE(r.set->AllReady());
}

TEST_CASE("holder set: a permanent-failure exit is not restarted", "[holder_set]") {
  HolderRig r;
  r.set->Start({});
  r.Exit(kExitRefused);
  CHECK(r.set->state(0) == ChildState::kDown);
  REQUIRE(r.down.size() == 1);
  CHECK(r.down[0].find("refused to serve") != std::string::npos);
  r.Advance(60'000);
  CHECK(r.procs.Spawned("holder") == 1);
}

TEST_CASE("holder set: a stop terminates the holder, its exit is told, and nothing restarts", "[holder_set]") {
  HolderRig r;
  r.set->Start({});
  REQUIRE(r.Ready());
  r.stopping = true;
  r.set->Stop("test stop");
  CHECK(r.set->state(0) == ChildState::kStopping);
  REQUIRE(r.Until([&] { return r.set->state(0) == ChildState::kStopped; }));
  CHECK(r.exits == 1);
  CHECK_FALSE(r.set->AnyProcess());
  CHECK(r.set->Records().empty());
  r.Advance(60'000);
  CHECK(r.procs.Spawned("holder") == 1);
}

TEST_CASE("holder set: a holder that cannot be spawned stops the node with the configuration's exit code",
          "[holder_set]") {
  HolderRig r;
  r.cfg.holder.command = {r.dir.Join("holder"), "{no_such_placeholder}"};
  r.set->Start({});
  REQUIRE(r.fatal.size() == 1);
  CHECK(r.fatal[0].second == kExitConfig);
  CHECK(r.procs.Spawned("holder") == 0);
  CHECK(r.set->state(0) == ChildState::kIdle);
}

}  // namespace
}  // namespace wsup
