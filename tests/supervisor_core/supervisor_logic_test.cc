// The supervisor's own logic, in-process: the real Supervisor on simulated
// processes (a fake Launcher) and timers that fire only when the test moves
// its FakeClock. A crash-looping engine, front and holder are each throttled
// by the one restart policy, and each gives up (or, the front, keeps trying)
// exactly as that policy says; a permanent-failure exit is never retried.
// No test sleeps: time passes when the test says so.
#include <catch2/catch.hpp>
#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <map>
#include <memory>
#include <set>

#include <nlohmann/json.hpp>

#include "common/fs.h"
#include "supervisor/config.h"
#include "supervisor/launcher.h"
#include "supervisor/loop_timer.h"
#include "supervisor/supervisor.h"
#include "tests/test_util.h"

namespace wsup {
namespace {

using nlohmann::json;

// Timers that fire when Advance() moves the clock past their deadline, in
// deadline order, each at its own time.
class FakeTimers final : public TimerSource {
 public:
  explicit FakeTimers(FakeClock* clock) : clock_(clock) {}

  class T final : public Timer {
   public:
    explicit T(FakeTimers* src) : src_(src) { src_->all_.insert(this); }
    ~T() override { src_->all_.erase(this); }
    void Start(int64_t delay_ms, std::function<void()> cb, int64_t repeat_ms) override {
      due_ = src_->clock_->MonotonicMs() + std::max<int64_t>(0, delay_ms);
      repeat_ = repeat_ms;
      cb_ = std::move(cb);
      armed_ = true;
    }
    void Stop() override { armed_ = false; }
    bool active() const override { return armed_; }

    FakeTimers* src_;
    int64_t due_ = 0, repeat_ = 0;
    std::function<void()> cb_;
    bool armed_ = false;
  };

  std::unique_ptr<Timer> Make() override { return std::make_unique<T>(this); }

  // The earliest armed deadline, or -1.
  int64_t NextDue() const {
    int64_t best = -1;
    for (T* t : all_) {
      if (t->armed_ && (best < 0 || t->due_ < best)) best = t->due_;
    }
    return best;
  }
  // Fires the timers due by now (each may arm others).
  bool FireDue() {
    for (T* t : all_) {
      if (t->armed_ && t->due_ <= clock_->MonotonicMs()) {
        auto cb = t->cb_;
        if (t->repeat_ > 0) {
          t->due_ += t->repeat_;
        } else {
          t->armed_ = false;
        }
        cb();  // may destroy t and change all_: restart the scan
        return true;
      }
    }
    return false;
  }

