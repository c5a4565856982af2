// The supervisor's logic rig: the real Supervisor on simulated processes (a
// fake Launcher) and timers that fire only when the test moves its
// FakeClock. Engines are only names unless a test gives them a body (a
// FakeEngine on the port the supervisor chose: tests/supervisor_core/
// fake_engine.h). Shared by the logic tests; no test sleeps: fake time
// passes when the test says so, and real time only while a bounded wait
// polls a condition.
#pragma once

#include <catch2/catch.hpp>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <set>

#include <nlohmann/json.hpp>

#include "common/fs.h"
#include "common/unique_fd.h"
#include "supervisor/config.h"
#include "supervisor/launcher.h"
#include "supervisor/loop_timer.h"
#include "supervisor/supervisor.h"
#include "tests/fake_timers.h"
#include "testkit/test_util.h"

namespace wsup::logic {

using nlohmann::json;

// The shared fake timers (tests/fake_timers.h).
using FakeTimers = wsup::testing::FakeTimers;

// Processes that exist only here. The test decides when they exit.
class FakeProcs final : public Launcher {
 public:
  struct Proc {
    pid_t pid = 0;
    std::string kind;  // "front", "holder", "engine-a", "engine-b"
    bool alive = true;
    std::function<void(const ExitInfo&)> on_exit;
    std::shared_ptr<UniqueFd> lifeline;  // an engine's inherited fd 3, closed when it dies
  };
  // Called for each engine spawned (its spec) and each process that exits.
  std::function<void(pid_t, const std::string& kind, const ChildSpec&)> on_spawn;
  std::function<void(pid_t)> on_death;

  class Watch final : public ProcessWatch {
   public:
    Watch(FakeProcs* p, pid_t pid) : procs_(p), pid_(pid) {}
    void Close() override {
      auto it = procs_->procs_.find(pid_);
      if (it != procs_->procs_.end()) it->second.on_exit = nullptr;
      delete this;
    }

   private:
    FakeProcs* procs_;
    pid_t pid_;
  };

  Result<pid_t> Spawn(const ChildSpec& spec) override {
    Proc p;
    p.pid = next_++;
    std::string prog = spec.argv.empty() ? "" : spec.argv[0];
    std::string base = prog.substr(prog.rfind('/') + 1);
    if (base == "wsup-front") {
      p.kind = "front";
    } else if (base == "holder") {
      p.kind = "holder";
    } else {
      std::string slot = "?";
      for (const auto& [k, v] : spec.env_set) {
        if (k == "WSUP_ENGINE_SLOT") slot = v;
      }
      p.kind = "engine-" + slot;
    }
    spawned_[p.kind]++;
    if (p.kind.rfind("engine-", 0) == 0 && !spec.pass_fds.empty()) {
      // The engine's lifeline: open while it lives, as a real child's is.
      p.lifeline = std::make_shared<UniqueFd>(::fcntl(spec.pass_fds[0], F_DUPFD_CLOEXEC, 3));
    }
    procs_[p.pid] = p;
    if (on_spawn) on_spawn(p.pid, p.kind, spec);
    return p.pid;
  }
  Result<ProcessWatch*> WatchExit(uv_loop_t*, pid_t pid, std::function<void(const ExitInfo&)> cb) override {
    procs_[pid].on_exit = std::move(cb);
    return static_cast<ProcessWatch*>(new Watch(this, pid));
  }
  Status Signal(pid_t pgid, int sig) override {
    if (sig == SIGKILL && kill_is_slow) {
      // Killed, but gone only when the test says (Exit): a GPU engine's
      // teardown after SIGKILL.
      Dying(pgid);
      slow_kills.push_back(pgid);
      return Status::Ok();
    }
    if (sig == SIGTERM && term_is_slow) {
      // Asked to stop, and still running until the test says (Exit).
      slow_terms.push_back(pgid);
      return Status::Ok();
    }
    if (sig == SIGKILL || sig == SIGTERM) Exit(pgid, -1, sig);
    return Status::Ok();
  }
  bool Alive(pid_t pid) override {
    auto it = procs_.find(pid);
    return it != procs_.end() && it->second.alive;
  }
  Result<uint64_t> StartTime(pid_t pid) override { return static_cast<uint64_t>(pid); }
  Result<char> RunState(pid_t pid) override {
    if (!Alive(pid)) return NotFound("no process " + std::to_string(pid));
    return 'S';
  }
  Result<bool> ListensOn(pid_t, int) override { return true; }

