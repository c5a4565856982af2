// The rollout's table (supervisor/rollout_fsm.h): the old version keeps
// serving until the new one has taken the traffic and held it through the
// watch window, and every way out before that is a rollback.
#include <catch2/catch.hpp>

#include <set>
#include <utility>
#include <vector>

#include "supervisor/rollout_fsm.h"
#include "tests/transition_table_check.h"

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
  test::CheckPairsOnce(t, n, RollStateName, RollEventName, [](const RollTransition& r) { CHECK_FALSE(RollOver(r.from)); });
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

TEST_CASE("rollout table: every failure before the old slot is replaced rolls back, old slot first", "[rollout]") {
  for (S s : {S::kStoppingStandby, S::kStartingNew, S::kSwapping, S::kWatching}) {
    for (E e : {E::kNewFailed, E::kOldFailed, E::kTimeout, E::kSwapRefused}) {
      auto t = NextRollTransition(s, e);
      if (!t) continue;  // not meaningful there (a stop has no new engine yet, ...)
      INFO(RollStateName(s) << " x " << RollEventName(e));
      CHECK(t->to == S::kRestoringOld);
      CHECK(t->action == A::kRollBack);
    }
    INFO(RollStateName(s));
    CHECK(NextRollTransition(s, E::kTimeout).has_value());
    CHECK(NextRollTransition(s, E::kOldFailed).has_value());
  }
  // Started, proven wrong: back, without the swap; the old slot serves, so
  // nothing moves back, and the rolled slot comes back on the old version.
  auto [states, actions] = Run({E::kBegin, E::kStopped, E::kNewFailed, E::kOldProven, E::kSwapped, E::kNewProven});
  CHECK(states == std::vector<S>{S::kStoppingStandby, S::kStartingNew, S::kRestoringOld, S::kSwappingBack,
                                 S::kRestoringNew, S::kRolledBack});
  CHECK(actions == std::vector<A>{A::kStopStandby, A::kSpawnNew, A::kRollBack, A::kSwapBack, A::kRestoreNew,
                                  A::kFinish});
  // The new active fails in the watch window: back (its crash failover
  // promotes the old version, still the standby).
  auto [s2, a2] = Run({E::kBegin, E::kStopped, E::kNewProven, E::kSwapped, E::kNewFailed});
  CHECK(s2.back() == S::kRestoringOld);
  CHECK(a2.back() == A::kRollBack);
}

TEST_CASE("rollout table: the old version's standby lost in the watch window - it comes back, takes the traffic back, "
          "then the new slot goes back to the old version",
          "[rollout]") {
  auto [states, actions] = Run({E::kBegin, E::kStopped, E::kNewProven, E::kSwapped, E::kOldFailed, E::kOldProven,
                                E::kSwapped, E::kNewDrained, E::kStopped, E::kNewProven});
  CHECK(states == std::vector<S>{S::kStoppingStandby, S::kStartingNew, S::kSwapping, S::kWatching, S::kRestoringOld,
                                 S::kSwappingBack, S::kRestoringNew, S::kRestoringNew, S::kRestoringNew,
                                 S::kRolledBack});
  CHECK(actions == std::vector<A>{A::kStopStandby, A::kSpawnNew, A::kSwap, A::kStartWatch, A::kRollBack, A::kSwapBack,
                                  A::kRestoreNew, A::kRestoreNew, A::kRestoreNew, A::kFinish});
  // Its failures on the way: a restart of the old slot is waited for; the
  // old slot failing again while the new one is replaced moves the roll
  // back to it; the new one failing is restored again.
  CHECK(NextRollTransition(S::kRestoringOld, E::kOldFailed)->to == S::kRestoringOld);
  CHECK(NextRollTransition(S::kRestoringOld, E::kNewFailed)->to == S::kRestoringOld);
  CHECK(NextRollTransition(S::kSwappingBack, E::kOldFailed)->to == S::kRestoringOld);
  CHECK(NextRollTransition(S::kRestoringNew, E::kOldFailed)->to == S::kRestoringOld);
  CHECK(NextRollTransition(S::kRestoringNew, E::kOldFailed)->action == A::kRestoreOld);
  CHECK(NextRollTransition(S::kRestoringNew, E::kNewFailed)->action == A::kRestoreNew);
}

