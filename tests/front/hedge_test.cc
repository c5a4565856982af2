// Hedging in-process (front/hedge.h), on a fake clock: when the scan hedges a
// silent call, when it reports the active engine silent, how the budget
// refuses, which attempt wins a race and what is cancelled. The proxy is
// replaced by a Site that records what the scan asked; nothing sleeps.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "common/clock.h"
#include "front/hedge.h"
#include "tests/fake_timers.h"

using namespace wsup::front;
using wsup::FakeClock;
using wsup::testing::FakeTimers;

namespace {

struct FakeSite final : Hedger::Site {
  std::vector<HedgeCandidate> calls;
  const Backend* active = nullptr;
  Backend* target = nullptr;
  int tokens = 100;
  bool silent_reported = false;
  std::vector<HedgeScan> judged;
  std::vector<size_t> hedged;
  std::vector<size_t> refused;
  size_t refused_fresh = 0;
  int idles = 0;

  void Candidates(std::vector<HedgeCandidate>* out) override { *out = calls; }
  const Backend* Active() const override { return active; }
  Backend* HedgeTarget(int64_t) const override { return target; }
  bool JudgeSilence(const HedgeScan& counts, int64_t) override {
    judged.push_back(counts);
    if (counts.silent_on_active >= 2) silent_reported = true;
    return silent_reported;
  }
  bool TakeToken() override { return tokens-- > 0; }
  void Hedge(size_t index, Backend*) override {
    hedged.push_back(index);
    calls[index].hedge_pending = true;
  }
  void BudgetSpent(const std::vector<size_t>& indexes, size_t fresh, int64_t) override {
    for (size_t i : indexes) {
      refused.push_back(i);
      calls[i].refused = true;
    }
    refused_fresh += fresh;
  }
  void Idle() override { ++idles; }
};

struct Rig {
  FakeClock clock;
  FakeTimers timers{&clock};
  FakeSite site;
  Backend active, standby;
  Hedger hedger{&timers, &clock, &site};

  Rig() {
    active.name = "active";
    standby.name = "standby";
    site.active = &active;
    site.target = &standby;
  }
  // A call on `b` that has been read from since `since_ms` (loop time).
  HedgeCandidate Call(const Backend* b, int64_t since_ms) const {
    return {.backend = b, .reading = true, .last_byte_ms = since_ms, .can_hedge = true};
  }
};

}  // namespace

