// The rollout's table (supervisor/rollout_fsm.h): the old version keeps
// serving until the new one has taken the traffic and held it through the
// watch window, and every way out before that is a rollback.
#include <catch2/catch.hpp>

#include <set>
#include <utility>
#include <vector>

#include "supervisor/rollout_fsm.h"

namespace wsup {
namespace {

using E = RollEvent;
using S = RollState;
using A = RollAction;

// Runs events from idle; returns the states passed through and the actions.
std::pair<std::vector<S>, std::vector<A>> Run(const std::vector<E>& events) {
  S s = S::kIdle;
  std::vector<S> states;
  std::vector<A> actions;
  for (E e : events) {
    auto t = NextRollTransition(s, e);
    if (!t) {
      FAIL("no row for " << RollStateName(s) << " x " << RollEventName(e));
    }
    s = t->to;
    states.push_back(s);
    actions.push_back(t->action);
  }
  return {states, actions};
}

TEST_CASE("rollout table: each (state, event) pair appears at most once, and over means no row out", "[rollout]") {
  size_t n = 0;
  const RollTransition* t = RollTable(&n);
  REQUIRE(n >= 20);
  std::set<std::pair<int, int>> seen;
  for (size_t i = 0; i < n; ++i) {
    INFO(RollStateName(t[i].from) << " x " << RollEventName(t[i].event));
    CHECK(seen.insert({static_cast<int>(t[i].from), static_cast<int>(t[i].event)}).second);
    CHECK_FALSE(RollOver(t[i].from));
  }
}

TEST_CASE("rollout table: the way through - standby first, the swap, the watch, then the old slot", "[rollout]") {
  auto [states, actions] = Run({E::kBegin, E::kStopped, E::kNewProven, E::kSwapped, E::kWatchOver, E::kStopped,
                                E::kOldProven});
  CHECK(states == std::vector<S>{S::kStoppingStandby, S::kStartingNew, S::kSwapping, S::kWatching, S::kStoppingOld,
                                 S::kStartingOld, S::kDone});
  CHECK(actions == std::vector<A>{A::kStopStandby, A::kSpawnNew, A::kSwap, A::kStartWatch, A::kStopOld, A::kSpawnOld,
                                  A::kFinish});
}

TEST_CASE("rollout table: the old slot is never stopped before the watch window ends", "[rollout]") {
  size_t n = 0;
  const RollTransition* t = RollTable(&n);
  for (size_t i = 0; i < n; ++i) {
    INFO(RollStateName(t[i].from) << " x " << RollEventName(t[i].event));
    if (t[i].action == A::kStopOld) {
      CHECK(t[i].from == S::kWatching);
      CHECK(t[i].event == E::kWatchOver);
    }
  }
}

TEST_CASE("rollout table: every failure before the old slot is replaced rolls back", "[rollout]") {
  for (S s : {S::kStoppingStandby, S::kStartingNew, S::kSwapping, S::kWatching}) {
    for (E e : {E::kNewFailed, E::kOldFailed, E::kTimeout, E::kAbort, E::kSwapRefused}) {
      auto t = NextRollTransition(s, e);
      if (!t) continue;  // not meaningful there (a stop has no new engine yet, ...)
      INFO(RollStateName(s) << " x " << RollEventName(e));
      CHECK(t->to == S::kRolledBack);
      CHECK(t->action == A::kRollBack);
    }
    INFO(RollStateName(s));
    CHECK(NextRollTransition(s, E::kTimeout).has_value());
    CHECK(NextRollTransition(s, E::kAbort).has_value());
    CHECK(NextRollTransition(s, E::kOldFailed).has_value());
  }
  // Started, proven wrong: back, without the swap.
  auto [states, actions] = Run({E::kBegin, E::kStopped, E::kNewFailed});
  CHECK(states.back() == S::kRolledBack);
  CHECK(actions.back() == A::kRollBack);
  // The new active fails in the watch window: back (its crash failover
  // promotes the old version, still the standby).
  auto [s2, a2] = Run({E::kBegin, E::kStopped, E::kNewProven, E::kSwapped, E::kNewFailed});
  CHECK(s2.back() == S::kRolledBack);
}

TEST_CASE("rollout table: once the old slot is being replaced, failures do not roll back", "[rollout]") {
  // The new version has served through the window; the old slot retries
  // with it under its restart policy, and the budget ends the roll as failed.
  auto t = NextRollTransition(S::kStartingOld, E::kOldFailed);
  REQUIRE(t);
  CHECK(t->to == S::kStartingOld);
  CHECK(t->action == A::kNone);
  for (S s : {S::kStoppingOld, S::kStartingOld}) {
    for (E e : {E::kTimeout, E::kAbort}) {
      auto u = NextRollTransition(s, e);
      REQUIRE(u);
      CHECK(u->to == S::kFailed);
      CHECK(u->action == A::kFinish);
    }
  }
  // Names for logs and the ledger.
  CHECK(std::string(RollStateName(S::kRolledBack)) == "rolled_back");
  CHECK(std::string(RollStateName(S::kDone)) == "done");
  CHECK(RollOver(S::kFailed));
  CHECK_FALSE(RollOver(S::kWatching));
}

}  // namespace
}  // namespace wsup
