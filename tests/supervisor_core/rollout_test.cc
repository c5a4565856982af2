// Rollout (supervisor/rollout.h) on its own: two fake engine slots behind
// its hooks, a fake ledger, fake timers. The fake engines move as the real
// ones would (a stop ends stopped, a start ends proven, a swap drains the
// old active into a standby) once the test runs what they were asked
// (Settle()), and each move is told to the Rollout as an engine event.
// Each test checks the order of what was done to the engines, the slots'
// versions at the end, and the ledger row. Nothing sleeps.
#include <catch2/catch.hpp>

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "supervisor/reload_plan.h"
#include "supervisor/rollout.h"
#include "tests/fake_timers.h"

namespace wsup {
namespace {

using testing::FakeTimers;

const EngineVersion kOld{{"/bin/engine-v1", "--port", "{port}"}, {}};
const EngineVersion kNew{{"/bin/engine-v2", "--port", "{port}"}, {{"V", "2"}}};

struct FakeSlot {
  SlotState state = SlotState::kStandby;
  bool has_process = true;
  bool restart_armed = false;
  std::optional<EngineVersion> runs;
  std::optional<EngineVersion> version;  // for its next starts (the rollout's)
};

struct RollRig {
  FakeClock clock;
  FakeTimers timers{&clock};
  Config cfg;
  std::map<std::string, FakeSlot> slots;
  // What was done to the engines, in order ("stop b", "spawn b v2", ...).
  std::vector<std::string> ops;
  // Work the fake engines were asked for, run by Settle().
  std::deque<std::function<void()>> queued;
  bool failover_pending = false;
  // The fake ledger's rollouts rows, by id.
  std::map<int64_t, RolloutRecord> rows;
  int64_t next_id = 1;
  std::vector<nlohmann::json> answers;
  std::vector<std::string> counted;
  int saves = 0;
  std::unique_ptr<Rollout> roll;

  RollRig() {
    cfg.engine.command = kOld.command;
    cfg.engine.env = kOld.env;
    cfg.engine.ready_timeout_ms = 10'000;
    cfg.engine.stop_timeout_ms = 5'000;
    cfg.supervisor.rollout_watch_ms = 30'000;
    cfg.supervisor.restart_backoff_max_ms = 4'000;
    slots["a"] = FakeSlot{SlotState::kActive, true, false, kOld, std::nullopt};
    slots["b"] = FakeSlot{SlotState::kStandby, true, false, kOld, std::nullopt};
  }

  static std::string Tag(const EngineVersion& v) { return v == kNew ? "v2" : "v1"; }
  EngineVersion NodeVersion() const { return VersionOf(cfg); }

  // Moves a slot and tells the rollout, as the engine table's publication does.
  void Move(const std::string& name, SlotState to, const std::string& cause) {
    FakeSlot& s = slots[name];
    const SlotState from = s.state;
    s.state = to;
    roll->OnEngineEvent(EngineEvent{name, SlotTransition{from, SlotEvent::kSpawn, to, SlotAction::kNone}, cause});
  }
  // A start that the fake engine then proves (starting, then standby).
  void Start(const std::string& name) {
    FakeSlot& s = slots[name];
    s.runs = s.version ? *s.version : NodeVersion();
    s.has_process = true;
    s.restart_armed = false;
    ops.push_back("spawn " + name + " " + Tag(*s.runs));
    Move(name, SlotState::kStarting, "spawned");
    queued.push_back([this, name] {
      if (slots[name].state == SlotState::kStarting) Move(name, SlotState::kStandby, "probe passed");
    });
  }
  // Runs what the fake engines were asked, and what that asks in turn.
  void Settle() {
    for (int i = 0; i < 100 && !queued.empty(); ++i) {
      auto work = std::move(queued.front());
      queued.pop_front();
      work();
    }
    REQUIRE(queued.empty());
  }

