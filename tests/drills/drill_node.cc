#include "tests/drills/drill_node.h"

#include <catch2/catch.hpp>

namespace wsup::test {

using nlohmann::json;
using namespace std::chrono_literals;

bool SkipWithout(const std::string& model) {
  if (HaveTestData(model)) return false;
  WARN("SKIP: testdata/" << model << " is missing");
  return true;
}

std::vector<GoldenCase> DrillGolden(const std::string& model) {
  auto golden = LoadGolden(TestData(model + "/golden.json"));
  REQUIRE(golden.ok());
  return std::move(*golden);
}

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

DrillOutcome RunAndAnalyze(const DrillNode& node, DrillTarget& target, LoadGenerator& load, const DrillPlan& plan) {
  std::vector<DrillRecord> drills;
  Status ran = RunDrills(target, load, plan, &drills);
  load.Stop();
  DrillOutcome out = AnalyzeDrills(node, ran, drills, load);
  out.ran = std::move(ran);
  out.drills = std::move(drills);
  return out;
}

void CheckDrilled(DrillOutcome& out, int drills) {
  REQUIRE(out.ran.ok());
  REQUIRE(out.drills.size() == static_cast<size_t>(drills));
  CheckNothingLost(out.analysis);
  CHECK(out.analysis["total"]["streams"].get<int64_t>() > 0);
}

nlohmann::json& CheckKind(nlohmann::json& analysis, std::string_view kind, int drills) {
  nlohmann::json& k = analysis["by_kind"][std::string(kind)];
  CHECK(k["drills"] == drills);
  CHECK(k["swap_unseen"] == 0);
  CHECK(k["no_first_ok"] == 0);
  return k;
}

bool WaitReport(const DrillNode& node, const std::function<bool(nlohmann::json&)>& done, nlohmann::json* report) {
  return WaitFor(
      [&] {
        auto r = node.Cli({"report", "--json"});
        if (r.exit_code != 0) return false;
        *report = json::parse(r.output, nullptr, false);
        return !report->is_discarded() && done(*report);
      },
      30s);
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
