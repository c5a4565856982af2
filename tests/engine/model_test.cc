#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "common/fs.h"
#include "engine/kernels.h"
#include "engine/runner.h"
#include "tests/engine/golden.h"
#include "testkit/test_util.h"
#include "tests/engine/tiny_runner.h"

using namespace wsup;
using namespace wsup::engine;

namespace {

using test::Golden;
using test::LoadGolden;
using test::Top5;

using WeightEdit = std::function<std::unique_ptr<engine::WeightSource>(std::unique_ptr<engine::WeightSource>)>;

Checkpoint OpenTestCheckpoint(const std::string& model) {
  REQUIRE(test::HaveTestData(model));
  auto ckpt = Checkpoint::Open(test::TestData(model));
  REQUIRE(ckpt.ok());
  return std::move(*ckpt);
}

// Why rank 0 of `tp` is refused the checkpoint's whole (unsharded) weights,
// as `edit` leaves them.
std::string BindRefused(const Checkpoint& ckpt, int tp, const WeightEdit& edit = nullptr) {
  auto w = LoadWeightsFromDisk(ckpt, ShardSpec{1, 0}, 1);
  REQUIRE(w.ok());
  std::unique_ptr<engine::WeightSource> weights = std::move(*w);
  if (edit) weights = edit(std::move(weights));
  auto d = ModelDims::From(ckpt.config(), tp, 0);
  REQUIRE(d.ok());
  auto m = RankModel::Bind(*d, *weights, 1);
  REQUIRE_FALSE(m.ok());
  return m.error().message();
}

std::unique_ptr<ModelRunner> MakeRunner(const std::string& model, int tp, int threads = 1) {
  return testing::CpuRunner(model, {.tp = tp, .threads = threads, .kv_bytes = 1 << 20});
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


// Cases whose smallest top-1/top-2 gap is under exact_margin are run and
// reported, not compared: a right float32 implementation may pick the
// other token there (the test data's README).
void CheckGolden(const std::string& model, int tp, float first8_tol, bool want_logits, double exact_margin = 0) {
  REQUIRE(test::HaveTestData(model));
  auto runner = MakeRunner(model, tp);
  int compared = 0;
  for (const auto& g : LoadGolden(model)) {
    if (want_logits) REQUIRE(g.top5.size() == 5);
    INFO(model << " tp=" << tp << " prompt '" << g.prompt << "'");
    std::vector<float> logits;
    auto out = Greedy(*runner, g.prompt_ids, 16, &logits);
    if (g.margin < exact_margin) {
      WARN(model << " prompt '" << g.prompt << "' (top-1/top-2 margin " << g.margin << ", under " << exact_margin
                 << ", not compared): " << (out == g.output_ids ? "matches the golden" : "differs from the golden"));
      continue;
    }
    ++compared;
    CHECK(out == g.output_ids);
    if (!g.top5.empty()) CHECK(Top5(logits) == g.top5);
    for (size_t i = 0; i < g.first8.size(); ++i) CHECK(std::fabs(logits[i] - g.first8[i]) < first8_tol);
  }
  CHECK(compared > 0);
}

// A sharded checkpoint loads on one rank and decodes a few finite tokens.
void CheckShardedDecodes(const std::string& model) {
  REQUIRE(test::HaveTestData(model));
  auto runner = MakeRunner(model, 1);
  std::vector<float> logits;
  auto out = Greedy(*runner, {119, 115, 117, 112}, 4, &logits);
  CHECK(out.size() == 4);
  CHECK(std::all_of(logits.begin(), logits.end(), [](float v) { return std::isfinite(v); }));
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

// The order every dot product sums in (kernels.cc): eight running sums, one
// per lane, added pairwise, then the tail. Written out in scalars.
static float ReferenceDot(const float* a, const float* b, int64_t n) {
  float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int k = 0; k < 8; ++k) s[k] += a[i + k] * b[i + k];
  }
  float tail = 0;
  for (; i < n; ++i) tail += a[i] * b[i];
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7])) + tail;
}

