// The drill tests' node (tests/drills, tests/openai): testkit/node.h with
// the drills' probe timing and a restart budget no run of drills exhausts,
// and what the drills share besides: their load, their pacing and the check
// that nothing was lost.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "testkit/failover_drill.h"
#include "testkit/failover_load.h"
#include "testkit/node.h"
#include "testkit/sanitized.h"
#include "testkit/test_util.h"

namespace wsup::test {

// The supervisor's probe interval and timeout. The probes share the
// engines with 16 busy clients on a small machine: a tight timeout would
// trip a healthy, loaded engine and add failovers the test did not ask for.
// Sanitizer builds run the engines several times slower.
#if WSUP_TEST_SANITIZED
inline constexpr bool kSanitized = true;
inline constexpr int kDrillProbeMs = 3000;
#else
inline constexpr bool kSanitized = false;
inline constexpr int kDrillProbeMs = 1000;
#endif

// A drill node's spec: the probe every kDrillProbeMs with the config's
// failures, restarts at once and without a practical limit.
struct DrillNodeSpec : NodeSpec {
  DrillNodeSpec() {
    probe_ms = kDrillProbeMs;
    probe_failures = 0;
    unlimited_restarts = true;
  }
};

class DrillNode : public Node {
 public:
  explicit DrillNode(std::vector<std::string> extra_sets = {}) : Node(WithSets(std::move(extra_sets))) {}
  explicit DrillNode(DrillNodeSpec spec) : Node(std::move(spec)) {}

 private:
  static DrillNodeSpec WithSets(std::vector<std::string> sets) {
    DrillNodeSpec spec;
    spec.sets = std::move(sets);
    return spec;
  }
};

// Whether testdata/ lacks the checkpoint `model`; if so the test says it is
// skipped, and its caller returns.
bool SkipWithout(const std::string& model);

// The golden answers of the test checkpoint `model` (its golden.json).
std::vector<GoldenCase> DrillGolden(const std::string& model);

// Closed-loop clients on the node's front asking the golden prompts (each
// request may take up to a minute: the engines share a small machine).
test::LoadOptions DrillLoad(const DrillNode& node, int clients);

// Drills paced as the tests pace them: 100 ms and `min_requests_between`
// answers between two, up to two minutes for the node to be ready again.
test::DrillPlan DrillPlanOf(int crash, int planned, int hang, int min_requests_between);

// A drilled load, analysed (test::Analyze), and what a failure should show
// beside it: the node's logs, the analysis by kind, the latency before the
// drills, examples of requests that went wrong, and whether the drills ran.
// A test puts `report` in INFO (Catch2's INFO is scoped to the caller).
struct DrillOutcome {
  nlohmann::json analysis;
  std::string report;
  Status ran;                       // what RunDrills returned (RunAndAnalyze)
  std::vector<DrillRecord> drills;  // the drills it ran (RunAndAnalyze)
};
DrillOutcome AnalyzeDrills(const DrillNode& node, const Status& ran, const std::vector<DrillRecord>& drills,
                           const LoadGenerator& load);

// Runs the plan's drills on the started load, stops the load and analyses
// it (AnalyzeDrills).
DrillOutcome RunAndAnalyze(const DrillNode& node, DrillTarget& target, LoadGenerator& load, const DrillPlan& plan);

// What every drilled load must show: the plan ran, all `drills` of it,
// nothing was lost (CheckNothingLost), and some requests were streams.
void CheckDrilled(DrillOutcome& out, int drills);

// The analysis of one kind of drill: `drills` of them, each of which saw its
// swap and a correct answer sent after it.
nlohmann::json& CheckKind(nlohmann::json& analysis, std::string_view kind, int drills);

// Waits up to 30 s for the node's `wsup report --json` to show what `done`
// looks for (the rows are written as the drills' events come back); the
// last report read is left in `report`.
bool WaitReport(const DrillNode& node, const std::function<bool(nlohmann::json&)>& done, nlohmann::json* report);

// The analysis (test::Analyze) of a drilled load: no request failed, was
// lost, duplicated or wrong, and every one was answered.
void CheckNothingLost(const nlohmann::json& analysis);

}  // namespace wsup::test
