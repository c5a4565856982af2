// The rules for the front's `silent` report (supervisor/silence_check.h):
// a stopped process trips at once, a running one is probed first, and
// nothing is tripped without a proven standby or for an engine no longer
// routed.
#include "supervisor/silence_check.h"

#include <catch2/catch.hpp>

namespace wsup {
namespace {

TEST_CASE("silence: a stopped active engine with a proven standby is tripped at once", "[logic]") {
  for (char state : {'T', 't'}) {
    SilenceVerdict v = JudgeSilence(true, true, 42, state);
    CHECK(v.step == SilenceStep::kTrip);
    CHECK(v.why == "its process 42 is stopped (SIGSTOP or a debugger)");
  }
}

TEST_CASE("silence: a running active engine is probed before anything is decided", "[logic]") {
  for (char state : {'R', 'S', 'D'}) {
    SilenceVerdict v = JudgeSilence(true, true, 42, state);
    CHECK(v.step == SilenceStep::kConfirm);
    CHECK(v.why.find("runs") != std::string::npos);
  }
}

TEST_CASE("silence: stale reports, no standby, or a process gone or exiting are not acted on", "[logic]") {
  CHECK(JudgeSilence(false, true, 42, 'T').step == SilenceStep::kIgnore);
  SilenceVerdict alone = JudgeSilence(true, false, 42, 'T');
  CHECK(alone.step == SilenceStep::kIgnore);
  CHECK(alone.why.find("no proven standby") != std::string::npos);
  CHECK(JudgeSilence(true, true, 0, 'R').step == SilenceStep::kIgnore);
  CHECK(JudgeSilence(true, true, 42, 0).step == SilenceStep::kIgnore);
  for (char state : {'Z', 'X', 'x'}) {
    SilenceVerdict v = JudgeSilence(true, true, 42, state);
    CHECK(v.step == SilenceStep::kIgnore);
    CHECK(v.why.find("exiting") != std::string::npos);
  }
}

}  // namespace
}  // namespace wsup