  // The live process of a kind (0: none).
  pid_t Live(const std::string& kind) const {
    for (const auto& [pid, p] : procs_) {
      if (p.kind == kind && p.alive) return pid;
    }
    return 0;
  }
  int Spawned(const std::string& kind) const {
    auto it = spawned_.find(kind);
    return it == spawned_.end() ? 0 : it->second;
  }
  // Its lifeline closes (the kernel tears it down) while its exit is still
  // to come (a GPU engine's takes tens of milliseconds more).
  void Dying(pid_t pid) {
    auto it = procs_.find(pid);
    if (it != procs_.end() && it->second.lifeline) it->second.lifeline->Reset();
    if (on_death) on_death(pid);
  }
  // A signal other than SIGKILL/SIGTERM is taken as dying, with the exit
  // left to the test; SIGKILL and SIGTERM end the process at once.
  bool kill_is_slow = false;
  std::vector<pid_t> slow_kills;
  // SIGTERM is taken and the process runs on (an engine that takes its time
  // to stop); SIGKILL still ends it.
  bool term_is_slow = false;
  std::vector<pid_t> slow_terms;

  // Queues an exit (code, or signal when sig != 0); Deliver() reports it.
  void Exit(pid_t pid, int code, int sig = 0) {
    auto it = procs_.find(pid);
    if (it == procs_.end() || !it->second.alive) return;
    if (it->second.lifeline) it->second.lifeline->Reset();
    if (on_death) on_death(pid);
    it->second.alive = false;
    ExitInfo info;
    info.pid = pid;
    info.known = true;
    info.exit_code = sig ? -1 : code;
    info.signal = sig;
    pending_.push_back(info);
  }
  bool Deliver() {
    if (pending_.empty()) return false;
    auto all = std::move(pending_);
    pending_.clear();
    for (const auto& info : all) {
      auto cb = procs_[info.pid].on_exit;
      procs_[info.pid].on_exit = nullptr;
      if (cb) cb(info);
    }
    return true;
  }

 private:
  std::map<pid_t, Proc> procs_;
  std::map<std::string, int> spawned_;
  std::vector<ExitInfo> pending_;
  pid_t next_ = 500'000;
};

// A uv loop with simulated processes and fake timers, for the rigs that
// test one part of the supervisor (FrontLink, HolderSet) rather than all of
// it. cfg: the state and runtime folders in dir, restarts after 1 s doubling
// to 4 s, at most 3. A rig built on this one releases its part in its own
// destructor; this one then closes the loop.
struct PartRig {
  test::TempDir dir;
  FakeClock clock;
  FakeTimers timers{&clock};
  FakeProcs procs;
  uv_loop_t loop{};
  Config cfg;

  PartRig() {
    REQUIRE(uv_loop_init(&loop) == 0);
    cfg.node.runtime_dir = dir.path();
    cfg.node.state_dir = dir.path();
    cfg.supervisor.restart_backoff_ms = 1000;
    cfg.supervisor.restart_backoff_max_ms = 4000;
    cfg.supervisor.max_restarts = 3;
  }
  ~PartRig() {
    for (int i = 0; i < 100 && uv_run(&loop, UV_RUN_NOWAIT) != 0; ++i) {
    }
    uv_walk(&loop, [](uv_handle_t* h, void*) { if (!uv_is_closing(h)) uv_close(h, nullptr); }, nullptr);
    uv_run(&loop, UV_RUN_DEFAULT);
    CHECK(uv_loop_close(&loop) == 0);
  }
  PartRig(const PartRig&) = delete;
  PartRig& operator=(const PartRig&) = delete;

  // Runs the loop, exits and due fake timers until cond holds (bounded).
  bool Until(const std::function<bool()>& cond) {
    return test::WaitFor(
        [&] {
          procs.Deliver();
          uv_run(&loop, UV_RUN_NOWAIT);
          while (timers.FireDue()) uv_run(&loop, UV_RUN_NOWAIT);
          return cond();
        },
        std::chrono::seconds(5));
  }
  // Moves fake time on by ms and lets what falls due run.
  void Advance(int64_t ms) {
    clock.AdvanceMs(ms);
    while (timers.FireDue()) uv_run(&loop, UV_RUN_NOWAIT);
    procs.Deliver();
  }
};

// A supervisor on fake processes and fake time. `extra_toml` goes into the
// config where [probe] ends (bare keys are the probe's; sections may
// follow), `supervisor_toml` at the end of [supervisor]; `before_start`
// runs before the supervisor is created (to hook the fake processes).
// Restart() replaces the supervisor by a new one on the same files and
// processes, as after a crash of the supervisor.
struct Rig {
  test::TempDir dir;
  FakeClock clock;
  FakeTimers timers{&clock};
  FakeProcs procs;
  std::unique_ptr<Supervisor> sup;

  SupervisorOptions options;

