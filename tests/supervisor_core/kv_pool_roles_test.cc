// KvPoolRoles (supervisor/kv_pool_roles.h) on its own: two engine slots,
// the role requests held by the test, which answers them when it chooses,
// and fake timers. Each test checks what was asked of the engines, what the
// pool's table did, and what was fenced or moved. Nothing sleeps: held
// work runs when the test advances the fake clock.
#include <catch2/catch.hpp>

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "supervisor/kv_pool_roles.h"
#include "tests/fake_timers.h"

namespace wsup {
namespace {

using nlohmann::json;
using testing::FakeTimers;

struct PoolRig {
  // A role or status request sent to an engine, unanswered yet.
  struct Sent {
    std::string slot;
    http::ClientRequest req;
    KvPoolRoles::Answer done;
    json Body() const { return json::parse(req.body); }
  };

  FakeClock clock;
  FakeTimers timers{&clock};
  Metrics metrics;
  Config cfg;
  EngineSlot a{timers, "a", RestartPolicy{}};
  EngineSlot b{timers, "b", RestartPolicy{}};
  std::vector<Sent> sent;
  // What the pool did to the node, in order ("fire b kv_trespass",
  // "fence b of a", "kv_full a", "refresh b", "save").
  std::vector<std::string> ops;
  std::vector<std::unique_ptr<Timer>> later;
  std::unique_ptr<KvPoolRoles> pool;
  // The exit watch on an owner a restarted supervisor did not adopt.
  std::function<void(const ExitInfo&)> watched_exit;
  bool owner_still_runs = true;

  explicit PoolRig(int64_t pool_mib = 256) {
    cfg.kv.pool_mib = pool_mib;
    a.pid = 100;
    a.control_token = "token-a";
    b.pid = 200;
    b.control_token = "token-b";
    pool = std::make_unique<KvPoolRoles>(cfg, clock, metrics, Hooks());
  }

  KvPoolRoles::Hooks Hooks() {
    KvPoolRoles::Hooks h;
    h.slot = [this](const std::string& name) -> EngineSlot* {
      if (name == "a") return &a;
      if (name == "b") return &b;
      return nullptr;
    };
    h.fire = [this](EngineSlot& s, SlotEvent e, const std::string&) {
      ops.push_back("fire " + s.name + " " + SlotEventName(e));
      if (auto t = NextTransition(s.state, e)) s.state = t->to;
    };
    h.send = [this](EngineSlot& s, http::ClientRequest req, KvPoolRoles::Answer done) {
      sent.push_back({s.name, std::move(req), std::move(done)});
    };
    h.refresh_status = [this](EngineSlot& s) { ops.push_back("refresh " + s.name); };
    h.record_fence = [this](const FenceRecord& rec) { ops.push_back("fence " + rec.slot + " of " + rec.pool_owner); };
    h.kv_full = [this](const std::string& slot) { ops.push_back("kv_full " + slot); };
    h.after = [this](int64_t ms, std::function<void()> work) {
      later.push_back(timers.Make());
      later.back()->Start(ms, std::move(work));
    };
    h.save_state = [this] { ops.push_back("save"); };
    h.watch_exit = [this](pid_t, std::function<void(const ExitInfo&)> done) -> Result<ProcessWatch*> {
      watched_exit = std::move(done);
      return static_cast<ProcessWatch*>(nullptr);
    };
    h.still_runs = [this](const ProcessRef&) { return owner_still_runs; };
    return h;
  }

