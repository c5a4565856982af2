// EngineSet (supervisor/engine_set.h) on its own: fake processes, fake
// timers and a real loop with nothing listening on the engines' ports.
// Each test drives rows of the engine table (engine_fsm.h) and checks what
// was spawned and signalled, what the hooks were told and in which order,
// and when a restart comes by the fake clock. Nothing sleeps.
#include <catch2/catch.hpp>
#include <signal.h>

#include <algorithm>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "common/exit_codes.h"
#include "http/control_auth.h"
#include "supervisor/engine_set.h"
#include "tests/supervisor_core/logic_rig.h"
#include "wire/death_word.h"

namespace wsup {
namespace {

std::string EnvOf(const ChildSpec& spec, const std::string& key) {
  for (const auto& [k, v] : spec.env_set) {
    if (k == key) return v;
  }
  return "";
}

struct EngineRig : logic::PartRig {
  http::HttpClient http{&loop};
  Metrics metrics;
  // What the hooks were told, in order ("gone a", "kv_exit a", "failed a
  // probe 1234 drill=0", "degraded: ...", "routes", "save", ...).
  std::vector<std::string> told;
  std::vector<std::pair<std::string, int>> fatal;
  std::vector<std::string> degraded;
  std::vector<RecoveryRecord> recoveries;
  std::vector<ChildSpec> specs;
  bool stopping = false;
  std::unique_ptr<EngineSet> set;

  EngineRig() {
    cfg.engine.host = "127.0.0.1";
    cfg.engine.command = {dir.Join("engine"), "--port", "{port}"};
    cfg.engine.ready_timeout_ms = 60'000;
    procs.on_spawn = [this](pid_t, const std::string&, const ChildSpec& spec) { specs.push_back(spec); };
    EngineSet::Hooks h;
    h.stopping = [this] { return stopping; };
    h.fatal = [this](const std::string& why, int code) { fatal.emplace_back(why, code); };
    h.degraded = [this](const std::string& why) { degraded.push_back(why); };
    h.save_state = [this] { told.push_back("save"); };
    h.exited = [this] { told.push_back("exited"); };
    h.version_failed = [this](const std::string& slot, const std::string&) { told.push_back("version_failed " + slot); };
    h.keep_layouts = [this] { told.push_back("keep_layouts"); };
    h.rollout_in_progress = [] { return false; };
    h.record_cache = [this](const CacheEventRecord& r) { told.push_back("cache " + r.slot); };
    h.record_probe = [this](const ProbeTransitionRecord& r) { told.push_back("probe " + r.slot); };
    h.record_recovery = [this](const RecoveryRecord& r) { recoveries.push_back(r); };
    h.kv_seq = [] { return uint64_t{0}; };
    h.kv_said = [this](EngineSlot& s, const nlohmann::json&, uint64_t, const char*) { told.push_back("kv " + s.name); };
    h.kv_exit = [this](EngineSlot& s, const std::string&) { told.push_back("kv_exit " + s.name); };
    h.after_grant = [](std::function<void()> work) { work(); };
    h.failed = [this](const std::string& slot, bool had_process, FailoverTrigger trigger, const std::string&,
                      int64_t fault_ms, bool drill) {
      told.push_back("failed " + slot + " " + FailoverTriggerName(trigger) + " " + std::to_string(fault_ms) +
                     (had_process ? " process" : " none") + (drill ? " drill" : ""));
    };
    h.gone = [this](const std::string& slot) { told.push_back("gone " + slot); };
    h.cut = [this](const std::string& address, const std::string&) { told.push_back("cut " + address); };
    h.routes_changed = [this] { told.push_back("routes"); };
    set = std::make_unique<EngineSet>(&loop, procs, timers, clock, cfg, http, metrics, std::move(h));
    // The node's subscription of the set's own parts, in the node's order.
    set->events().Subscribe("recovery row", [this](const EngineEvent& e) { set->OnMoved(*set->ByName(e.slot), e.row); });
    set->events().Subscribe("action",
                            [this](const EngineEvent& e) { set->Apply(*set->ByName(e.slot), e.row, e.cause); });
  }
  ~EngineRig() {
    set.reset();
    http.CancelAll();
  }