  Rollout::Hooks Hooks() {
    Rollout::Hooks h;
    h.slot = [this](const std::string& name) -> std::optional<Rollout::SlotView> {
      auto it = slots.find(name);
      if (it == slots.end()) return std::nullopt;
      return Rollout::SlotView{it->second.state, it->second.has_process, it->second.restart_armed, it->second.runs};
    };
    h.set_version = [this](const std::string& name, const std::optional<EngineVersion>& v) { slots[name].version = v; };
    // Off the current call, as the supervisor's start is.
    h.spawn = [this](const std::string& name, const std::string&) {
      queued.push_back([this, name] {
        const SlotState st = slots[name].state;
        if (st == SlotState::kStopped || st == SlotState::kIdle) Start(name);
      });
    };
    h.stop = [this](const std::string& name, const std::string&) {
      ops.push_back("stop " + name);
      Move(name, SlotState::kStopping, "stop");
      queued.push_back([this, name] {
        slots[name].has_process = false;
        Move(name, SlotState::kStopped, "exited");
      });
    };
    h.restart = [this](const std::string& name) {
      slots[name].restart_armed = true;
      queued.push_back([this, name] { Start(name); });
    };
    h.swap_refusal = [this](const std::string& from, const std::string& to) -> std::string {
      return slots[from].state == SlotState::kActive && slots[to].state == SlotState::kStandby ? "" : "not swappable";
    };
    h.swap = [this](const std::string& from, const std::string& to, const std::string&) {
      ops.push_back("swap " + from + "->" + to);
      Move(to, SlotState::kActive, "promoted");
      Move(from, SlotState::kDraining, "draining");
      queued.push_back([this, from] { Move(from, SlotState::kStandby, "drained"); });
      return true;
    };
    h.failover_pending = [this] { return failover_pending; };
    h.stopping = [] { return false; };
    h.set_node_version = [this](const EngineVersion& v) {
      cfg.engine.command = v.command;
      cfg.engine.env = v.env;
    };
    h.record_row = [this](const RolloutRecord& rec) -> Result<int64_t> {
      RolloutRecord r = rec;
      r.id = next_id++;
      rows[r.id] = r;
      return r.id;
    };
    h.update_row = [this](const RolloutRecord& rec) -> Status {
      if (!rows.count(rec.id)) return NotFound("rollout row " + std::to_string(rec.id));
      rows[rec.id] = rec;
      return Status();
    };
    h.answer = [this](std::vector<std::shared_ptr<JsonConn>>, nlohmann::json reply) { answers.push_back(reply); };
    h.counted = [this](const std::string& outcome) { counted.push_back(outcome); };
    h.save_state = [this] { saves++; };
    return h;
  }
  void Make() { roll = std::make_unique<Rollout>(timers, clock, cfg, Hooks()); }
};

TEST_CASE("rollout: the new version goes on the standby first, takes the traffic, is watched, then replaces the old",
          "[rollout]") {
  RollRig r;
  r.Make();
  r.roll->Begin("b", "a", kNew, "test", nullptr);
  REQUIRE(r.roll->InProgress());
  REQUIRE(r.rows.size() == 1);
  CHECK(r.rows[1].outcome == "running");
  r.Settle();
  // The standby was replaced and proven; the swap's drain has ended.
  CHECK(r.roll->StepName() == "watching");
  CHECK(r.slots["b"].state == SlotState::kActive);
  CHECK(r.slots["b"].runs == kNew);
  CHECK(r.slots["a"].runs == kOld);
  // Not before the watch window has passed.
  r.timers.Advance(r.cfg.supervisor.rollout_watch_ms - 1);
  CHECK(r.roll->StepName() == "watching");
  r.timers.Advance(1);
  r.Settle();
  CHECK_FALSE(r.roll->InProgress());
  CHECK(r.ops == std::vector<std::string>{"stop b", "spawn b v2", "swap a->b", "stop a", "spawn a v2"});
  CHECK(r.slots["a"].runs == kNew);
  CHECK(r.slots["a"].state == SlotState::kStandby);
  CHECK(r.NodeVersion() == kNew);
  CHECK_FALSE(r.slots["a"].version.has_value());
  CHECK_FALSE(r.slots["b"].version.has_value());
  CHECK(r.rows[1].outcome == "done");
  CHECK(r.rows[1].ended_ms > 0);
  auto steps = nlohmann::json::parse(r.rows[1].steps_json);
  std::vector<std::string> names;
  for (const auto& s : steps) names.push_back(s["step"].get<std::string>());
  CHECK(names == std::vector<std::string>{"stopping_standby", "starting_new", "swapping", "watching", "stopping_old",
                                          "starting_old", "done"});
  REQUIRE(r.answers.size() == 1);
  CHECK(r.answers[0]["ok"] == true);
  CHECK(r.answers[0]["outcome"] == "done");
  CHECK(r.counted == std::vector<std::string>{"done"});
  CHECK(r.roll->StatusJson()["last"]["outcome"] == "done");
  // Its timers were stopped with it.
  CHECK(r.timers.armed() == 0);
}

TEST_CASE("rollout: a probe failure of the new version while it is watched rolls both slots back to the old one",
          "[rollout]") {
  RollRig r;
  r.Make();
  r.roll->Begin("b", "a", kNew, "test", nullptr);
  r.Settle();
  REQUIRE(r.roll->StepName() == "watching");
  r.timers.Advance(1000);
  // The new active trips its probe. As in the node, the failover that
  // puts the old standby in front is published before the rollout hears
  // of the failure (the table's action is subscribed before it).
  r.Move("a", SlotState::kActive, "promoted: engine b failed");
  r.slots["b"].has_process = false;
  r.Move("b", SlotState::kFailed, "probe tripped: wrong answers");
  r.Settle();
  CHECK_FALSE(r.roll->InProgress());
  CHECK(r.rows[1].outcome == "rolled_back");
  CHECK(r.rows[1].reason.find("probe tripped") != std::string::npos);
  // Both run the old version; the new one is started on neither again.
  CHECK(r.slots["a"].runs == kOld);
  CHECK(r.slots["b"].runs == kOld);
  CHECK(r.slots["a"].state == SlotState::kActive);
  CHECK(r.slots["b"].state == SlotState::kStandby);
  CHECK(r.ops.back() == "spawn b v1");
  CHECK(r.NodeVersion() == kOld);
  REQUIRE(r.answers.size() == 1);
  CHECK(r.answers[0]["ok"] == false);
  CHECK(r.answers[0]["outcome"] == "rolled_back");
  CHECK(r.counted == std::vector<std::string>{"rolled_back"});
  CHECK(r.timers.armed() == 0);
}

RuntimeState::Rollout Persisted(const std::string& step, bool new_proven) {
  RuntimeState::Rollout p;
  p.id = 7;
  p.step = step;
  p.new_slot = "b";
  p.old_slot = "a";
  p.started_ms = 500'000;
  p.from = kOld;
  p.to = kNew;
  p.new_proven = new_proven;
  p.command_before = "engine-v1";
  p.command_after = "engine-v2";
  p.steps_json = R"([{"step":"stopping_standby","slot":"b","at_ms":500000,"why":"reload"}])";
  return p;
}

TEST_CASE("rollout: a supervisor restarted while the new version was watched ends that row and finishes the roll",
          "[rollout]") {
  RollRig r;
  // What the restarted supervisor adopted: the new version serves on b.
  r.slots["b"] = FakeSlot{SlotState::kActive, true, false, kNew, std::nullopt};
  r.slots["a"] = FakeSlot{SlotState::kStandby, true, false, kOld, std::nullopt};
  r.rows[7] = RolloutRecord{};
  r.rows[7].id = 7;
  r.rows[7].outcome = "running";
  r.next_id = 8;
  r.Make();
  r.roll->Resume(Persisted("watching", true));
  CHECK(r.rows[7].outcome == "interrupted");
  CHECK(r.rows[7].ended_ms > 0);
  CHECK(r.rows[7].reason.find("the roll is finished") != std::string::npos);
  CHECK(nlohmann::json::parse(r.rows[7].steps_json).size() == 2);
  // A roll of its own, from the watch window.
  REQUIRE(r.roll->InProgress());
  CHECK(r.roll->StepName() == "watching");
  CHECK(r.NodeVersion() == kOld);
  r.timers.Advance(r.cfg.supervisor.rollout_watch_ms);
  r.Settle();
  CHECK_FALSE(r.roll->InProgress());
  CHECK(r.rows[8].outcome == "done");
  CHECK(r.slots["a"].runs == kNew);
  CHECK(r.NodeVersion() == kNew);
  CHECK(r.counted == std::vector<std::string>{"interrupted", "done"});
}

TEST_CASE("rollout: a supervisor restarted before the new version was proven rolls it back, its lost row written whole",
          "[rollout]") {
  RollRig r;
  // The new version's engine runs on b as a standby, never proven serving.
  r.slots["b"] = FakeSlot{SlotState::kStandby, true, false, kNew, std::nullopt};
  r.slots["a"] = FakeSlot{SlotState::kActive, true, false, kOld, std::nullopt};
  // The ledger never got row 7 (the old supervisor's write was lost).
  r.Make();
  r.roll->Resume(Persisted("starting_new", false));
  REQUIRE(r.rows.count(1));
  CHECK(r.rows[1].outcome == "interrupted");
  CHECK(r.rows[1].reason.find("not proven serving") != std::string::npos);
  r.Settle();
  CHECK_FALSE(r.roll->InProgress());
  REQUIRE(r.rows.count(2));
  CHECK(r.rows[2].outcome == "rolled_back");
  CHECK(r.slots["b"].runs == kOld);
  CHECK(r.slots["b"].state == SlotState::kStandby);
  CHECK(r.ops == std::vector<std::string>{"stop b", "spawn b v1"});
  CHECK(r.NodeVersion() == kOld);
}

TEST_CASE("rollout: a state.json naming no slot ends the row and starts no roll", "[rollout]") {
  RollRig r;
  r.Make();
  auto p = Persisted("watching", true);
  p.new_slot = "z";
  r.roll->Resume(p);
  CHECK_FALSE(r.roll->InProgress());
  REQUIRE(r.rows.count(1));
  CHECK(r.rows[1].outcome == "interrupted");
  CHECK(r.ops.empty());
}

}  // namespace
}  // namespace wsup
