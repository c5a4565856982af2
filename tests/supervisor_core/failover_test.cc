// Failover (supervisor/failover.h) on its own: two fake engine slots behind
// its hooks, a fake ledger, fake timers, and the probe through the front
// held by the test, which answers it when it chooses. Each test checks what
// was done to the engines, the ledger row with its times, and what the
// `wsup failover` caller was told. Nothing sleeps: the proof's budget runs
// out when the test advances the fake clock.
#include <catch2/catch.hpp>

#include <uv.h>

#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "supervisor/failover.h"
#include "tests/fake_timers.h"

namespace wsup {
namespace {

using nlohmann::json;
using testing::FakeTimers;

struct FailRig {
  FakeClock clock;
  FakeTimers timers{&clock};
  std::map<std::string, SlotState> slots{{"a", SlotState::kActive}, {"b", SlotState::kStandby}};
  // Why the promotion check refuses the standby; "" lets it through.
  std::string unfit;
  // What the check before a planned swap says of the standby (its unfit
  // and note), and the rollout step in progress ("" when none).
  PromotionCheck check;
  std::string rollout_step;
  // The front's answers about a draining engine, asked and unanswered.
  std::vector<std::function<void(int64_t)>> inflight_asks;
  // What was done to the engines and the front, in order.
  std::vector<std::string> ops;
  // The fake ledger's failovers rows, by id.
  std::map<int64_t, FailoverRecord> rows;
  int64_t next_id = 1;
  uint64_t next_seq = 1;
  // The probes through the front sent so far, unanswered.
  std::vector<std::function<void(bool, int64_t)>> probes;
  // What callers were told at once, and what once the rows were on disk.
  std::vector<json> sent, answered;
  int ended = 0;
  std::unique_ptr<Failover> fo;

  // A `wsup failover` caller: a connection on a loop of the test's, never
  // connected (the hooks see who is waiting; nothing is written).
  uv_loop_t loop{};
  std::vector<std::shared_ptr<JsonConn>> conns;

  FailRig() {
    uv_loop_init(&loop);
    fo = std::make_unique<Failover>(timers, clock, Hooks());
  }
  ~FailRig() {
    fo.reset();
    for (auto& c : conns) c->Close("test over");
    conns.clear();
    uv_run(&loop, UV_RUN_DEFAULT);
    // Every caller's pipe was closed and freed in its close callback.
    CHECK(uv_loop_close(&loop) == 0);
  }
  std::shared_ptr<JsonConn> Caller() {
    conns.push_back(std::make_shared<JsonConn>(&loop, 1 << 16));
    return conns.back();
  }

