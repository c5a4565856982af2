#include "tests/drills/drill_node.h"

#include <catch2/catch.hpp>

namespace wsup::test {

using nlohmann::json;
using namespace std::chrono_literals;

test::LoadOptions DrillLoad(const DrillNode& node, int clients) {
  test::LoadOptions lo;
  lo.port = node.FrontPort();
  REQUIRE(lo.port > 0);
  lo.clients = clients;
  lo.request_timeout_ms = 60'000;
  return lo;
}

test::DrillPlan DrillPlanOf(int crash, int planned, int hang, int min_requests_between) {
  test::DrillPlan plan;
  plan.crash = crash;
  plan.planned = planned;
  plan.hang = hang;
  plan.gap = std::chrono::milliseconds(100);
  plan.min_requests_between = min_requests_between;
  plan.ready_limit = std::chrono::seconds(120);
  plan.verbose = false;
  return plan;
}

DrillOutcome AnalyzeDrills(const DrillNode& node, const Status& ran, const std::vector<DrillRecord>& drills,
                           const LoadGenerator& load) {
  DrillOutcome out;
  out.analysis = Analyze(drills, load.records());
  out.report = node.LogTails() + "\nby kind: " + out.analysis["by_kind"].dump(1) +
               "\nlatency before the drills: " + out.analysis["latency_before_drills"].dump(1) +
               "\nrequests not ok: " + out.analysis["not_ok_examples"].dump(1) + "\n" +
               (ran.ok() ? std::string("drills ran") : ran.error().message());
  return out;
}

void CheckNothingLost(const nlohmann::json& analysis) {
  const nlohmann::json& total = analysis["total"];
  CHECK(total["failed"] == 0);
  CHECK(total["lost"] == 0);
  CHECK(total["duplicated"] == 0);
  CHECK(total["wrong"] == 0);
  CHECK(total["ok"] == total["requests"]);
  CHECK(total["requests"].get<int64_t>() > 0);
}

}  // namespace wsup::test