TEST_CASE("front hedge: the scan ticks at a fortieth of the wait, within 2..50 ms", "[front][hedge]") {
  CHECK(Hedger::TickMs(200) == 5);
  CHECK(Hedger::TickMs(10) == 2);
  CHECK(Hedger::TickMs(10'000) == 50);
}

TEST_CASE("front hedge: a silent call is hedged once the wait has passed, not before", "[front][hedge]") {
  Rig rig;
  rig.site.calls = {rig.Call(&rig.active, rig.clock.MonotonicMs())};
  rig.hedger.SetAfter(200);
  rig.timers.Advance(195);
  CHECK(rig.site.hedged.empty());
  rig.timers.Advance(5);
  REQUIRE(rig.site.hedged == std::vector<size_t>{0});
  rig.timers.Advance(500);  // hedged once: the call reports its hedge pending
  CHECK(rig.site.hedged.size() == 1);
}

TEST_CASE("front hedge: a call that heard a byte, is paused, queued or on the standby is not hedged", "[front][hedge]") {
  Rig rig;
  const int64_t t0 = rig.clock.MonotonicMs();
  HedgeCandidate heard = rig.Call(&rig.active, t0);
  HedgeCandidate paused = rig.Call(&rig.active, t0);
  paused.reading = false;  // a slow client, not a silent engine
  HedgeCandidate queued = rig.Call(nullptr, t0);
  HedgeCandidate on_standby = rig.Call(&rig.standby, t0);
  HedgeCandidate cannot = rig.Call(&rig.active, t0);
  cannot.can_hedge = false;  // bytes reached the client of a stream that cannot be resumed
  rig.site.calls = {heard, paused, queued, on_standby, cannot};
  rig.hedger.SetAfter(200);
  rig.timers.Advance(150);
  rig.site.calls[0].last_byte_ms = rig.clock.MonotonicMs();  // the engine spoke
  rig.timers.Advance(150);
  CHECK(rig.site.hedged.empty());
  rig.timers.Advance(50);
  CHECK(rig.site.hedged == std::vector<size_t>{0});
}

TEST_CASE("front hedge: no standby to take it: nothing is hedged, silence is still judged", "[front][hedge]") {
  Rig rig;
  rig.site.target = nullptr;
  rig.site.calls = {rig.Call(&rig.active, 0)};
  rig.hedger.SetAfter(200);
  rig.timers.Advance(400);
  CHECK(rig.site.hedged.empty());
  REQUIRE_FALSE(rig.site.judged.empty());
  CHECK(rig.site.judged.back().on_active == 1);
  CHECK(rig.site.judged.back().silent_on_active == 1);
}

TEST_CASE("front hedge: on an active reported silent, calls are hedged without the whole wait", "[front][hedge]") {
  Rig rig;
  rig.site.calls = {rig.Call(&rig.active, 0), rig.Call(&rig.active, 0)};
  rig.hedger.SetAfter(200);
  rig.timers.Advance(200);
  CHECK(rig.site.silent_reported);
  CHECK(rig.site.hedged.size() == 2);
  // A new call on the silent active: hedged at the next tick.
  rig.site.calls.push_back(rig.Call(&rig.active, rig.clock.MonotonicMs()));
  rig.timers.Advance(5);
  CHECK(rig.site.hedged.size() == 3);
  CHECK(rig.site.hedged.back() == 2);
}

TEST_CASE("front hedge: a spent budget refuses, each call counted once", "[front][hedge]") {
  Rig rig;
  rig.site.tokens = 1;
  rig.site.calls = {rig.Call(&rig.active, 0), rig.Call(&rig.active, 0)};
  rig.hedger.SetAfter(1'000);
  rig.timers.Advance(1'000);
  CHECK(rig.site.hedged == std::vector<size_t>{0});
  CHECK(rig.site.refused_fresh == 1);
  rig.timers.Advance(100);
  CHECK(rig.site.refused_fresh == 1);  // refused again, not counted again
  CHECK(rig.site.refused.size() > 1);
}

TEST_CASE("front hedge: the scan sleeps on no call and wakes with one, a wait of 0 stops it", "[front][hedge]") {
  Rig rig;
  rig.hedger.SetAfter(200);
  CHECK(rig.timers.armed() == 1);
  rig.timers.Advance(5);
  CHECK(rig.site.idles == 1);
  CHECK(rig.timers.armed() == 0);
  rig.hedger.Wake();
  CHECK(rig.timers.armed() == 1);
  rig.hedger.SetAfter(0);
  CHECK(rig.timers.armed() == 0);
  rig.hedger.Wake();  // hedging is off: nothing to wake
  CHECK(rig.timers.armed() == 0);
  rig.hedger.SetAfter(200);
  rig.hedger.Close();
  CHECK(rig.timers.armed() == 0);
  rig.hedger.Wake();
  CHECK(rig.timers.armed() == 0);
}

namespace {

struct FakeOwner final : HedgeLeg::Owner {
  int progress = 0;
  std::vector<std::string> errors;
  void OnHedgeProgress() override { ++progress; }
  void OnHedgeError(const UpstreamError& e) override { errors.push_back(e.Describe()); }
};

std::vector<wsup::http::Header> Head(const std::string& content_type) {
  return {{"Content-Type", content_type}};
}

}  // namespace

TEST_CASE("front hedge: which attempt wins the race, and what is cancelled", "[front][hedge]") {
  FakeOwner owner;
  Backend standby;
  SECTION("a plain answer's 2xx head wins") {
    HedgeLeg leg(&owner, &standby, /*resume=*/false);
    CHECK(standby.inflight == 1);
    CHECK(JudgeHedge(leg.Facts(false)) == HedgeVerdict::kWait);
    auto h = Head("application/json");
    leg.OnUpstreamHead(200, &h);
    CHECK(owner.progress == 1);
    CHECK(JudgeHedge(leg.Facts(false)) == HedgeVerdict::kWins);
  }
  SECTION("a stream's head waits for the first event bytes, then wins") {
    HedgeLeg leg(&owner, &standby, /*resume=*/false);
    auto h = Head("text/event-stream");
    leg.OnUpstreamHead(200, &h);
    CHECK(leg.event_stream);
    CHECK(JudgeHedge(leg.Facts(true)) == HedgeVerdict::kWait);
    leg.OnUpstreamBody("data: {}\n\n");
    CHECK(JudgeHedge(leg.Facts(true)) == HedgeVerdict::kWins);
  }
  SECTION("an error status fails the hedge; cancelling it gives the standby's count back") {
    HedgeLeg leg(&owner, &standby, /*resume=*/false);
    auto h = Head("application/json");
    leg.OnUpstreamHead(503, &h);
    CHECK(JudgeHedge(leg.Facts(false)) == HedgeVerdict::kFailed);
    leg.Cancel();
    CHECK_FALSE(leg.pending());
    CHECK(standby.inflight == 0);
  }
  SECTION("the active engine answered first: the hedge is cancelled") {
    HedgeLeg leg(&owner, &standby, /*resume=*/false);
    leg.Cancel();
    CHECK(leg.state == HedgeLeg::State::kEnded);
    CHECK(standby.inflight == 0);
  }
  SECTION("the hedge wins: its attempt moves to the call, the call's attempt is cancelled") {
    Backend active;
    Attempt call(&active);
    HedgeLeg leg(&owner, &standby, /*resume=*/false);
    leg.state = HedgeLeg::State::kAdopted;
    call = std::move(leg.attempt);
    CHECK(active.inflight == 0);
    CHECK(standby.inflight == 1);
  }
  CHECK(standby.inflight == 0);  // whatever happened, nothing is left counted
}