TEST_CASE("kernels: every product is bit for bit the reference order, whatever the batch, grouping or vector unit") {
  // Shapes that leave partial row groups, odd batches and column tails.
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{7, 19}, {37, 64}, {16, 8}, {5, 3}, {64, 257}}) {
    std::vector<float> w(static_cast<size_t>(rows * cols));
    for (size_t i = 0; i < w.size(); ++i) w[i] = std::sin(static_cast<float>(i) * 0.37f) * 1.7f;
    MatrixRef m{DType::kF32, rows, cols, w.data(), nullptr, 0, 0};
    ThreadPool pool(3);
    for (int64_t batch : {1, 2, 3, 5, 8}) {
      std::vector<float> x(static_cast<size_t>(batch * cols));
      for (size_t i = 0; i < x.size(); ++i) x[i] = std::cos(static_cast<float>(i) * 0.11f) - 0.25f;
      std::vector<float> y(static_cast<size_t>(batch * rows), -1);
      MatMulT(m, x.data(), batch, y.data(), pool);
      for (int64_t b = 0; b < batch; ++b) {
        for (int64_t r = 0; r < rows; ++r) {
          const float* wr = w.data() + r * cols;
          const float* xb = x.data() + b * cols;
          const float want = ReferenceDot(wr, xb, cols);
          const float dot = Dot(wr, xb, cols);
          INFO(rows << "x" << cols << " batch " << batch << " row " << r << " of batch row " << b);
          // Bitwise: a rounding change here would change greedy outputs
          // between machines, or between a request alone and in a batch.
          uint32_t got_bits, want_bits, dot_bits;
          std::memcpy(&got_bits, &y[static_cast<size_t>(b * rows + r)], 4);
          std::memcpy(&want_bits, &want, 4);
          std::memcpy(&dot_bits, &dot, 4);
          REQUIRE(got_bits == want_bits);
          REQUIRE(dot_bits == want_bits);
        }
      }
    }
  }
}

TEST_CASE("model: llama-tiny-f32 reproduces the golden outputs and logits") { CheckGolden("llama-tiny-f32", 1, 1e-3f, true); }

TEST_CASE("model: llama-tiny-fp8-block reproduces the golden outputs and logits") {
  CheckGolden("llama-tiny-fp8-block", 1, 1e-3f, false);
}

TEST_CASE("model: tensor parallel over threads (tp 2 and 4) reproduces the f32 goldens") {
  CheckGolden("llama-tiny-f32", 2, 1e-3f, true);
  CheckGolden("llama-tiny-f32", 4, 1e-3f, true);
}

TEST_CASE("model: the sharded bf16 checkpoint loads and decodes") { CheckShardedDecodes("llama-tiny-bf16-sharded"); }

TEST_CASE("model: refusals name the problem") {
  const Checkpoint ckpt = OpenTestCheckpoint("llama-tiny-f32");
  SECTION("tp that does not divide the heads") {
    auto d = ModelDims::From(ckpt.config(), 3, 0);
    REQUIRE_FALSE(d.ok());
    CHECK(d.error().message().find("--tp 3") != std::string::npos);
  }
  SECTION("a rank given the wrong shard") {
    CHECK(BindRefused(ckpt, 2).find("has shape") != std::string::npos);
  }
  SECTION("per-tensor fp8 is refused") {
    CHECK(BindRefused(OpenTestCheckpoint("llama-tiny-fp8-pertensor"), 1).find("block scale") != std::string::npos);
  }
}

TEST_CASE("model: qwen3moe-tiny reproduces the golden outputs and logits (f32, fp8-block)", "[moe]") {
  CheckGolden("qwen3moe-tiny-f32", 1, 1e-3f, true, 1e-3);
  CheckGolden("qwen3moe-tiny-fp8-block", 1, 1e-3f, false, 1e-3);
}

TEST_CASE("model: deepseekv3-tiny reproduces the golden outputs and logits (f32, fp8-block)", "[moe]") {
  CheckGolden("deepseekv3-tiny-f32", 1, 1e-3f, true, 1e-3);
  CheckGolden("deepseekv3-tiny-fp8-block", 1, 1e-3f, false, 1e-3);
}

TEST_CASE("model: the sharded bf16 qwen3moe checkpoint loads and decodes", "[moe]") {
  CheckShardedDecodes("qwen3moe-tiny-bf16-sharded");
}