TEST_CASE("rollout table: a rollback never starts the new version or stops the old slot, and ends rolled back, failed "
          "or interrupted",
          "[rollout]") {
  size_t n = 0;
  const RollTransition* t = RollTable(&n);
  for (size_t i = 0; i < n; ++i) {
    if (!RollingBack(t[i].from)) continue;
    INFO(RollStateName(t[i].from) << " x " << RollEventName(t[i].event));
    for (A a : {A::kSpawnNew, A::kSpawnOld, A::kStopOld, A::kStopStandby, A::kSwap, A::kStartWatch}) {
      CHECK(t[i].action != a);
    }
    CHECK((RollingBack(t[i].to) || t[i].to == S::kRolledBack || t[i].to == S::kFailed || t[i].to == S::kInterrupted));
  }
  // rolled_back is reached only from the new slot's proof on the old version.
  for (size_t i = 0; i < n; ++i) {
    if (t[i].to != S::kRolledBack) continue;
    CHECK(t[i].from == S::kRestoringNew);
    CHECK(t[i].event == E::kNewProven);
  }
}

TEST_CASE("rollout table: every step has a budget and a way out when the node stops", "[rollout]") {
  for (int i = static_cast<int>(S::kStoppingStandby); i <= static_cast<int>(S::kInterrupted); ++i) {
    const S s = static_cast<S>(i);
    if (RollOver(s)) continue;
    INFO(RollStateName(s));
    auto timeout = NextRollTransition(s, E::kTimeout);
    REQUIRE(timeout);
    CHECK((timeout->to == S::kRestoringOld || timeout->to == S::kFailed));
    auto abort = NextRollTransition(s, E::kAbort);
    REQUIRE(abort);
    CHECK(abort->to == S::kInterrupted);
    CHECK(abort->action == A::kFinish);
  }
}

TEST_CASE("rollout table: a restarted supervisor resumes - finishing a proven new version, or rolling back",
          "[rollout]") {
  // The new version serves, proven, the old slot adopted: the watch again,
  // then the old slot replaced.
  auto [s1, a1] = Run({E::kResumeWatch, E::kWatchOver, E::kStopped, E::kOldProven});
  CHECK(s1 == std::vector<S>{S::kWatching, S::kStoppingOld, S::kStartingOld, S::kDone});
  CHECK(a1.front() == A::kStartWatch);
  // ... the old slot was being replaced: it starts with the new version.
  auto [s2, a2] = Run({E::kResumeOld, E::kOldProven});
  CHECK(s2 == std::vector<S>{S::kStartingOld, S::kDone});
  CHECK(a2.front() == A::kSpawnOld);
  // Anything else goes back to the old version.
  auto [s3, a3] = Run({E::kResumeBack, E::kOldProven, E::kSwapped, E::kNewProven});
  CHECK(s3 == std::vector<S>{S::kRestoringOld, S::kSwappingBack, S::kRestoringNew, S::kRolledBack});
  CHECK(a3.front() == A::kRollBack);
  // Only from idle.
  for (E e : {E::kResumeWatch, E::kResumeOld, E::kResumeBack}) {
    size_t n = 0;
    const RollTransition* t = RollTable(&n);
    for (size_t i = 0; i < n; ++i) {
      if (t[i].event == e) CHECK(t[i].from == S::kIdle);
    }
  }
}

TEST_CASE("rollout table: once the old slot is being replaced, failures do not roll back", "[rollout]") {
  // The new version has served through the window; the old slot retries
  // with it under its restart policy, and the budget ends the roll as failed.
  auto t = NextRollTransition(S::kStartingOld, E::kOldFailed);
  REQUIRE(t);
  CHECK(t->to == S::kStartingOld);
  CHECK(t->action == A::kNone);
  for (S s : {S::kStoppingOld, S::kStartingOld}) {
    auto u = NextRollTransition(s, E::kTimeout);
    REQUIRE(u);
    CHECK(u->to == S::kFailed);
    CHECK(u->action == A::kFinish);
  }
  // Names for logs, the ledger and state.json.
  CHECK(std::string(RollStateName(S::kRolledBack)) == "rolled_back");
  CHECK(std::string(RollStateName(S::kDone)) == "done");
  CHECK(std::string(RollStateName(S::kInterrupted)) == "interrupted");
  CHECK(RollOver(S::kFailed));
  CHECK(RollOver(S::kInterrupted));
  CHECK_FALSE(RollOver(S::kWatching));
  CHECK_FALSE(RollOver(S::kRestoringNew));
  CHECK(std::string(RollStateName(S::kRestoringOld)) == "restoring_old");
}

}  // namespace
}  // namespace wsup