 private:
  friend class T;
  FakeClock* clock_;
  std::set<T*> all_;
};

// Processes that exist only here. The test decides when they exit.
class FakeProcs final : public Launcher {
 public:
  struct Proc {
    pid_t pid = 0;
    std::string kind;  // "front", "holder", "engine-a", "engine-b"
    bool alive = true;
    std::function<void(const ExitInfo&)> on_exit;
  };

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
    procs_[p.pid] = p;
    return p.pid;
  }
  Result<ProcessWatch*> WatchExit(uv_loop_t*, pid_t pid, std::function<void(const ExitInfo&)> cb) override {
    procs_[pid].on_exit = std::move(cb);
    return static_cast<ProcessWatch*>(new Watch(this, pid));
  }
  Status Signal(pid_t pgid, int sig) override {
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
  // Queues an exit (code, or signal when sig != 0); Deliver() reports it.
  void Exit(pid_t pid, int code, int sig = 0) {
    auto it = procs_.find(pid);
    if (it == procs_.end() || !it->second.alive) return;
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

// A supervisor on fake processes and fake time.
struct Rig {
  test::TempDir dir;
  FakeClock clock;
  FakeTimers timers{&clock};
  FakeProcs procs;
  std::unique_ptr<Supervisor> sup;

  explicit Rig(const std::string& mode, int64_t window_ms = 600'000) {
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
                       "restart_window_ms = " + std::to_string(window_ms) + "\n";
    if (mode != "daemon") toml.replace(toml.find("[holder]"), toml.find("[probe]") - toml.find("[holder]"), "");
    REQUIRE(WriteFileAtomic(dir.Join("node.toml"), toml).ok());
    auto cfg = LoadConfig(dir.Join("node.toml"));
    INFO((cfg.ok() ? "" : cfg.error().message()));
    REQUIRE(cfg.ok());
    SupervisorOptions o;
    o.bin_dir = dir.path();
    o.clock = &clock;
    o.launcher = &procs;
    o.timers = &timers;
    auto s = Supervisor::Create(std::move(*cfg), o);
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

TEST_CASE("logic: a crash-looping engine is restarted at once, then backed off, then given up on", "[logic]") {
  Rig r("off");
  REQUIRE(r.procs.Live("engine-a") > 0);
  REQUIRE(r.procs.Live("engine-b") > 0);
  // Quiet before: at once. Then 1 s, 2 s (doubling), then the loop is called.
  CHECK(r.CrashAndTimeRestart("engine-a", 1) == 0);
  CHECK(r.CrashAndTimeRestart("engine-a", 1) == 1000);
  CHECK(r.CrashAndTimeRestart("engine-a", 1) == 2000);
  CHECK(r.CrashAndTimeRestart("engine-a", 1) == -1);
  json s = r.Status();
  INFO(s.dump());
  CHECK(s.value("state", "") == "degraded");
  CHECK(s.value("degraded_reason", "").find("engine a failed 3 times") != std::string::npos);
  CHECK(r.Engine("a").value("restarts", 0) == 3);
  CHECK(r.Engine("a").value("state", "") == "failed");
  // The other slot was never touched.
  CHECK(r.procs.Spawned("engine-b") == 1);
}

TEST_CASE("logic: an engine that exits with the permanent-failure code is not restarted", "[logic]") {
  Rig r("off");
  CHECK(r.CrashAndTimeRestart("engine-a", kExitConfig) == -1);
  json s = r.Status();
  INFO(s.dump());
  CHECK(s.value("state", "") == "degraded");
  CHECK(r.Engine("a").value("failure", "").find("exited with 78") != std::string::npos);
  CHECK(r.Engine("a").value("restarts", -1) == 0);
  // A signal is never permanent: the other slot's crash is restarted.
  CHECK(r.CrashAndTimeRestart("engine-b", 1) == 0);
}

TEST_CASE("logic: a crash-looping front is throttled by the same policy, reported, and never left down", "[logic]") {
  Rig r("off");
  REQUIRE(r.procs.Live("front") > 0);
  CHECK(r.CrashAndTimeRestart("front", 1) == 0);
  CHECK(r.CrashAndTimeRestart("front", 1) == 1000);
  CHECK(r.CrashAndTimeRestart("front", 1) == 2000);
  CHECK_FALSE(r.Status()["front"].value("crash_looping", true));
  // The loop: restarted at the cap, and said so.
  CHECK(r.CrashAndTimeRestart("front", 1) == 4000);
  CHECK(r.CrashAndTimeRestart("front", 1) == 4000);
  json s = r.Status();
  INFO(s.dump());
  CHECK(s["front"].value("crash_looping", false));
  CHECK(s["front"].value("restarts", 0) == 5);
  CHECK(s.value("state", "") != "degraded");
  // Its permanent-failure code: left down, the node degraded with the reason.
  CHECK(r.CrashAndTimeRestart("front", kExitConfig) == -1);
  s = r.Status();
  CHECK(s.value("state", "") == "degraded");
  CHECK(s["front"].value("state", "") == "down");
  CHECK(s["front"].value("failure", "").find("permanent-failure code") != std::string::npos);
}

TEST_CASE("logic: a crash-looping holder is throttled by the same policy and given up on", "[logic]") {
  Rig r("daemon");
  REQUIRE(r.procs.Live("holder") > 0);
  // Engines wait for the holder.
  CHECK(r.procs.Spawned("engine-a") == 0);
  CHECK(r.CrashAndTimeRestart("holder", 1) == 0);
  CHECK(r.CrashAndTimeRestart("holder", 1) == 1000);
  CHECK(r.CrashAndTimeRestart("holder", 1) == 2000);
  CHECK(r.CrashAndTimeRestart("holder", 1) == -1);
  json s = r.Status();
  INFO(s.dump());
  CHECK(s.value("state", "") == "degraded");
  CHECK(s["holders"][0].value("state", "") == "down");
  CHECK(s.value("degraded_reason", "").find("holder rank 0 failed 3 times") != std::string::npos);
  CHECK(r.procs.Spawned("engine-a") == 0);
}

TEST_CASE("logic: a holder that refuses its checkpoint (exit 3) is not restarted", "[logic]") {
  Rig r("daemon");
  CHECK(r.CrashAndTimeRestart("holder", kExitRefused) == -1);
  json s = r.Status();
  INFO(s.dump());
  CHECK(s["holders"][0].value("state", "") == "down");
  CHECK(s.value("degraded_reason", "").find("refused to serve") != std::string::npos);
}

TEST_CASE("logic: restarts spread out in time are each immediate: the window forgets", "[logic]") {
  Rig r("off", 10'000);
  for (int i = 0; i < 6; ++i) {
    CHECK(r.CrashAndTimeRestart("engine-a", 1) == 0);
    r.Advance(10'001);  // past supervisor.restart_window_ms
  }
  CHECK(r.Status().value("state", "") != "degraded");
}

}  // namespace
}  // namespace wsup