  // Moves a slot as the engine table would and tells the pool.
  void Move(EngineSlot& s, SlotState to) {
    const SlotState from = s.state;
    s.state = to;
    pool->OnSlotMoved(s, from, to, "test");
  }
  // Answers the oldest request with `status` and `body`.
  void Answer(int status, const json& body) {
    REQUIRE_FALSE(sent.empty());
    Sent s = std::move(sent.front());
    sent.erase(sent.begin());
    http::HttpResponse r;
    r.status = status;
    r.body = body.dump();
    s.done(std::move(r));
  }
  void AnswerError(const std::string& why) {
    REQUIRE_FALSE(sent.empty());
    Sent s = std::move(sent.front());
    sent.erase(sent.begin());
    s.done(Result<http::HttpResponse>(Timeout(why)));
  }
  bool Did(const std::string& op) const { return std::find(ops.begin(), ops.end(), op) != ops.end(); }
  // The slot that holds the pool, granted and answered: a.
  void GrantToA() {
    a.state = SlotState::kStandby;
    Move(a, SlotState::kActive);
    REQUIRE(sent.size() == 1);
    Answer(200, {{"role", "active"}, {"kv", {{"source", "pool"}, {"map_ms", 1.5}}}});
    REQUIRE(pool->HeldBy("a"));
    ops.clear();
  }
};

bool HasHeader(const http::ClientRequest& r, const std::string& name, const std::string& value) {
  for (const auto& h : r.headers) {
    if (h.name == name && h.value == value) return true;
  }
  return false;
}

TEST_CASE("kv pool roles: an engine made active is granted the pool with its control token, and holds it once it "
          "answers that it maps it",
          "[supervisor][kv_pool]") {
  PoolRig rig;
  rig.a.state = SlotState::kStandby;
  rig.Move(rig.a, SlotState::kActive);
  REQUIRE(rig.sent.size() == 1);
  CHECK(rig.sent[0].slot == "a");
  CHECK(rig.sent[0].req.method == "POST");
  CHECK(rig.sent[0].req.target == "/wsup/role");
  CHECK(rig.sent[0].Body() == json{{"role", "active"}, {"kv", "pool"}});
  CHECK(HasHeader(rig.sent[0].req, "Authorization", "Bearer token-a"));
  CHECK(rig.pool->state() == PoolState::kGranting);
  CHECK(rig.Did("save"));  // a restarted supervisor must know who may write it

  rig.Answer(200, {{"role", "active"}, {"kv", {{"source", "pool"}, {"map_ms", 2.0}}}});
  CHECK(rig.pool->HeldBy("a"));
  CHECK(rig.Did("kv_full a"));
  CHECK(rig.a.kv.value("source", "") == "pool");
  CHECK(rig.metrics.kv_pool_owner == "a");
  CHECK(rig.pool->StatusJson()["owner"] == "a");
  CHECK(rig.pool->StatusJson()["state"] == "held");
  CHECK(rig.ops.end() == std::find_if(rig.ops.begin(), rig.ops.end(),
                                      [](const std::string& op) { return op.rfind("fire", 0) == 0; }));
}

TEST_CASE("kv pool roles: an engine that answers its grant without the pool, or keeps a private cache, does not "
          "hold it",
          "[supervisor][kv_pool]") {
  PoolRig rig;
  SECTION("it could not map it: the grant failed, and it is wanted again later") {
    rig.a.state = SlotState::kStandby;
    rig.Move(rig.a, SlotState::kActive);
    rig.Answer(500, {{"error", "cuMemMap failed"}});
    CHECK_FALSE(rig.pool->HeldBy("a"));
    CHECK_FALSE(rig.Did("kv_full a"));
    CHECK(rig.pool->state() == PoolState::kFree);
    // The retry: after kGrantRetryMs the still-active slot is wanted again.
    rig.timers.Advance(KvPoolRoles::kGrantRetryMs);
    REQUIRE(rig.sent.size() == 1);
    CHECK(rig.sent[0].Body() == json{{"role", "active"}, {"kv", "pool"}});
  }
  SECTION("no /wsup/role at all: a private cache, never granted again") {
    rig.a.state = SlotState::kStandby;
    rig.Move(rig.a, SlotState::kActive);
    rig.Answer(404, {{"error", "no such route"}});
    CHECK_FALSE(rig.a.kv_capable);
    CHECK_FALSE(rig.pool->HeldBy("a"));
    rig.Move(rig.a, SlotState::kDraining);
    rig.Move(rig.a, SlotState::kStandby);
    rig.sent.clear();
    rig.Move(rig.a, SlotState::kActive);
    CHECK(rig.sent.empty());
  }
}

TEST_CASE("kv pool roles: work held for a grant in flight runs once the grant is answered, or after its bound",
          "[supervisor][kv_pool]") {
  PoolRig rig;
  int ran = 0;
  rig.pool->AfterGrant([&] { ++ran; });
  CHECK(ran == 1);  // no grant in flight: at once

  rig.a.state = SlotState::kStandby;
  rig.Move(rig.a, SlotState::kActive);
  rig.pool->AfterGrant([&] { ++ran; });
  CHECK(ran == 1);
  SECTION("the answer releases it") {
    rig.Answer(200, {{"kv", {{"source", "pool"}}}});
    CHECK(ran == 1);  // on the loop, after the answer is handled
    rig.timers.Advance(0);
    CHECK(ran == 2);
    rig.timers.Advance(KvPoolRoles::kHoldForGrantMs);
    CHECK(ran == 2);  // once only
  }
  SECTION("no answer: the bound releases it") {
    rig.timers.Advance(KvPoolRoles::kHoldForGrantMs - 1);
    CHECK(ran == 1);
    rig.timers.Advance(1);
    CHECK(ran == 2);
  }
}

TEST_CASE("kv pool roles: an engine that says it maps the pool it does not own is fenced and recorded, and an "
          "answer that crossed a move of the table is asked again instead",
          "[supervisor][kv_pool][security]") {
  PoolRig rig;
  rig.GrantToA();
  rig.b.state = SlotState::kStandby;
  SECTION("a current answer") {
    rig.pool->OnEngineKv(rig.b, {{"source", "pool"}}, rig.pool->seq(), "its /wsup/status");
    CHECK(rig.ops == std::vector<std::string>{"fence b of a", "fire b kv_trespass"});
    CHECK(rig.b.state == SlotState::kFailed);
    CHECK(rig.metrics.kv_pool_events["trespass"] == 1);
    CHECK(rig.pool->HeldBy("a"));  // the owner keeps it
  }
  SECTION("pool_mapped says the same") {
    rig.pool->OnEngineKv(rig.b, {{"source", "scratch"}, {"pool_mapped", true}}, rig.pool->seq(), "its status");
    CHECK(rig.Did("fence b of a"));
  }
  SECTION("a stale answer") {
    rig.pool->OnEngineKv(rig.b, {{"source", "pool"}}, rig.pool->seq() - 1, "its /wsup/status");
    CHECK(rig.ops == std::vector<std::string>{"refresh b"});
    CHECK(rig.b.state == SlotState::kStandby);
  }
  SECTION("the owner, a scratch, or a stopped engine is not fenced") {
    rig.pool->OnEngineKv(rig.a, {{"source", "pool"}}, rig.pool->seq(), "its status");
    rig.pool->OnEngineKv(rig.b, {{"source", "scratch"}}, rig.pool->seq(), "its status");
    rig.b.state = SlotState::kStopping;
    rig.pool->OnEngineKv(rig.b, {{"source", "pool"}}, rig.pool->seq(), "its status");
    CHECK(rig.ops.empty());
  }
  SECTION("a role answer that says so is judged the same") {
    rig.b.state = SlotState::kStandby;
    rig.Move(rig.b, SlotState::kActive);  // wanted; a holds it, so b is told to use its scratch
    REQUIRE(rig.sent.size() == 1);
    CHECK(rig.sent[0].Body() == json{{"role", "active"}, {"kv", "scratch"}});
    rig.Answer(200, {{"kv", {{"source", "pool"}}}});
    CHECK(rig.Did("fence b of a"));
    CHECK(rig.Did("fire b kv_trespass"));
  }
}

TEST_CASE("kv pool roles: an owner that will not let the pool go is killed, and only its exit frees the pool for the "
          "engine that wants it",
          "[supervisor][kv_pool]") {
  PoolRig rig;
  rig.GrantToA();
  rig.b.state = SlotState::kStandby;
  // A planned swap: b is wanted, a drains and is asked to let go.
  rig.Move(rig.b, SlotState::kActive);
  REQUIRE(rig.sent.size() == 1);
  CHECK(rig.sent[0].slot == "b");
  CHECK(rig.sent[0].Body()["kv"] == "scratch");
  rig.Answer(200, {{"kv", {{"source", "scratch"}}}});
  rig.Move(rig.a, SlotState::kDraining);
  rig.Move(rig.a, SlotState::kStandby);
  REQUIRE(rig.sent.size() == 1);
  CHECK(rig.sent[0].slot == "a");
  CHECK(rig.sent[0].Body() == json{{"role", "standby"}, {"kv", "scratch"}});
  SECTION("it lets go: b is granted at once") {
    rig.Answer(200, {{"kv", {{"source", "scratch"}}}});
    REQUIRE(rig.sent.size() == 1);
    CHECK(rig.sent[0].slot == "b");
    CHECK(rig.sent[0].Body()["kv"] == "pool");
  }
  SECTION("it refuses: killed, and the pool waits for its exit") {
    rig.Answer(500, {{"error", {{"message", "sequences still on the pool"}}}});
    CHECK(rig.Did("fire a kv_stuck"));
    CHECK(rig.pool->state() == PoolState::kFenced);
    CHECK(rig.sent.empty());
    // The lifeline's EOF (a dying process) is not its exit.
    rig.pool->OnSlotMoved(rig.a, rig.a.state, SlotState::kFailed, "dying");
    CHECK(rig.sent.empty());
    rig.a.pid = 0;
    rig.pool->OnExit(rig.a, "killed by SIGKILL");
    REQUIRE(rig.sent.size() == 1);
    CHECK(rig.sent[0].slot == "b");
    CHECK(rig.sent[0].Body()["kv"] == "pool");
  }
}

TEST_CASE("kv pool roles: an answer for a process that has gone changes nothing", "[supervisor][kv_pool]") {
  PoolRig rig;
  rig.a.state = SlotState::kStandby;
  rig.Move(rig.a, SlotState::kActive);
  rig.a.pid = 101;  // restarted in between
  rig.Answer(200, {{"kv", {{"source", "pool"}}}});
  CHECK_FALSE(rig.pool->HeldBy("a"));
  CHECK_FALSE(rig.Did("kv_full a"));
  CHECK(rig.a.kv.is_null());
}

TEST_CASE("kv pool roles: with no pool configured nothing is asked, held or fenced", "[supervisor][kv_pool]") {
  PoolRig rig(0);
  CHECK_FALSE(rig.pool->Enabled());
  rig.a.state = SlotState::kStandby;
  rig.Move(rig.a, SlotState::kActive);
  rig.pool->OnEngineKv(rig.b, {{"source", "pool"}}, rig.pool->seq(), "its status");
  rig.pool->OnExit(rig.a, "exit 0");
  rig.pool->AdoptHeld("a");
  CHECK(rig.sent.empty());
  CHECK(rig.ops.empty());
  CHECK(rig.pool->owner().empty());
}

TEST_CASE("kv pool roles: a restarted supervisor keeps the adopted owner's pool, releases a standby's, and waits for "
          "the exit of an owner it could not adopt",
          "[supervisor][kv_pool]") {
  PoolRig rig;
  RuntimeState prev;
  RuntimeState::Engine pe;
  pe.slot = "a";
  pe.proc.pid = 4242;
  prev.engines.push_back(pe);
  rig.pool->AdoptHeld("a");
  CHECK(rig.pool->HeldBy("a"));
  SECTION("adopted as the active engine: kept") {
    rig.a.state = SlotState::kActive;
    rig.pool->AdoptOwner(prev);
    CHECK(rig.sent.empty());
    CHECK(rig.pool->HeldBy("a"));
  }
  SECTION("adopted as the standby: asked to let go") {
    rig.a.state = SlotState::kStandby;
    rig.pool->AdoptOwner(prev);
    REQUIRE(rig.sent.size() == 1);
    CHECK(rig.sent[0].Body()["role"] == "standby");
  }
  SECTION("not adopted, still running: free at its exit") {
    rig.a.pid = 0;
    rig.pool->AdoptOwner(prev);
    REQUIRE(rig.watched_exit);
    CHECK(rig.pool->HeldBy("a"));
    ExitInfo info;
    info.pid = 4242;
    rig.watched_exit(info);
    CHECK(rig.pool->state() == PoolState::kFree);
  }
  SECTION("not adopted and gone: free at once") {
    rig.a.pid = 0;
    rig.owner_still_runs = false;
    rig.pool->AdoptOwner(prev);
    CHECK_FALSE(rig.watched_exit);
    CHECK(rig.pool->state() == PoolState::kFree);
  }
  SECTION("an owner name that is no slot is not adopted") {
    PoolRig other;
    other.pool->AdoptHeld("c");
    CHECK(other.pool->owner().empty());
  }
}

}  // namespace
}  // namespace wsup
