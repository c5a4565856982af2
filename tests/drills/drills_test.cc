// Failover drills under load on a real node (acceptance 1 of the failover
// issue): 16 concurrent clients, half of them streaming, send greedy
// completions of the golden cases through the front while 20 crash drills
// (SIGKILL of the active engine's process group) and 20 planned drills
// (`failover` with drill=true on the supervisor's socket) alternate. Not
// one request may fail, be lost, be duplicated or differ from the golden
// output; streamed completions are compared whole.
//
// The load and the drills are testkit/failover_load.h and
// testkit/failover_drill.h, the same code as wsup-bench-failover.
//
// Under sanitizers the engines run several times slower and the drill
// counts are scaled down to 5 + 5 so the test fits the CI's time; the
// normal build always runs 20 + 20.
#include <catch2/catch.hpp>

#include <chrono>

#include <nlohmann/json.hpp>

#include "testkit/failover_drill.h"
#include "testkit/failover_load.h"
#include "tests/drills/drill_node.h"
#include "testkit/test_util.h"

namespace wsup {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

constexpr int kDrills = test::kSanitized ? 5 : 20;

TEST_CASE("drills: crash and planned failovers under 16 clients lose, fail and duplicate nothing", "[drills]") {
  if (test::SkipWithout("llama-tiny-f32")) return;
  const std::vector<test::GoldenCase> golden = test::DrillGolden("llama-tiny-f32");

  test::DrillNode node;
  node.Start();
  INFO(node.Log());
  REQUIRE(node.WaitServing());

  auto target = test::MakeWsupTarget({node.SupervisorSocket(), node.FrontSocket()});
  test::LoadGenerator load(test::DrillLoad(node, 16), golden);
  test::DrillPlan plan = test::DrillPlanOf(kDrills, kDrills, 0, 16);

  load.Start();
  test::DrillOutcome out = test::RunAndAnalyze(node, *target, load, plan);
  INFO(out.report);
  json& a = out.analysis;
  test::CheckDrilled(out, 2 * kDrills);
  const json& total = a["total"];
  CHECK(total["streams"].get<int64_t>() < total["requests"].get<int64_t>());
  for (const char* kind : {"crash", "planned"}) {
    const json& k = test::CheckKind(a, kind, kDrills);
    CHECK(k["requests"].get<int64_t>() >= 16 * kDrills);
  }
  // The crashes caught requests in flight: some streams were resumed on the
  // new active engine, and they too equal the goldens (counted ok above).
  CHECK(a["by_kind"]["crash"]["resumed"].get<int64_t>() > 0);
}

}  // namespace
}  // namespace wsup
