// Kill drills on the mixture-of-experts demo node (issue 14, acceptance 3):
// config/demo-moe.toml as it is (qwen3moe-tiny-f32 on the CPU, a host
// holder run by the supervisor) with test ports and folders. A few clients,
// half of them streaming, send greedy completions of the golden cases
// through the front while the holder is SIGKILLed (the engines keep
// serving from their mappings, a new holder adopts the kept memfds) and
// then five crash drills SIGKILL the active engine; every re-armed engine
// attaches to the adopted weights. Not one request may fail, be lost or
// differ from the golden token ids, and `wsup report` counts the hits.
//
// Kept small for the CI's time: 4 clients, 8 tokens, 5 drills.
#include <signal.h>

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

constexpr int kMoeDrills = 5;
constexpr int kMoeTokens = 8;

// The engines send token t as the character U+00tt (the test checkpoints'
// byte tokenizer). The wanted text is made here from the golden token ids,
// so an answer whose text equals it has exactly the golden ids.
std::string TextOfIds(const std::vector<int>& ids) {
  std::string s;
  for (int t : ids) {
    REQUIRE(t >= 0);
    REQUIRE(t < 256);
    if (t < 0x80) {
      s += static_cast<char>(t);
    } else {
      s += static_cast<char>(0xC0 | (t >> 6));
      s += static_cast<char>(0x80 | (t & 0x3F));
    }
  }
  return s;
}

TEST_CASE(
    "drills: the MoE demo node survives a holder SIGKILL and 5 kill drills under load - 0 failed, 0 wrong, "
    "the re-armed engines hit the cache",
    "[drills][moe]") {
  if (test::SkipWithout("qwen3moe-tiny-f32")) return;
  std::vector<test::GoldenCase> golden = test::DrillGolden("qwen3moe-tiny-f32");
  for (auto& g : golden) {
    // The full golden text is the rendering of its ids; the prefix wanted
    // here is rendered from the ids alone.
    REQUIRE(g.text == TextOfIds(g.output_ids));
    REQUIRE(g.output_ids.size() >= static_cast<size_t>(kMoeTokens));
    g.output_ids.resize(kMoeTokens);
    g.text = TextOfIds(g.output_ids);
  }

  test::DrillNodeSpec spec;
  spec.config = "demo-moe.toml";
  spec.model = "qwen3moe-tiny-f32";
  test::DrillNode node(spec);
  node.Start();
  INFO(node.Log());
  REQUIRE(node.WaitServing());

  auto target = test::MakeWsupTarget({node.SupervisorSocket(), node.FrontSocket()});
  test::LoadOptions lo = test::DrillLoad(node, 4);
  lo.max_tokens = kMoeTokens;
  test::LoadGenerator load(lo, golden);
  load.Start();

  // The holder dies under load: the engines keep answering (checked with the
  // load below), and the supervisor starts a new holder on the kept fds.
  auto s0 = node.Status();
  REQUIRE(s0);
  REQUIRE((*s0)["holders"].size() == 1);
  const int hpid = (*s0)["holders"][0].value("pid", 0);
  REQUIRE(hpid > 0);
  const uint64_t before_kill = load.completed();
  REQUIRE(::kill(hpid, SIGKILL) == 0);
  REQUIRE(test::WaitFor(
      [&] {
        auto s = node.Status();
        if (!s) return false;
        const json& h = (*s)["holders"][0];
        return h.value("pid", 0) > 0 && h.value("pid", 0) != hpid && h.value("state", "") == "ready";
      },
      30s));
  const std::string hlog = test::ReadAll(node.dir().Join("state/logs/holder-0.log"));
  INFO(hlog);
  CHECK(hlog.find("adopt") != std::string::npos);
  // Answers went on while the holder was gone and came back.
  REQUIRE(test::WaitFor([&] { return load.completed() >= before_kill + 8; }, 30s));

  // Five kill drills; each re-armed engine attaches to the new holder.
  test::DrillPlan plan = test::DrillPlanOf(kMoeDrills, 0, 0, 4);
  plan.ready_limit = 60s;
  test::DrillOutcome out = test::RunAndAnalyze(node, *target, load, plan);
  INFO(out.report);
  test::CheckDrilled(out, kMoeDrills);
  test::CheckKind(out.analysis, "crash", kMoeDrills);

  // The ledger, through `wsup report`: the two first engines and the five
  // re-armed ones attached (hits), nothing loaded from disk by an engine;
  // one holder restart, from the kept fds.
  REQUIRE(node.WaitServing());
  json rj;
  REQUIRE(test::WaitReport(node, [](json& r) { return r["cache"].value("hits", 0) >= 2 + kMoeDrills; }, &rj));
  INFO(rj.dump(1));
  CHECK(rj["cache"]["hits"] == 2 + kMoeDrills);
  CHECK(rj["cache"]["misses"] == 0);
  CHECK(rj["failovers"]["crash"].get<int64_t>() >= kMoeDrills);
  auto text = node.Cli({"report"});
  INFO(text.output);
  CHECK(text.exit_code == 0);
  CHECK(text.output.find(std::to_string(2 + kMoeDrills) + " hits") != std::string::npos);
  CHECK(text.output.find("hit rate 100.0%") != std::string::npos);
  CHECK(text.output.find("holder restarts: 1 (1 from kept fds)") != std::string::npos);
}

}  // namespace
}  // namespace wsup
