#include <catch2/catch.hpp>

#include <set>
#include <utility>

#include "supervisor/engine_fsm.h"
#include "tests/transition_table_check.h"

namespace wsup {
namespace {

TEST_CASE("each (state, event) pair appears at most once in the table") {
  size_t n = 0;
  const SlotTransition* t = SlotTable(&n);
  REQUIRE(n > 20);
  test::CheckPairsOnce(t, n, SlotStateName, SlotEventName);
}

TEST_CASE("the happy path: spawn, ready, proven, promoted") {
  SlotState s = SlotState::kIdle;
  auto step = [&](SlotEvent e, SlotState want, SlotAction act) {
    auto t = NextTransition(s, e);
    REQUIRE(t.has_value());
    CHECK(t->to == want);
    CHECK(t->action == act);
    s = t->to;
  };
  step(SlotEvent::kSpawn, SlotState::kStarting, SlotAction::kNone);
  step(SlotEvent::kEngineReady, SlotState::kWarming, SlotAction::kStartProbing);
  step(SlotEvent::kProbePass, SlotState::kStandby, SlotAction::kNone);
  step(SlotEvent::kPromote, SlotState::kActive, SlotAction::kRouteHere);
  step(SlotEvent::kDemote, SlotState::kDraining, SlotAction::kRouteAway);
  step(SlotEvent::kDrained, SlotState::kStandby, SlotAction::kNone);
}

TEST_CASE("spawned is not ready: nothing but a passed probe makes a standby") {
  for (SlotState from : {SlotState::kStarting, SlotState::kWarming}) {
    CHECK_FALSE(NextTransition(from, SlotEvent::kPromote).has_value());
  }
  // A warming engine that answers wrongly is failed, never promoted.
  auto t = NextTransition(SlotState::kWarming, SlotEvent::kProbeTrip);
  REQUIRE(t);
  CHECK(t->to == SlotState::kFailed);
  CHECK(t->action == SlotAction::kKillGroup);
}

TEST_CASE("a dying active slot (its lifeline closed) fails over at once - the exit then asks for a restart") {
  auto dying = NextTransition(SlotState::kActive, SlotEvent::kDying);
  REQUIRE(dying);
  CHECK(dying->to == SlotState::kFailed);
  CHECK(dying->action == SlotAction::kFailover);
  auto exit = NextTransition(dying->to, SlotEvent::kExited);
  REQUIRE(exit);
  CHECK(exit->action == SlotAction::kScheduleRestart);
  for (SlotState from : {SlotState::kWarming, SlotState::kStandby, SlotState::kDraining}) {
    auto t = NextTransition(from, SlotEvent::kDying);
    REQUIRE(t);
    CHECK(t->to == SlotState::kFailed);
    CHECK(t->action == SlotAction::kKillGroup);
  }
  // Before it is ready an engine may close inherited fds itself: the
  // supervisor does not send kDying then, and the table has no row for it.
  CHECK_FALSE(NextTransition(SlotState::kStarting, SlotEvent::kDying).has_value());
}

TEST_CASE("losing the active slot asks for a failover, losing a standby for a restart") {
  auto crash = NextTransition(SlotState::kActive, SlotEvent::kExited);
  REQUIRE(crash);
  CHECK(crash->action == SlotAction::kFailover);
  auto hang = NextTransition(SlotState::kActive, SlotEvent::kProbeTrip);
  REQUIRE(hang);
  CHECK(hang->action == SlotAction::kFailover);
  auto standby = NextTransition(SlotState::kStandby, SlotEvent::kExited);
  REQUIRE(standby);
  CHECK(standby->action == SlotAction::kScheduleRestart);
}

TEST_CASE("a draining slot takes the traffic back when its replacement fails, unless it is found unfit") {
  // Proven and serving until the planned swap: the node's only engine that
  // can answer while the failed slot restarts.
  auto back = NextTransition(SlotState::kDraining, SlotEvent::kPromote);
  REQUIRE(back);
  CHECK(back->to == SlotState::kActive);
  CHECK(back->action == SlotAction::kRouteHere);
  auto unfit = NextTransition(SlotState::kDraining, SlotEvent::kUnfit);
  REQUIRE(unfit);
  CHECK(unfit->to == SlotState::kFailed);
  CHECK(unfit->action == SlotAction::kKillGroup);
  // Engines that were never proven are still never promoted.
  for (SlotState from : {SlotState::kStarting, SlotState::kWarming, SlotState::kFailed, SlotState::kStopping}) {
    CHECK_FALSE(NextTransition(from, SlotEvent::kPromote).has_value());
  }
}

TEST_CASE("an engine that maps the KV pool the supervisor did not give it is killed at once, the active fails over") {
  for (SlotState s : {SlotState::kStarting, SlotState::kWarming, SlotState::kStandby, SlotState::kDraining}) {
    auto t = NextTransition(s, SlotEvent::kKvTrespass);
    REQUIRE(t);
    CHECK(t->to == SlotState::kFailed);
    CHECK(t->action == SlotAction::kKillGroup);
  }
  auto active = NextTransition(SlotState::kActive, SlotEvent::kKvTrespass);
  REQUIRE(active);
  CHECK(active->to == SlotState::kFailed);
  CHECK(active->action == SlotAction::kFailover);
  CHECK(TriggerFor(SlotEvent::kKvTrespass, false) == FailoverTrigger::kProbe);
  // Nothing is left to fence once it failed or stopped.
  for (SlotState s : {SlotState::kFailed, SlotState::kStopping, SlotState::kStopped, SlotState::kIdle}) {
    CHECK_FALSE(NextTransition(s, SlotEvent::kKvTrespass).has_value());
  }
  CHECK(std::string(SlotEventName(SlotEvent::kKvTrespass)) == "kv_trespass");
}

TEST_CASE("every live state can be stopped and every stop ends in stopped") {
  for (SlotState s : {SlotState::kStarting, SlotState::kWarming, SlotState::kStandby, SlotState::kActive,
                      SlotState::kDraining}) {
    auto t = NextTransition(s, SlotEvent::kStop);
    REQUIRE(t);
    CHECK(t->to == SlotState::kStopping);
    CHECK(t->action == SlotAction::kTerminate);
  }
  auto done = NextTransition(SlotState::kStopping, SlotEvent::kExited);
  REQUIRE(done);
  CHECK(done->to == SlotState::kStopped);
}

TEST_CASE("names are defined for every state") {
  for (int i = 0; i <= static_cast<int>(SlotState::kStopped); ++i) {
    CHECK(std::string(SlotStateName(static_cast<SlotState>(i))) != "?");
  }
}

}  // namespace
}  // namespace wsup
