// The engine's own lifecycle table (engine/engine_state.h): each row, and
// what is not a row.
#include <catch2/catch.hpp>

#include <set>
#include <string>
#include <utility>

#include "engine/engine_state.h"
#include "tests/transition_table_check.h"

using namespace wsup::engine;

namespace {

using S = EngineState;
using E = EngineEvent;
using A = EngineAction;

void ExpectRow(S from, E event, S to, A action) {
  INFO(EngineStateName(from) << " x " << EngineEventName(event));
  auto t = NextEngineTransition(from, event);
  REQUIRE(t.has_value());
  CHECK(t->to == to);
  CHECK(t->action == action);
}

}  // namespace

TEST_CASE("engine state: each (state, event) pair appears at most once") {
  size_t n = 0;
  const EngineTransition* t = EngineTable(&n);
  REQUIRE(n == 8);  // a new row needs its own case below
  wsup::test::CheckPairsOnce(t, n, EngineStateName, EngineEventName);
}

TEST_CASE("engine state: the names are the status contract") {
  CHECK(std::string(EngineStateName(S::kStarting)) == "starting");
  CHECK(std::string(EngineStateName(S::kReady)) == "ready");
  CHECK(std::string(EngineStateName(S::kStopping)) == "stopping");
  for (E e : {E::kLoaded, E::kStartupFailed, E::kListenFailed, E::kStop}) CHECK(std::string(EngineEventName(e)) != "?");
  for (A a : {A::kNone, A::kStartServing, A::kShutDown}) CHECK(std::string(EngineActionName(a)) != "?");
}

TEST_CASE("engine state: loaded while starting serves") {
  ExpectRow(S::kStarting, E::kLoaded, S::kReady, A::kStartServing);
}

TEST_CASE("engine state: a failed startup or listen stops the engine") {
  ExpectRow(S::kStarting, E::kStartupFailed, S::kStopping, A::kShutDown);
  ExpectRow(S::kStarting, E::kListenFailed, S::kStopping, A::kShutDown);
}

TEST_CASE("engine state: a signal stops a starting or a ready engine") {
  ExpectRow(S::kStarting, E::kStop, S::kStopping, A::kShutDown);
  ExpectRow(S::kReady, E::kStop, S::kStopping, A::kShutDown);
}

TEST_CASE("engine state: news after the stop began is dropped, and the engine stays stopping") {
  ExpectRow(S::kStopping, E::kStop, S::kStopping, A::kNone);
  ExpectRow(S::kStopping, E::kLoaded, S::kStopping, A::kNone);
  ExpectRow(S::kStopping, E::kStartupFailed, S::kStopping, A::kNone);
}

TEST_CASE("engine state: what cannot happen is not a row") {
  // A ready engine has loaded and listens already.
  CHECK_FALSE(NextEngineTransition(S::kReady, E::kLoaded).has_value());
  CHECK_FALSE(NextEngineTransition(S::kReady, E::kStartupFailed).has_value());
  CHECK_FALSE(NextEngineTransition(S::kReady, E::kListenFailed).has_value());
  // The socket is bound before the startup thread starts.
  CHECK_FALSE(NextEngineTransition(S::kStopping, E::kListenFailed).has_value());
  // Nothing leaves stopping.
  size_t n = 0;
  const EngineTransition* t = EngineTable(&n);
  for (size_t i = 0; i < n; ++i) {
    if (t[i].from == S::kStopping) CHECK(t[i].to == S::kStopping);
  }
}
