#include <catch2/catch.hpp>

#include <set>
#include <tuple>

#include "supervisor/child_fsm.h"

namespace wsup {
namespace {

using K = ChildKind;
using S = ChildState;
using E = ChildEvent;
using A = ChildAction;

void Step(K kind, S* s, E e, S want, A act) {
  auto t = NextChildTransition(kind, *s, e);
  INFO(ChildKindName(kind) << ": " << ChildStateName(*s) << " --" << ChildEventName(e) << "-->");
  REQUIRE(t.has_value());
  CHECK(t->to == want);
  CHECK(t->action == act);
  *s = t->to;
}

TEST_CASE("child tables: each (kind, state, event) appears at most once") {
  size_t n = 0;
  const ChildTransition* t = ChildTable(&n);
  REQUIRE(n > 30);
  std::set<std::tuple<int, int, int>> seen;
  for (size_t i = 0; i < n; ++i) {
    INFO(ChildKindName(t[i].kind) << " " << ChildStateName(t[i].from) << " x " << ChildEventName(t[i].event));
    CHECK(seen.insert({static_cast<int>(t[i].kind), static_cast<int>(t[i].from), static_cast<int>(t[i].event)})
              .second);
  }
}

TEST_CASE("holder: spawned, up, kept, then an exit asks for a restart that spawns again") {
  S s = S::kIdle;
  Step(K::kHolder, &s, E::kSpawn, S::kStarting, A::kNone);
  Step(K::kHolder, &s, E::kUp, S::kKeeping, A::kAttachKeeper);
  Step(K::kHolder, &s, E::kKept, S::kReady, A::kEnginesMayStart);
  Step(K::kHolder, &s, E::kExited, S::kFailed, A::kScheduleRestart);
  Step(K::kHolder, &s, E::kSpawn, S::kStarting, A::kNone);
}

TEST_CASE("holder: one that lives but cannot be kept is killed, and its exit restarts it") {
  S s = S::kKeeping;
  Step(K::kHolder, &s, E::kKeepFailed, S::kFailed, A::kKill);
  Step(K::kHolder, &s, E::kExited, S::kFailed, A::kScheduleRestart);
  Step(K::kHolder, &s, E::kGiveUp, S::kDown, A::kReportDown);
  CHECK_FALSE(NextChildTransition(K::kHolder, S::kDown, E::kSpawn).has_value());
}

TEST_CASE("holder: one whose readiness line is refused is killed before it is kept, and its exit restarts it") {
  S s = S::kStarting;
  Step(K::kHolder, &s, E::kKeepFailed, S::kFailed, A::kKill);
  Step(K::kHolder, &s, E::kExited, S::kFailed, A::kScheduleRestart);
}

TEST_CASE("holder: an adopted one is kept again without a spawn") {
  S s = S::kIdle;
  Step(K::kHolder, &s, E::kAdopt, S::kKeeping, A::kAttachKeeper);
  Step(K::kHolder, &s, E::kKept, S::kReady, A::kEnginesMayStart);
}

TEST_CASE("front: linked, link lost while alive, relinked - an exit asks for a restart") {
  S s = S::kIdle;
  Step(K::kFront, &s, E::kSpawn, S::kStarting, A::kReconnect);
  Step(K::kFront, &s, E::kLinkLost, S::kStarting, A::kReconnect);
  Step(K::kFront, &s, E::kUp, S::kReady, A::kPushRoutes);
  Step(K::kFront, &s, E::kLinkLost, S::kStarting, A::kReconnect);
  Step(K::kFront, &s, E::kUp, S::kReady, A::kPushRoutes);
  Step(K::kFront, &s, E::kExited, S::kFailed, A::kScheduleRestart);
  Step(K::kFront, &s, E::kSpawn, S::kStarting, A::kReconnect);
}

TEST_CASE("child tables: every state with a process can be stopped, and a stop ends in stopped") {
  for (K kind : {K::kHolder, K::kFront}) {
    for (S s : {S::kIdle, S::kStarting, S::kKeeping, S::kReady, S::kFailed, S::kDown, S::kStopping, S::kStopped}) {
      auto t = NextChildTransition(kind, s, E::kStop);
      if (kind == K::kFront && s == S::kKeeping) {
        CHECK_FALSE(t.has_value());  // the front has no keeper step
        continue;
      }
      INFO(ChildKindName(kind) << " " << ChildStateName(s));
      REQUIRE(t.has_value());
      if (ChildHasProcess(s) && s != S::kStopping) {
        CHECK(t->to == S::kStopping);
        CHECK(t->action == A::kTerminate);
        auto done = NextChildTransition(kind, t->to, E::kExited);
        REQUIRE(done);
        CHECK(done->to == S::kStopped);
      } else if (s != S::kStopping) {
        CHECK(t->to == S::kStopped);
      }
    }
  }
}

TEST_CASE("child tables: names are defined") {
  for (int i = 0; i <= static_cast<int>(S::kStopped); ++i) CHECK(std::string(ChildStateName(static_cast<S>(i))) != "?");
  for (int i = 0; i <= static_cast<int>(E::kStop); ++i) CHECK(std::string(ChildEventName(static_cast<E>(i))) != "?");
  for (int i = 0; i <= static_cast<int>(A::kReportDown); ++i)
    CHECK(std::string(ChildActionName(static_cast<A>(i))) != "?");
}

}  // namespace
}  // namespace wsup
