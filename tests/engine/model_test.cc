#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "common/fs.h"
#include "engine/kernels.h"
#include "engine/runner.h"
#include "tests/engine/golden.h"
#include "tests/test_util.h"

using namespace wsup;
using namespace wsup::engine;

namespace {

using test::Golden;
using test::LoadGolden;
using test::Top5;

std::unique_ptr<ModelRunner> MakeRunner(const std::string& model, int tp, int threads = 1) {
  auto ckpt = Checkpoint::Open(test::TestData(model));
  REQUIRE(ckpt.ok());
  std::vector<std::unique_ptr<engine::WeightSource>> w;
  for (int r = 0; r < tp; ++r) {
    auto src = LoadWeightsFromDisk(*ckpt, ShardSpec{tp, r}, 2);
    if (!src.ok()) FAIL(src.error().ToString());
    w.push_back(std::move(*src));
  }
  RunnerOptions o;
  o.threads_per_rank = threads;
  auto runner = ModelRunner::Create(ckpt->config(), std::move(w), o);
  if (!runner.ok()) FAIL(runner.error().ToString());
  REQUIRE(runner.value()->InitCommunicator().ok());
  REQUIRE(runner.value()->AllocateKv(1 << 20, 16).ok());
  return std::move(runner.value());
}

// Prompt pass, then greedy decode, one sequence in blocks 0...
std::vector<int> Greedy(ModelRunner& r, const std::vector<int>& prompt, int n, std::vector<float>* prompt_logits) {
  std::vector<int32_t> table;
  for (int i = 0; i < r.num_blocks(); ++i) table.push_back(i);
  StepBatch b;
  for (size_t i = 0; i < prompt.size(); ++i) {
    b.tokens.push_back(prompt[i]);
    b.positions.push_back(static_cast<int32_t>(i));
    b.seq.push_back(0);
  }
  b.block_tables.push_back(&table);
  b.logit_rows.push_back(static_cast<int32_t>(prompt.size() - 1));
  std::vector<float> logits;
  REQUIRE(r.Step(b, &logits).ok());
  *prompt_logits = logits;
  std::vector<int> out;
  int pos = static_cast<int>(prompt.size());
  for (int i = 0; i < n; ++i) {
    int next = static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    out.push_back(next);
    if (i + 1 == n) break;
    b.tokens = {next};
    b.positions = {pos++};
    b.seq = {0};
    b.logit_rows = {0};
    REQUIRE(r.Step(b, &logits).ok());
  }
  return out;
}


void CheckGolden(const std::string& model, int tp, float first8_tol, bool want_logits) {
  REQUIRE(test::HaveTestData(model));
  auto runner = MakeRunner(model, tp);
  for (const auto& g : LoadGolden(model)) {
    if (want_logits) REQUIRE(g.top5.size() == 5);
    INFO(model << " tp=" << tp << " prompt '" << g.prompt << "'");
    std::vector<float> logits;
    auto out = Greedy(*runner, g.prompt_ids, 16, &logits);
    CHECK(out == g.output_ids);
    if (!g.top5.empty()) CHECK(Top5(logits) == g.top5);
    for (size_t i = 0; i < g.first8.size(); ++i) CHECK(std::fabs(logits[i] - g.first8[i]) < first8_tol);
  }
}

}  // namespace

TEST_CASE("kernels: conversions are exact") {
  CHECK(Bf16ToFloat(0x3f80) == 1.0f);
  CHECK(Bf16ToFloat(0xc000) == -2.0f);
  CHECK(F16ToFloat(0x3c00) == 1.0f);
  CHECK(F16ToFloat(0x0001) == std::ldexp(1.0f, -24));
  CHECK(F16ToFloat(0xfbff) == -65504.0f);
  CHECK(std::isinf(F16ToFloat(0x7c00)));
  CHECK(Fp8E4M3ToFloat(0x38) == 1.0f);
  CHECK(Fp8E4M3ToFloat(0x7e) == 448.0f);
  CHECK(Fp8E4M3ToFloat(0x01) == std::ldexp(1.0f, -9));
  CHECK(Fp8E4M3ToFloat(0xb8) == -1.0f);
  CHECK(std::isnan(Fp8E4M3ToFloat(0x7f)));
}

