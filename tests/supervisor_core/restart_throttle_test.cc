// The one restart policy of engines, holders and the front, driven by
// made-up monotonic times: no clock, no sleeping.
#include <catch2/catch.hpp>

#include "supervisor/restart_throttle.h"

namespace wsup {
namespace {

using Kind = RestartDecision::Kind;

RestartPolicy Policy(bool give_up) {
  RestartPolicy p;
  p.backoff_ms = 100;
  p.backoff_max_ms = 1000;
  p.max_restarts = 3;
  p.window_ms = 10'000;
  p.give_up = give_up;
  p.permanent_exit_codes = {78};
  return p;
}

TEST_CASE("throttle: the first restart after a quiet period is immediate, then the delay doubles up to the cap") {
  RestartThrottle t(Policy(true));
  auto d = t.OnExit(0, 1);
  CHECK(d.kind == Kind::kRestart);
  CHECK(d.delay_ms == 0);
  CHECK(t.OnExit(10, 1).delay_ms == 100);
  CHECK(t.OnExit(20, 1).delay_ms == 200);
  CHECK(t.total() == 3);
  CHECK_FALSE(t.crash_looping());
}

TEST_CASE("throttle: max_restarts within the window gives up, or without give_up keeps going at the cap") {
  SECTION("give up (engines, holders)") {
    RestartThrottle t(Policy(true));
    for (int i = 0; i < 3; ++i) REQUIRE(t.OnExit(i * 10, 1).kind == Kind::kRestart);
    auto d = t.OnExit(40, 1);
    CHECK(d.kind == Kind::kGiveUp);
    CHECK(d.crash_looping);
    CHECK(d.recent == 3);
    CHECK(t.crash_looping());
    CHECK(d.Describe().find("not restarted") != std::string::npos);
  }
  SECTION("never give up (the front): throttled to the cap and reported") {
    RestartThrottle t(Policy(false));
    for (int i = 0; i < 3; ++i) REQUIRE(t.OnExit(i * 10, 1).kind == Kind::kRestart);
    for (int i = 0; i < 5; ++i) {
      auto d = t.OnExit(100 + i * 10, 1);
      CHECK(d.kind == Kind::kRestart);
      CHECK(d.crash_looping);
      CHECK(d.delay_ms == 1000);
    }
    CHECK(t.crash_looping());
  }
}

TEST_CASE("throttle: restarts older than the window are forgotten, and with them the back-off") {
  RestartThrottle t(Policy(true));
  for (int i = 0; i < 3; ++i) t.OnExit(i * 10, 1);
  CHECK(t.Recent(5'000) == 3);
  CHECK(t.Recent(20'000) == 0);
  auto d = t.OnExit(20'000, 1);
  CHECK(d.kind == Kind::kRestart);
  CHECK(d.delay_ms == 0);
  CHECK_FALSE(t.crash_looping());
}

TEST_CASE("throttle: a permanent-failure exit code is never restarted, whatever the history") {
  RestartThrottle t(Policy(false));
  auto d = t.OnExit(0, 78);
  CHECK(d.kind == Kind::kPermanent);
  CHECK(t.total() == 0);
  // A signal or an unknown status (-1) is never permanent.
  CHECK(t.OnExit(10, -1).kind == Kind::kRestart);
  CHECK_FALSE(t.IsPermanent(-1));
  CHECK(t.IsPermanent(78));
}

}  // namespace
}  // namespace wsup