  EngineSlot& a() { return *set->ByName("a"); }
  EngineSlot& b() { return *set->ByName("b"); }
  bool Told(const std::string& what) const { return std::find(told.begin(), told.end(), what) != told.end(); }
  // The position of a hook call in `told` (told.size() when absent).
  size_t At(const std::string& what) const {
    return static_cast<size_t>(std::find(told.begin(), told.end(), what) - told.begin());
  }
  // The process of slot s exits with code (or signal) and the exit is seen.
  void Exit(EngineSlot& s, int code, int sig = 0) {
    procs.Exit(s.pid, code, sig);
    procs.Deliver();
  }
};

TEST_CASE("engine set: each start gets its own port, nonce, control token and slot name, and is recorded before it "
          "can be missed",
          "[supervisor][engines]") {
  EngineRig rig;
  rig.set->Start();
  REQUIRE(rig.specs.size() == 2);
  CHECK(rig.set->started());
  std::set<std::string> nonces, tokens, slots;
  std::set<int> ports;
  for (const ChildSpec& spec : rig.specs) {
    nonces.insert(EnvOf(spec, "WSUP_ENGINE_NONCE"));
    tokens.insert(EnvOf(spec, http::kControlTokenEnv));
    slots.insert(EnvOf(spec, "WSUP_ENGINE_SLOT"));
    CHECK_FALSE(EnvOf(spec, kDeathFdEnv).empty());
  }
  CHECK(nonces.size() == 2);
  CHECK(tokens.size() == 2);
  CHECK(slots == std::set<std::string>{"a", "b"});
  for (EngineSlot* s : rig.set->slots()) {
    CHECK(s->state == SlotState::kStarting);
    CHECK(s->pid > 0);
    CHECK(s->port > 0);
    ports.insert(s->port);
    CHECK(s->recovery_cause == "cold start");
    CHECK(s->watch != nullptr);
    CHECK(s->death != nullptr);
  }
  CHECK(ports.size() == 2);
  CHECK(std::count(rig.told.begin(), rig.told.end(), "save") == 2);
  // A second Start() starts nothing.
  rig.set->Start();
  CHECK(rig.specs.size() == 2);
  SECTION("a node that is stopping starts nothing") {
    EngineRig stopping;
    stopping.stopping = true;
    stopping.set->Start();
    CHECK(stopping.specs.empty());
  }
}

TEST_CASE("engine set: a crashed engine is restarted after its backoff, a kill drill's at once, and a crash loop is "
          "given up with the node degraded",
          "[supervisor][engines]") {
  EngineRig rig;
  rig.set->Start();
  EngineSlot& a = rig.a();
  const pid_t first = a.pid;
  rig.Exit(a, 1);
  CHECK(a.state == SlotState::kFailed);
  CHECK(a.pid == 0);
  // What the exit tells, in order: the failover that the process is gone,
  // the KV pool only after the table moved, the node last.
  CHECK(rig.At("gone a") < rig.At("kv_exit a"));
  CHECK(rig.At("kv_exit a") < rig.At("exited"));
  // The first restart after a quiet period is at once.
  rig.Advance(0);
  REQUIRE(rig.specs.size() == 3);
  CHECK(a.state == SlotState::kStarting);
  CHECK(a.pid != first);
  // Never proven since: still the recovery of its cold start.
  CHECK(a.recovery_cause == "cold start");
  // The next within the window backs off.
  rig.Exit(a, 1);
  rig.Advance(999);
  CHECK(rig.specs.size() == 3);
  rig.Advance(1);
  REQUIRE(rig.specs.size() == 4);
  CHECK(a.throttle.total() == 2);
  // /metrics: each move counted by from and to, the state one-hot.
  const std::string m = rig.metrics.Render();
  auto has = [&](const std::string& line) { return m.find(line + "\n") != std::string::npos; };
  const std::string slot = "slot=\"" + a.name + "\"";
  CHECK(has("wsup_engine_transitions_total{" + slot + ",from_state=\"idle\",to_state=\"starting\"} 1"));
  CHECK(has("wsup_engine_transitions_total{" + slot + ",from_state=\"starting\",to_state=\"failed\"} 2"));
  CHECK(has("wsup_engine_transitions_total{" + slot + ",from_state=\"failed\",to_state=\"starting\"} 2"));
  CHECK(has("wsup_engine_state{" + slot + ",state=\"starting\"} 1"));
  CHECK(has("wsup_engine_state{" + slot + ",state=\"failed\"} 0"));
  CHECK(has("wsup_engine_state{" + slot + ",state=\"stopped\"} 0"));

  SECTION("a kill drill's exit is restarted at once and not counted") {
    a.drill_kill = true;
    rig.Exit(a, -1, SIGKILL);
    rig.Advance(0);
    CHECK(rig.specs.size() == 5);
    CHECK(a.throttle.total() == 2);
  }
  SECTION("more crashes than the budget: given up, degraded") {
    for (int i = 0; i < 4 && a.pid > 0; ++i) {
      rig.Exit(a, 1);
      rig.Advance(4000);
    }
    CHECK(a.state == SlotState::kFailed);
    REQUIRE(rig.degraded.size() == 1);
    CHECK(rig.degraded[0].find("engine a failed") != std::string::npos);
    const size_t spawned = rig.specs.size();
    rig.Advance(60'000);
    CHECK(rig.specs.size() == spawned);
  }
  SECTION("exit 78, a configuration that cannot work: never restarted") {
    rig.Exit(a, kExitConfig);
    rig.Advance(60'000);
    CHECK(rig.specs.size() == 4);
    REQUIRE(rig.degraded.size() == 1);
    CHECK(rig.degraded[0].find("its configuration cannot work") != std::string::npos);
    CHECK(a.permanent_failure);
  }
  SECTION("a stopping node restarts nothing") {
    rig.stopping = true;
    rig.Exit(a, 1);
    rig.Advance(60'000);
    CHECK(rig.specs.size() == 4);
  }
}

TEST_CASE("engine set: a rollout's version that cannot be started fails that version, and a slot whose process ran "
          "another version restarts the node's at once",
          "[supervisor][engines]") {
  EngineRig rig;
  rig.set->Start();
  EngineSlot& b = rig.b();
  const uint64_t restarts = b.throttle.total();
  b.version = EngineVersion{{rig.dir.Join("engine"), "--port", "{no_such_placeholder}"}, {}};
  rig.Exit(b, 1);
  rig.Advance(1000);
  CHECK(rig.Told("version_failed b"));
  const uint64_t counted = b.throttle.total();
  CHECK(counted == restarts + 1);
  CHECK(rig.specs.size() == 2);
  CHECK(rig.fatal.empty());  // the node goes on

  // The rolled-back slot: its process ran the failed version, and the
  // node's starts at once, outside the crash-loop budget.
  b.version.reset();
  b.runs = EngineVersion{{"/other/engine"}, {}};
  rig.set->ScheduleRestart(b, 1);
  rig.Advance(0);
  REQUIRE(rig.specs.size() == 3);
  CHECK(EnvOf(rig.specs.back(), "WSUP_ENGINE_SLOT") == "b");
  CHECK(b.recovery_cause == "rollout rolled back");
  CHECK(b.throttle.total() == counted);
}

TEST_CASE("engine set: a rollout's start of a slot is dated now, runs off the call, and only once engines may start "
          "and while the slot is stopped or idle",
          "[supervisor][engines]") {
  EngineRig rig;
  EngineSlot& a = rig.a();
  a.recovery_failover_id = 7;
  rig.set->SpawnAsRecovery(a, "rollout");
  CHECK(a.recovery_cause == "rollout");
  CHECK(a.recovery_fault_ms == rig.clock.WallMs());
  CHECK_FALSE(a.recovery_failover_id);
  CHECK(rig.specs.empty());  // off the call
  rig.Advance(0);
  CHECK(rig.specs.empty());  // the set has not started: its Start() starts the idle slot
  rig.set->Start();
  REQUIRE(rig.specs.size() == 2);
  rig.set->SpawnAsRecovery(a, "rollout");
  rig.Advance(0);
  CHECK(rig.specs.size() == 2);  // it runs already
  rig.set->Fire(a, SlotEvent::kStop, "rollout: the old version stops");
  rig.Exit(a, 0);
  REQUIRE(a.state == SlotState::kStopped);
  SECTION("stopped: started with its version") {
    rig.set->SpawnAsRecovery(a, "rollout");
    rig.Advance(0);
    CHECK(rig.specs.size() == 3);
    CHECK(a.state == SlotState::kStarting);
  }
  SECTION("the node stops meanwhile: nothing starts") {
    rig.set->SpawnAsRecovery(a, "rollout");
    rig.stopping = true;
    rig.Advance(0);
    CHECK(rig.specs.size() == 2);
  }
}

TEST_CASE("engine set: the node's own command that cannot be expanded stops the node with 78", "[supervisor][engines]") {
  EngineRig rig;
  rig.cfg.engine.command = {rig.dir.Join("engine"), "{no_such_placeholder}"};
  rig.set->Start();
  REQUIRE_FALSE(rig.fatal.empty());
  CHECK(rig.fatal[0].second == kExitConfig);
  CHECK(rig.fatal[0].first.find("no_such_placeholder") != std::string::npos);
}

TEST_CASE("engine set: a failed active engine is killed and its failover dated at its last good answer, a drill's at "
          "the drill",
          "[supervisor][engines]") {
  EngineRig rig;
  rig.set->Start();
  EngineSlot& a = rig.a();
  a.state = SlotState::kActive;
  const pid_t pid = a.pid;
  SECTION("a probe trip after a good answer") {
    a.last_ok_wall = rig.clock.WallMs() - 700;
    const int64_t last_good = a.last_ok_wall;
    rig.clock.AdvanceMs(10);
    rig.set->Fire(a, SlotEvent::kProbeTrip, "3 probes failed");
    CHECK(a.state == SlotState::kFailed);
    CHECK(rig.Told("failed a probe " + std::to_string(last_good) + " process"));
    CHECK_FALSE(rig.procs.Alive(pid));  // SIGKILLed
  }
  SECTION("a kill drill") {
    a.drill_kill = true;
    a.drill_fault_ms = 1234;
    rig.Exit(a, -1, SIGKILL);
    // Its exit came first: the failover is told there is no process left.
    CHECK(rig.Told("failed a drill 1234 none drill"));
  }
}

TEST_CASE("engine set: an engine dying while it serves has its requests cut at the front, one dying while it starts "
          "waits for its exit",
          "[supervisor][engines]") {
  EngineRig rig;
  rig.set->Start();
  EngineSlot& a = rig.a();
  EngineSlot& b = rig.b();
  a.state = SlotState::kActive;
  rig.procs.kill_is_slow = true;
  // Its lifeline closes before its exit (a GPU engine's teardown).
  rig.procs.Dying(a.pid);
  rig.procs.Dying(b.pid);
  REQUIRE(rig.Until([&] { return a.state == SlotState::kFailed; }));
  CHECK(rig.Told("cut 127.0.0.1:" + std::to_string(a.port)));
  CHECK(b.state == SlotState::kStarting);
  CHECK_FALSE(rig.Told("cut 127.0.0.1:" + std::to_string(b.port)));
}

TEST_CASE("engine set: a slot proven ready again gets one recovery row, with its cause and cache result",
          "[supervisor][engines]") {
  EngineRig rig;
  rig.set->Start();
  EngineSlot& a = rig.a();
  a.cache_result = "hit";
  rig.set->Fire(a, SlotEvent::kEngineReady, "ready");
  rig.set->Fire(a, SlotEvent::kProbePass, "probe passed");
  REQUIRE(rig.recoveries.size() == 1);
  CHECK(rig.recoveries[0].slot == "a");
  CHECK(rig.recoveries[0].cause == "cold start");
  CHECK(rig.recoveries[0].cache_result == "hit");
  CHECK(a.recovery_cause.empty());
  // Promoted and demoted again: no second row.
  rig.set->Fire(a, SlotEvent::kPromote, "test");
  rig.set->Fire(a, SlotEvent::kDemote, "test");
  rig.set->Fire(a, SlotEvent::kDrained, "test");
  CHECK(rig.recoveries.size() == 1);
}

TEST_CASE("engine set: a standby is promoted only when fit, and an unfit one is failed instead", "[supervisor][engines]") {
  EngineRig rig;
  rig.set->Start();
  EngineSlot& b = rig.b();
  b.state = SlotState::kStandby;
  SECTION("proven just now") {
    b.last_ok_mono = rig.clock.MonotonicMs();
    std::string unfit;
    CHECK(rig.set->Promote(b, "test", &unfit));
    CHECK(unfit.empty());
    CHECK(rig.set->Active() == &b);
    CHECK(rig.Told("routes"));
  }
  SECTION("its process is gone") {
    rig.procs.kill_is_slow = true;
    REQUIRE(rig.procs.Signal(b.pid, SIGKILL).ok());
    rig.procs.Exit(b.pid, -1, SIGKILL);  // dead, its exit not reaped yet
    std::string unfit;
    CHECK_FALSE(rig.set->Promote(b, "test", &unfit));
    CHECK_FALSE(unfit.empty());
    CHECK(b.state == SlotState::kFailed);
    CHECK(rig.set->Active() == nullptr);
  }
}

TEST_CASE("engine set: a restarted supervisor adopts a recorded engine that still runs and listens, replaces one "
          "never proven, and forgets one that is gone",
          "[supervisor][engines]") {
  EngineRig rig;
  // A process that runs: spawned by the fake launcher outside the set.
  ChildSpec other;
  other.argv = {rig.dir.Join("engine")};
  other.env_set = {{"WSUP_ENGINE_SLOT", "a"}};
  auto pid = rig.procs.Spawn(other);
  REQUIRE(pid.ok());
  RuntimeState::Engine pe;
  pe.slot = "a";
  pe.proc = ProcessRef{*pid, static_cast<uint64_t>(*pid)};
  pe.port = 4321;
  pe.role = "standby";
  pe.nonce = "n1";
  pe.control_token = "t1";
  SECTION("adopted") {
    CHECK(rig.set->Adopt(pe, "v1") == EngineSet::Adoption::kAdopted);
    EngineSlot& a = rig.a();
    CHECK(a.pid == *pid);
    CHECK(a.adopted);
    CHECK(a.control_token == "t1");
    CHECK(a.version_text == "v1");
    CHECK(a.state == SlotState::kStandby);
    CHECK(a.monitor != nullptr);  // probed from here on
    // Its exit is seen.
    rig.Exit(a, 1);
    CHECK(a.state == SlotState::kFailed);
  }
  SECTION("never proven: killed, the slot starts afresh") {
    pe.role = "starting";
    CHECK(rig.set->Adopt(pe, "") == EngineSet::Adoption::kReplaced);
    CHECK_FALSE(rig.procs.Alive(*pid));
    CHECK(rig.a().pid == 0);
  }
  SECTION("another process has its pid now") {
    pe.proc.start_time += 1;
    CHECK(rig.set->Adopt(pe, "") == EngineSet::Adoption::kGone);
    CHECK(rig.procs.Alive(*pid));
  }
  SECTION("no such slot") {
    pe.slot = "c";
    CHECK(rig.set->Adopt(pe, "") == EngineSet::Adoption::kGone);
  }
}

TEST_CASE("engine set: the status of each slot says its role, process and how its death would be seen",
          "[supervisor][engines]") {
  EngineRig rig;
  rig.set->Start();
  rig.a().state = SlotState::kActive;
  rig.b().kv_capable = false;
  const nlohmann::json st = rig.set->StatusJson(true);
  REQUIRE(st.size() == 2);
  CHECK(st[0]["slot"] == "a");
  CHECK(st[0]["role"] == "active");
  CHECK(st[0]["pid"] == rig.a().pid);
  CHECK(st[0]["death_seen_by"] == "lifeline");  // its death word is not armed by a fake engine
  CHECK(st[1]["role"] == "none");
  CHECK(st[1]["kv"]["source"] == "private");
  CHECK_FALSE(rig.set->StatusJson(false)[1].contains("kv"));
}

}  // namespace
}  // namespace wsup