TEST_CASE("kernels: block FP8 rows apply each block's scale, edge blocks partial") {
  // 3 x 5 matrix, blocks of 2 x 2: scales 2 x 3.
  std::vector<uint8_t> w(15, 0x38);  // all 1.0
  std::vector<float> scales = {1, 2, 3, 4, 5, 6};
  MatrixRef m{DType::kF8E4M3, 3, 5, w.data(), scales.data(), 2, 2};
  std::vector<float> row(5);
  LoadRow(m, 2, row.data());
  CHECK(row == std::vector<float>{4, 4, 5, 5, 6});
  ThreadPool pool(2);
  std::vector<float> x = {1, 1, 1, 1, 1, 0, 0, 0, 0, 1};
  std::vector<float> y(6);
  MatMulT(m, x.data(), 2, y.data(), pool);
  CHECK(y == std::vector<float>{9, 9, 24, 3, 3, 6});
}

TEST_CASE("model: llama-tiny-f32 reproduces the golden outputs and logits") { CheckGolden("llama-tiny-f32", 1, 1e-3f, true); }

TEST_CASE("model: llama-tiny-fp8-block reproduces the golden outputs and logits") {
  CheckGolden("llama-tiny-fp8-block", 1, 1e-3f, false);
}

TEST_CASE("model: tensor parallel over threads (tp 2 and 4) reproduces the f32 goldens") {
  CheckGolden("llama-tiny-f32", 2, 1e-3f, true);
  CheckGolden("llama-tiny-f32", 4, 1e-3f, true);
}

TEST_CASE("model: the sharded bf16 checkpoint loads and decodes") {
  REQUIRE(test::HaveTestData("llama-tiny-bf16-sharded"));
  auto runner = MakeRunner("llama-tiny-bf16-sharded", 1);
  std::vector<float> logits;
  auto out = Greedy(*runner, {119, 115, 117, 112}, 4, &logits);
  CHECK(out.size() == 4);
  CHECK(std::all_of(logits.begin(), logits.end(), [](float v) { return std::isfinite(v); }));
}

TEST_CASE("model: refusals name the problem") {
  REQUIRE(test::HaveTestData("llama-tiny-f32"));
  auto ckpt = Checkpoint::Open(test::TestData("llama-tiny-f32"));
  REQUIRE(ckpt.ok());
  SECTION("tp that does not divide the heads") {
    auto d = ModelDims::From(ckpt->config(), 3, 0);
    REQUIRE_FALSE(d.ok());
    CHECK(d.error().message().find("--tp 3") != std::string::npos);
  }
  SECTION("a rank given the wrong shard") {
    auto w = LoadWeightsFromDisk(*ckpt, ShardSpec{1, 0}, 1);
    REQUIRE(w.ok());
    auto d = ModelDims::From(ckpt->config(), 2, 0);
    REQUIRE(d.ok());
    auto m = RankModel::Bind(*d, **w, 1);
    REQUIRE_FALSE(m.ok());
    CHECK(m.error().message().find("has shape") != std::string::npos);
  }
  SECTION("per-tensor fp8 is refused") {
    REQUIRE(test::HaveTestData("llama-tiny-fp8-pertensor"));
    auto pt = Checkpoint::Open(test::TestData("llama-tiny-fp8-pertensor"));
    REQUIRE(pt.ok());
    auto w = LoadWeightsFromDisk(*pt, ShardSpec{1, 0}, 1);
    REQUIRE(w.ok());
    auto d = ModelDims::From(pt->config(), 1, 0);
    REQUIRE(d.ok());
    auto m = RankModel::Bind(*d, **w, 1);
    REQUIRE_FALSE(m.ok());
    CHECK(m.error().message().find("block scale") != std::string::npos);
  }
}