TEST_CASE("model: a batch of several sequences gives each its own MoE goldens", "[moe]") {
  // Two prompts in one step: each token is routed on its own, so a batch
  // must give the same first tokens as the prompts alone.
  for (const char* model : {"qwen3moe-tiny-f32", "deepseekv3-tiny-f32"}) {
    REQUIRE(test::HaveTestData(model));
    auto runner = MakeRunner(model, 1);
    auto golden = LoadGolden(model);
    REQUIRE(golden.size() >= 2);
    std::vector<int32_t> t0, t1;
    const int per = runner->num_blocks() / 2;
    for (int i = 0; i < per; ++i) {
      t0.push_back(i);
      t1.push_back(per + i);
    }
    StepBatch b;
    b.block_tables = {&t0, &t1};
    for (int s = 0; s < 2; ++s) {
      const auto& ids = golden[static_cast<size_t>(s)].prompt_ids;
      for (size_t i = 0; i < ids.size(); ++i) {
        b.tokens.push_back(ids[i]);
        b.positions.push_back(static_cast<int32_t>(i));
        b.seq.push_back(s);
      }
      b.logit_rows.push_back(static_cast<int32_t>(b.tokens.size() - 1));
    }
    std::vector<float> logits;
    REQUIRE(runner->Step(b, &logits).ok());
    const int64_t V = runner->dims().vocab;
    for (int s = 0; s < 2; ++s) {
      INFO(model << " sequence " << s);
      std::vector<float> row(logits.begin() + s * V, logits.begin() + (s + 1) * V);
      CHECK(static_cast<int>(std::max_element(row.begin(), row.end()) - row.begin()) ==
            golden[static_cast<size_t>(s)].output_ids[0]);
    }
  }
}

namespace {

// A rank's weights with some tensors taken away or given another shape, to
// test refusals without writing checkpoints (the bytes stay the loader's).
class EditedWeights : public engine::WeightSource {
 public:
  EditedWeights(std::unique_ptr<engine::WeightSource> base, const std::string& drop, const std::string& reshape,
                std::vector<int64_t> shape)
      : base_(std::move(base)) {
    for (const auto& t : base_->tensors()) {
      if (t.name == drop) continue;
      tensors_.push_back(t);
      if (t.name == reshape) tensors_.back().shape = shape;
    }
    Index();
  }
  const char* source() const override { return "disk"; }