  explicit Rig(const std::string& mode, int64_t window_ms = 600'000, const std::string& extra_toml = "",
               const std::function<void(Rig&)>& before_start = nullptr, const std::string& supervisor_toml = "") {
    REQUIRE(MakeDirs(dir.Join("model"), 0755).ok());
    REQUIRE(WriteFileAtomic(dir.Join("model/config.json"), "{}").ok());
    REQUIRE(WriteFileAtomic(dir.Join("model/model.safetensors"), "x").ok());
    for (const char* prog : {"engine", "holder"}) {
      REQUIRE(WriteFileAtomic(dir.Join(prog), "#!/bin/sh\n").ok());
      REQUIRE(::chmod(dir.Join(prog).c_str(), 0755) == 0);
    }
    std::string toml = "[node]\nname = \"logic\"\nstate_dir = \"state\"\nruntime_dir = \"run\"\n"
                       "[model]\npath = \"model\"\n"
                       "[weight_cache]\nmode = \"" + mode + "\"\n"
                       "[engine]\ncommand = [\"" + dir.Join("engine") + "\", \"--port\", \"{port}\"]\nprimary_port = 0\nstandby_port = 0\n"
                       "[holder]\ncommand = [\"" + dir.Join("holder") + "\", \"--socket\", \"{socket}\"]\n"
                       "[probe]\nprompt = \"Hello\"\nexpect = \"world\"\nmax_tokens = 4\n"
                       "[front]\nlisten = \"127.0.0.1:0\"\n[admin]\nlisten = \"127.0.0.1:0\"\n"
                       "[supervisor]\nrestart_backoff_ms = 1000\nrestart_backoff_max_ms = 4000\nmax_restarts = 3\n"
                       "restart_window_ms = " + std::to_string(window_ms) + "\n" + supervisor_toml;
    if (mode != "daemon") toml.replace(toml.find("[holder]"), toml.find("[probe]") - toml.find("[holder]"), "");
    // Inserted where [probe] ends: bare keys are the probe's, and sections may follow.
    toml.insert(toml.find("[front]"), extra_toml);
    REQUIRE(WriteFileAtomic(dir.Join("node.toml"), toml).ok());
    Config cfg = LoadNodeToml();
    options.bin_dir = dir.path();
    options.clock = &clock;
    options.launcher = &procs;
    options.timers = &timers;
    if (before_start) before_start(*this);
    Create(std::move(cfg));
  }
  // The supervisor goes away without a stop (its processes run on), and a
  // new one starts from the config file and what the old one left.
  void Restart() {
    sup.reset();
    Create(LoadNodeToml());
  }
  // The config file dir/node.toml, parsed.
  Config LoadNodeToml() {
    auto cfg = LoadConfig(dir.Join("node.toml"));
    INFO((cfg.ok() ? "" : cfg.error().message()));
    REQUIRE(cfg.ok());
    return std::move(*cfg);
  }
  // A supervisor of cfg with the rig's options, settled.
  void Create(Config cfg) {
    auto s = Supervisor::Create(std::move(cfg), options);
    INFO((s.ok() ? "" : s.error().message()));
    REQUIRE(s.ok());
    sup = std::move(*s);
    Settle();
  }
  // Runs the loop and delivers exits until nothing more happens now.
  void Settle() {
    for (int i = 0; i < 200; ++i) {
      bool any = procs.Deliver();
      sup->Step();
      any |= timers.FireDue();
      if (!any && i > 3) break;
    }
  }
  // Runs the loop (real time passes: sockets, real timers) until cond holds
  // or `limit` of real time has passed; exits and due fake timers as
  // Settle(). With tick_ms, fake time moves that much at each look, so that
  // fake timers (status polls, backoff) keep pace with the real ones.
  bool SettleUntil(const std::function<bool()>& cond, std::chrono::milliseconds limit, int64_t tick_ms = 0) {
    return test::WaitFor(
        [&] {
          if (tick_ms > 0) clock.AdvanceMs(tick_ms);
          procs.Deliver();
          sup->Step();
          while (timers.FireDue()) sup->Step();
          return cond();
        },
        limit);
  }
  // Moves time forward by ms, firing every timer on the way at its time.
  void Advance(int64_t ms) {
    int64_t end = clock.MonotonicMs() + ms;
    for (;;) {
      Settle();
      int64_t next = timers.NextDue();
      if (next < 0 || next > end) break;
      if (next > clock.MonotonicMs()) clock.AdvanceMs(next - clock.MonotonicMs());
    }
    if (end > clock.MonotonicMs()) clock.AdvanceMs(end - clock.MonotonicMs());
    Settle();
  }
  json Status() { return json::parse(sup->StatusJson()); }
  json Engine(const std::string& slot) {
    json st = Status();
    for (const auto& e : st["engines"]) {
      if (e.value("slot", "") == slot) return e;
    }
    return json();
  }
  // Kills the live process of `kind` with `code` and returns how long it
  // took (in fake ms) until a new one was spawned, or -1 within `limit`.
  int64_t CrashAndTimeRestart(const std::string& kind, int code, int64_t limit = 10'000) {
    pid_t pid = procs.Live(kind);
    REQUIRE(pid > 0);
    int before = procs.Spawned(kind);
    procs.Exit(pid, code);
    Settle();
    int64_t start = clock.MonotonicMs();
    if (procs.Spawned(kind) > before) return 0;
    while (clock.MonotonicMs() - start < limit) {
      int64_t next = timers.NextDue();
      if (next < 0 || next - start > limit) break;
      Advance(std::max<int64_t>(0, next - clock.MonotonicMs()));
      if (procs.Spawned(kind) > before) return clock.MonotonicMs() - start;
    }
    return -1;
  }
};

}  // namespace wsup::logic