  Failover::Hooks Hooks() {
    Failover::Hooks h;
    h.state = [this](const std::string& s) -> std::optional<SlotState> {
      auto it = slots.find(s);
      if (it == slots.end()) return std::nullopt;
      return it->second;
    };
    h.other = [](const std::string& s) -> std::string { return s == "a" ? "b" : "a"; };
    h.promote = [this](const std::string& s, const std::string& cause) {
      ops.push_back("promote " + s + " (" + cause + ")");
      Failover::Promotion p;
      if (!unfit.empty()) {
        p.unfit = unfit;
        slots[s] = SlotState::kFailed;
        return p;
      }
      slots[s] = SlotState::kActive;
      p.promoted = true;
      return p;
    };
    h.push_routes = [this] { ops.push_back("routes"); };
    h.record_row = [this](const FailoverRecord& rec, uint64_t* seq) -> Result<int64_t> {
      const int64_t id = next_id++;
      rows[id] = rec;
      rows[id].id = id;
      *seq = next_seq++;
      return id;
    };
    h.set_gone = [this](int64_t id, int64_t ms) {
      rows[id].gone_ms = ms;
      return Status::Ok();
    };
    h.set_kv_full = [this](int64_t id, int64_t ms) {
      rows[id].kv_full_ms = ms;
      return Status::Ok();
    };
    h.set_first_ok = [this](int64_t id, int64_t ms, uint64_t* seq) {
      rows[id].first_ok_ms = ms;
      *seq = next_seq++;
      return Status::Ok();
    };
    h.ledger_error = [this](const Status& st, const char* what) {
      ops.push_back(std::string("ledger error ") + what + ": " + st.error().message());
    };
    h.ledger_last_error = [] { return std::string(); };
    h.counted = [this](const std::string& trigger) { ops.push_back("counted " + trigger); };
    h.phase = [this](const char* phase, double seconds) {
      ops.push_back(std::string("phase ") + phase + " " + std::to_string(std::lround(seconds * 1000)) + " ms");
    };
    h.pool_enabled = [] { return false; };
    h.pool_held_by = [](const std::string&) { return false; };
    h.rearm = [this](const std::string& s, const std::string& trigger, int64_t, std::optional<int64_t>) {
      ops.push_back("rearm " + s + " (" + trigger + ")");
    };
    h.postpone_probe = [this](const std::string& s) { ops.push_back("postpone " + s); };
    h.probe = [this](std::function<void(bool, int64_t)> done) {
      ops.push_back("probe");
      probes.push_back(std::move(done));
    };
    h.send = [this](const Failover::Waiters& waiters, const json& reply) {
      for (size_t i = 0; i < waiters.size(); ++i) sent.push_back(reply);
    };
    h.answer = [this](Failover::Waiters waiters, json reply, std::vector<uint64_t> rows_seen, std::string) {
      reply["rows"] = rows_seen.size();
      for (size_t i = 0; i < waiters.size(); ++i) answered.push_back(reply);
    };
    h.status_line = [] {};
    h.ended = [this] { ++ended; };
    h.active = [this] {
      for (const auto& [name, st] : slots) {
        if (st == SlotState::kActive) return name;
      }
      return std::string();
    };
    h.check = [this](const std::string&) { return check; };
    h.rollout_step = [this] { return rollout_step; };
    h.kill = [this](const std::string& s, int64_t fault_ms) {
      ops.push_back("kill " + s + " at " + std::to_string(fault_ms));
    };
    h.demote = [this](const std::string& s, const std::string& why) {
      ops.push_back("demote " + s + " (" + why + ")");
      slots[s] = SlotState::kDraining;
    };
    h.drained = [this](const std::string& s, const std::string& why) {
      ops.push_back("drained " + s + " (" + why + ")");
      slots[s] = SlotState::kStandby;
    };
    h.inflight = [this](const std::string&, std::function<void(int64_t)> done) {
      inflight_asks.push_back(std::move(done));
    };
    return h;
  }
};

TEST_CASE("failover: a crash swaps to the ready standby, and the first good answer proves it and dates its row",
          "[failover]") {
  FailRig r;
  const int64_t fault = r.clock.WallMs();
  r.clock.AdvanceMs(40);  // the crash is seen 40 ms after it happened
  r.fo->OnFailed("a", true, FailoverTrigger::kCrash, "exit signal 9", fault, false);

  CHECK(r.slots["b"] == SlotState::kActive);
  REQUIRE(r.rows.size() == 1);
  const FailoverRecord& row = r.rows.begin()->second;
  CHECK(row.trigger == "crash");
  CHECK(row.from_slot == "a");
  CHECK(row.to_slot == "b");
  CHECK(row.reason == "exit signal 9");
  CHECK(row.fault_ms == fault);
  CHECK(row.detected_ms == fault + 40);
  CHECK(row.swapped_ms == fault + 40);
  // Counted, with its phases so far (detect: 40 ms; swap: none on the
  // fake clock).
  CHECK(r.ops == std::vector<std::string>{"promote b (failover from a)", "routes", "counted crash",
                                          "phase detect 40 ms", "phase swap 0 ms", "rearm a (crash)", "postpone b",
                                          "probe"});
  CHECK(r.fo->InProgress());

  // The old engine's exit dates the row's gone_ms.
  r.clock.AdvanceMs(5);
  r.fo->OnEngineGone("a");
  CHECK(r.rows[row.id].gone_ms == fault + 45);

  // The probe through the front answers correctly: the failover ends.
  r.clock.AdvanceMs(15);
  REQUIRE(r.probes.size() == 1);
  r.probes[0](true, r.clock.WallMs());
  CHECK_FALSE(r.fo->InProgress());
  CHECK(r.rows[row.id].first_ok_ms == fault + 60);
  CHECK(r.ops.back() == "phase first_answer 60 ms");
  CHECK(r.ended == 1);
  CHECK(r.fo->PendingText().empty());
  // No budget is left to run out.
  CHECK(r.timers.armed() == 0);
}

TEST_CASE("failover: with no ready standby the promotion is refused and the row says why", "[failover]") {
  FailRig r;
  r.unfit = "its process is stopped (T)";
  const int64_t fault = r.clock.WallMs();
  r.fo->OnFailed("a", false, FailoverTrigger::kProbe, "3 probe failures", fault, false);

  REQUIRE(r.rows.size() == 1);
  const FailoverRecord& row = r.rows.begin()->second;
  CHECK(row.to_slot == "none");
  CHECK(row.reason == "3 probe failures; standby b not promoted: its process is stopped (T)");
  // Its process was already gone: gone_ms at once.
  CHECK(row.gone_ms == fault);
  // Nothing to prove yet: no probe, no budget, and `wsup status` says it waits.
  CHECK(r.probes.empty());
  CHECK(r.timers.armed() == 0);
  CHECK(r.fo->InProgress());
  CHECK(r.fo->PendingText().find("engine a to no engine yet") != std::string::npos);

  // A standby proven later takes over, and its proof begins.
  r.fo->OnPromoted("a");
  CHECK(r.probes.size() == 1);
  CHECK(r.fo->PendingText().find("engine a to engine a") != std::string::npos);
}

TEST_CASE("failover: a swap not proven within its budget ends unproven and its caller is told", "[failover]") {
  FailRig r;
  auto caller = r.Caller();
  const int64_t fault = r.clock.WallMs();
  r.fo->Drill(caller, true);
  CHECK(r.ops.back() == "kill a at " + std::to_string(fault));
  r.fo->OnFailed("a", true, FailoverTrigger::kDrill, "exit signal 9", fault, true);
  REQUIRE(r.probes.size() == 1);
  r.probes[0](false, 0);  // the probe through the front gave up
  CHECK(r.fo->InProgress());

  r.timers.Advance(Failover::kProofBudgetMs - 1);
  CHECK(r.fo->InProgress());
  CHECK(r.sent.empty());
  r.timers.Advance(1);
  CHECK_FALSE(r.fo->InProgress());
  REQUIRE(r.sent.size() == 1);
  CHECK(r.sent[0]["ok"] == false);
  CHECK(r.sent[0]["to_slot"] == "b");
  CHECK(r.sent[0]["error"] == "the failover no correct answer came through the front within 120 s of the swap");
  CHECK(r.answered.empty());
  CHECK(r.ended == 1);
  CHECK_FALSE(r.rows.begin()->second.first_ok_ms.has_value());
}

TEST_CASE("failover: a second failover asked for while one is pending is answered that one is in progress",
          "[failover]") {
  FailRig r;
  CHECK(r.fo->PlannedSwap("a", "b", "planned drill", r.Caller()));
  r.slots["a"] = SlotState::kStandby;
  r.clock.AdvanceMs(2'000);
  CHECK(r.fo->PendingText() ==
        "a failover is in progress (engine a to engine b, 2 s ago; it ends with the first correct answer through "
        "the front)");
  CHECK(r.fo->StatusJson()["in_progress"] == true);
  // `wsup failover` again: refused, and told why.
  const std::string refusal = r.fo->Refusal();
  REQUIRE_FALSE(refusal.empty());
  r.fo->Refuse(r.Caller(), refusal);
  REQUIRE(r.sent.size() == 1);
  CHECK(r.sent[0]["ok"] == false);
  CHECK(r.sent[0]["error"] == r.fo->PendingText() + "; try again once `wsup status` shows failover.in_progress false");
  CHECK(r.fo->InProgress());

  // The proof comes: the planned swap's caller is answered once its rows
  // are on disk, and the next failover is free to begin.
  r.fo->OnFirstOk(r.clock.WallMs());
  REQUIRE(r.answered.size() == 1);
  CHECK(r.answered[0]["ok"] == true);
  CHECK(r.answered[0]["first_ok_ms"] == 2'000);
  CHECK(r.answered[0]["rows"] == 2);
  CHECK(r.fo->PendingText().empty());
  CHECK(r.fo->StatusJson()["in_progress"] == false);
}

TEST_CASE("failover: a drill is refused, and its caller told why, with no active engine, a standby not fit or not "
          "proven recently, a failover pending or a rollout running",
          "[failover]") {
  FailRig r;
  REQUIRE_FALSE(r.fo->InProgress());
  std::string expect;
  SECTION("no active engine") {
    r.slots["a"] = SlotState::kFailed;
    expect = "no active engine to fail over from";
  }
  SECTION("the standby is starting") {
    r.slots["b"] = SlotState::kStarting;
    expect = "the standby (b) is starting, not proven ready";
  }
  SECTION("the standby is not fit") {
    r.check.unfit = "its process is stopped (state T)";
    expect = "the standby (b) is not fit to take the traffic: its process is stopped (state T)";
  }
  SECTION("the standby was not proven recently") {
    r.check.note = "its last good probe answer is 9000 ms old but it is promoted anyway";
    expect = "the standby (b) is not proven recently: its last good probe answer is 9000 ms old; try again";
  }
  SECTION("a rollout runs") {
    r.rollout_step = "swap";
    expect = "a rollout is in progress (step swap)";
  }
  SECTION("a failover is pending") {
    r.fo->OnFailed("a", true, FailoverTrigger::kCrash, "exit 1", r.clock.WallMs(), false);
    r.slots["a"] = SlotState::kStandby;
    r.ops.clear();
    expect = "a failover is in progress";
  }
  r.fo->Drill(r.Caller(), false);
  r.fo->Drill(r.Caller(), true);
  REQUIRE(r.sent.size() == 2);
  for (const json& reply : r.sent) {
    CHECK(reply["ok"] == false);
    CHECK_THAT(reply["error"].get<std::string>(), Catch::Contains(expect));
  }
  // Nothing was moved, killed or routed.
  CHECK(r.ops.empty());
}

TEST_CASE("failover: a planned swap moves both slots, pushes the routes once, and drains the old engine until the "
          "front has nothing in flight on it or its budget runs out",
          "[failover]") {
  FailRig r;
  CHECK(r.fo->PlannedSwap("a", "b", "rollout step", nullptr));
  REQUIRE(r.ops.size() >= 3);
  CHECK(r.ops[0] == "demote a (rollout step)");
  CHECK(r.ops[1] == "promote b (rollout step)");
  CHECK(r.ops[2] == "routes");
  CHECK(std::count(r.ops.begin(), r.ops.end(), "routes") == 1);
  CHECK(r.fo->InProgress());  // until its first correct answer
  REQUIRE(r.inflight_asks.size() == 1);
  SECTION("the front has requests there: asked again, drained once none is left") {
    auto ask = std::move(r.inflight_asks[0]);
    r.inflight_asks.clear();
    ask(3);
    CHECK(r.slots["a"] == SlotState::kDraining);
    r.timers.Advance(Failover::kDrainPollMs);
    REQUIRE(r.inflight_asks.size() == 1);
    r.inflight_asks[0](0);
    CHECK(r.slots["a"] == SlotState::kStandby);
    CHECK(r.ops.back() == "drained a (no request in flight)");
  }
  SECTION("requests never end: the budget ends the drain") {
    for (int i = 0; i < 100'000 && r.slots["a"] == SlotState::kDraining; ++i) {
      REQUIRE(r.inflight_asks.size() == 1);
      auto ask = std::move(r.inflight_asks[0]);
      r.inflight_asks.clear();
      ask(1);
      if (r.slots["a"] != SlotState::kDraining) break;
      r.timers.Advance(Failover::kDrainPollMs);
    }
    CHECK(r.slots["a"] == SlotState::kStandby);
    CHECK(r.ops.back() == "drained a (drain budget of 30 s ran out with requests in flight)");
    CHECK(r.clock.MonotonicMs() >= 1'000'000 + Failover::kDrainBudgetMs);
  }
  SECTION("taken back as the active engine while draining: no drained") {
    r.slots["a"] = SlotState::kActive;
    r.inflight_asks[0](0);
    CHECK(r.ops.back() != "drained a (no request in flight)");
    CHECK(r.slots["a"] == SlotState::kActive);
  }
}

TEST_CASE("failover: a planned swap onto a standby found unfit at the promotion moves no traffic, and its row says why",
          "[failover]") {
  FailRig r;
  r.unfit = "its process is gone";
  auto caller = r.Caller();
  CHECK_FALSE(r.fo->PlannedSwap("a", "b", "planned drill", caller));
  CHECK(r.slots["b"] == SlotState::kFailed);
  // Its row says so; no engine took the traffic, so there is nothing to
  // prove yet (an engine promoted later is: OnPromoted).
  REQUIRE(r.rows.size() == 1);
  CHECK(r.rows.begin()->second.to_slot == "none");
  CHECK_THAT(r.rows.begin()->second.reason, Catch::Contains("standby b not promoted: its process is gone"));
  CHECK(r.probes.empty());
  r.fo->OnPromoted("a");
  CHECK(r.probes.size() == 1);
}

}  // namespace
}  // namespace wsup