 private:
  std::unique_ptr<engine::WeightSource> base_;
};

std::string BindError(const std::string& model, const std::string& drop, const std::string& reshape = "",
                      std::vector<int64_t> shape = {}) {
  return BindRefused(OpenTestCheckpoint(model), 1, [&](std::unique_ptr<engine::WeightSource> w) {
    return std::make_unique<EditedWeights>(std::move(w), drop, reshape, shape);
  });
}

bool Has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("model: malformed MoE checkpoints are refused naming the tensor and the fix", "[moe]") {
  struct Case {
    const char* name;
    const char* model;
    const char* drop;     // a tensor taken out
    const char* reshape;  // or one given `shape`
    std::vector<int64_t> shape;
    std::vector<std::string> says;
  } cases[] = {
      {"an expert missing", "qwen3moe-tiny-f32", "model.layers.1.mlp.experts.5.up_proj.weight", "", {},
       {"'model.layers.1.mlp.experts.5.up_proj.weight' is missing", "re-download"}},
      {"an expert of the wrong shape", "deepseekv3-tiny-f32", "", "model.layers.1.mlp.experts.3.down_proj.weight",
       {256, 32},
       {"'model.layers.1.mlp.experts.3.down_proj.weight' has shape [256, 32]", "[256, 64]",
        "restore the matching files"}},
      {"a router of the wrong width", "qwen3moe-tiny-f32", "", "model.layers.0.mlp.gate.weight", {6, 256},
       {"router 'model.layers.0.mlp.gate.weight' has shape [6, 256]", "8 experts"}},
      {"e_score_correction_bias missing", "deepseekv3-tiny-fp8-block",
       "model.layers.1.mlp.gate.e_score_correction_bias", "", {},
       {"'model.layers.1.mlp.gate.e_score_correction_bias' is missing", "re-download"}},
      {"an expert's block scale missing", "qwen3moe-tiny-fp8-block",
       "model.layers.0.mlp.experts.2.gate_proj.weight_scale_inv", "", {},
       {"'model.layers.0.mlp.experts.2.gate_proj.weight_scale_inv'"}},
      {"an MLA projection missing", "deepseekv3-tiny-f32", "model.layers.0.self_attn.kv_b_proj.weight", "", {},
       {"'model.layers.0.self_attn.kv_b_proj.weight' is missing", "DeepSeek-V3"}},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    auto msg = BindError(c.model, c.drop, c.reshape, c.shape);
    INFO(msg);
    for (const std::string& part : c.says) CHECK(Has(msg, part));
  }
}

TEST_CASE("model: MoE configs the engine cannot compute are refused with the fix", "[moe]") {
  const Checkpoint ckpt = OpenTestCheckpoint("qwen3moe-tiny-f32");
  SECTION("tensor and expert parallel slices") {
    auto d = ModelDims::From(ckpt.config(), 2, 1);
    REQUIRE(d.ok());
    CHECK(d->local_moe_inter == 32);
    CHECK(d->local_experts == 8);
    CHECK(d->expert_start == 0);
    auto e = ModelDims::From(ckpt.config(), 2, 1, 2);
    REQUIRE(e.ok());
    CHECK(e->local_moe_inter == 64);
    CHECK(e->local_experts == 4);
    CHECK(e->expert_start == 4);
  }
  SECTION("a tp that cuts the heads, and an ep that is not the tp") {
    auto d = ModelDims::From(ckpt.config(), 3, 0);
    REQUIRE_FALSE(d.ok());
    CHECK(Has(d.error().message(), "--tp 3 does not divide num_attention_heads 4"));
    auto e = ModelDims::From(ckpt.config(), 4, 0, 2);
    REQUIRE_FALSE(e.ok());
    CHECK(Has(e.error().message(), "pass --ep-size 4"));
  }
  auto edit = [&](const std::function<void(nlohmann::json&)>& f, int tp = 1, int ep = 1) {
    // config.json as the checkpoint has it, edited, then read the one way
    // the engine gets it (ParseModelConfig).
    auto text = ReadFile(test::TestData("qwen3moe-tiny-f32") + "/config.json");
    REQUIRE(text.ok());
    auto j = nlohmann::json::parse(*text);
    f(j);
    auto c = ParseModelConfig(j.dump(), "config.json");
    REQUIRE(c.ok());
    return ModelDims::From(*c, tp, 0, ep);
  };
  // Why the edited config is refused.
  auto refused = [&](const std::function<void(nlohmann::json&)>& f, int tp = 1, int ep = 1) {
    auto d = edit(f, tp, ep);
    REQUIRE_FALSE(d.ok());
    return d.error().message();
  };
  SECTION("experts that the ranks cannot share evenly") {
    std::string msg = refused([](nlohmann::json& j) { j["num_local_experts"] = 6; }, 4, 4);
    CHECK(Has(msg, "num_experts 6 is not divisible by the expert-parallel size 4"));
    CHECK(Has(msg, "(1, 2)"));
  }
  SECTION("an expert width that tp does not divide") {
    std::string msg = refused([](nlohmann::json& j) { j["moe_intermediate_size"] = 66; }, 4);
    CHECK(Has(msg, "--tp 4 does not divide moe_intermediate_size 66"));
    CHECK(Has(msg, "--expert-parallel"));
  }
  SECTION("top-k above the experts") {
    std::string msg = refused([](nlohmann::json& j) { j["num_experts_per_tok"] = 9; });
    CHECK(Has(msg, "num_experts_per_tok 9"));
  }
  SECTION("a missing key") {
    std::string msg = refused([](nlohmann::json& j) { j.erase("moe_intermediate_size"); });
    CHECK(Has(msg, "'moe_intermediate_size' is missing"));
  }
  SECTION("scaled rope") {
    std::string msg = refused([](nlohmann::json& j) { j["rope_parameters"]["rope_type"] = "yarn"; });
    CHECK(Has(msg, "default rope"));
  }
  SECTION("dense layers by mlp_only_layers and decoder_sparse_step") {
    auto d = edit([](nlohmann::json& j) { j["mlp_only_layers"] = {0}; });
    REQUIRE(d.ok());
    CHECK(d->sparse == std::vector<bool>{false, true});
    d = edit([](nlohmann::json& j) { j["decoder_sparse_step"] = 2; });
    REQUIRE(d.ok());
    CHECK(d->sparse == std::vector<bool>{false, true});
  }
}
