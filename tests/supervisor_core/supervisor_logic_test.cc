// The supervisor's own logic, in-process: the real Supervisor on simulated
// processes (a fake Launcher) and timers that fire only when the test moves
// its FakeClock. A crash-looping engine, front and holder are each throttled
// by the one restart policy, and each gives up (or, the front, keeps trying)
// exactly as that policy says; a permanent-failure exit is never retried.
// No test sleeps: time passes when the test says so.
#include <catch2/catch.hpp>
#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <map>
#include <memory>
#include <set>

#include <nlohmann/json.hpp>

#include "common/fs.h"
#include "supervisor/config.h"
#include "supervisor/launcher.h"
#include "supervisor/loop_timer.h"
#include "supervisor/supervisor.h"
#include "tests/supervisor_core/logic_rig.h"
#include "testkit/test_util.h"

namespace wsup {
namespace {

using nlohmann::json;

using logic::Rig;

TEST_CASE("logic: a crash-looping engine is restarted at once, then backed off, then given up on", "[logic]") {
  Rig r("off");
  REQUIRE(r.procs.Live("engine-a") > 0);
  REQUIRE(r.procs.Live("engine-b") > 0);
  // Quiet before: at once. Then 1 s, 2 s (doubling), then the loop is called.
  CHECK(r.CrashAndTimeRestart("engine-a", 1) == 0);
  CHECK(r.CrashAndTimeRestart("engine-a", 1) == 1000);
  CHECK(r.CrashAndTimeRestart("engine-a", 1) == 2000);
  CHECK(r.CrashAndTimeRestart("engine-a", 1) == -1);
  json s = r.Status();
  INFO(s.dump());
  CHECK(s.value("state", "") == "degraded");
  CHECK(s.value("degraded_reason", "").find("engine a failed 3 times") != std::string::npos);
  CHECK(r.Engine("a").value("restarts", 0) == 3);
  CHECK(r.Engine("a").value("state", "") == "failed");
  // The other slot was never touched.
  CHECK(r.procs.Spawned("engine-b") == 1);
}

TEST_CASE("logic: an engine that exits with the permanent-failure code is not restarted", "[logic]") {
  Rig r("off");
  CHECK(r.CrashAndTimeRestart("engine-a", kExitConfig) == -1);
  json s = r.Status();
  INFO(s.dump());
  CHECK(s.value("state", "") == "degraded");
  CHECK(r.Engine("a").value("failure", "").find("exited with 78") != std::string::npos);
  CHECK(r.Engine("a").value("restarts", -1) == 0);
  // A signal is never permanent: the other slot's crash is restarted.
  CHECK(r.CrashAndTimeRestart("engine-b", 1) == 0);
}

TEST_CASE("logic: a crash-looping front is throttled by the same policy, reported, and never left down", "[logic]") {
  Rig r("off");
  REQUIRE(r.procs.Live("front") > 0);
  CHECK(r.CrashAndTimeRestart("front", 1) == 0);
  CHECK(r.CrashAndTimeRestart("front", 1) == 1000);
  CHECK(r.CrashAndTimeRestart("front", 1) == 2000);
  CHECK_FALSE(r.Status()["front"].value("crash_looping", true));
  // The loop: restarted at the cap, and said so.
  CHECK(r.CrashAndTimeRestart("front", 1) == 4000);
  CHECK(r.CrashAndTimeRestart("front", 1) == 4000);
  json s = r.Status();
  INFO(s.dump());
  CHECK(s["front"].value("crash_looping", false));
  CHECK(s["front"].value("restarts", 0) == 5);
  CHECK(s.value("state", "") != "degraded");
  // Its permanent-failure code: left down, the node degraded with the reason.
  CHECK(r.CrashAndTimeRestart("front", kExitConfig) == -1);
  s = r.Status();
  CHECK(s.value("state", "") == "degraded");
  CHECK(s["front"].value("state", "") == "down");
  CHECK(s["front"].value("failure", "").find("permanent-failure code") != std::string::npos);
}

TEST_CASE("logic: a crash-looping holder is throttled by the same policy and given up on", "[logic]") {
  Rig r("daemon");
  REQUIRE(r.procs.Live("holder") > 0);
  // Engines wait for the holder.
  CHECK(r.procs.Spawned("engine-a") == 0);
  CHECK(r.CrashAndTimeRestart("holder", 1) == 0);
  CHECK(r.CrashAndTimeRestart("holder", 1) == 1000);
  CHECK(r.CrashAndTimeRestart("holder", 1) == 2000);
  CHECK(r.CrashAndTimeRestart("holder", 1) == -1);
  json s = r.Status();
  INFO(s.dump());
  CHECK(s.value("state", "") == "degraded");
  CHECK(s["holders"][0].value("state", "") == "down");
  CHECK(s.value("degraded_reason", "").find("holder rank 0 failed 3 times") != std::string::npos);
  CHECK(r.procs.Spawned("engine-a") == 0);
}

TEST_CASE("logic: a holder that refuses its checkpoint (exit 3) is not restarted", "[logic]") {
  Rig r("daemon");
  CHECK(r.CrashAndTimeRestart("holder", kExitRefused) == -1);
  json s = r.Status();
  INFO(s.dump());
  CHECK(s["holders"][0].value("state", "") == "down");
  CHECK(s.value("degraded_reason", "").find("refused to serve") != std::string::npos);
}

TEST_CASE("logic: restarts spread out in time are each immediate: the window forgets", "[logic]") {
  Rig r("off", 10'000);
  for (int i = 0; i < 6; ++i) {
    CHECK(r.CrashAndTimeRestart("engine-a", 1) == 0);
    r.Advance(10'001);  // past supervisor.restart_window_ms
  }
  CHECK(r.Status().value("state", "") != "degraded");
}

}  // namespace
}  // namespace wsup
