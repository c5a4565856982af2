// Sharding of the mixture-of-experts checkpoints (Qwen3-MoE, DeepSeek-V3):
// every tensor's slice at each TP size and under expert parallelism, the
// slices put back together, block FP8 refusals, and malformed checkpoints.
#include <catch2/catch.hpp>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors_writer.h"
#include "checkpoint/sharding.h"
#include "common/fs.h"
#include "testkit/test_util.h"
#include "tests/text_check.h"

namespace wsup {
namespace {

using test::Has;
bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string ReadWhole(const Checkpoint& ck, const TensorInfo& t) {
  std::string b(t.nbytes, '\0');
  REQUIRE(ck.ReadTensor(t, b.data()).ok());
  return b;
}

struct Rank {
  std::map<std::string, ShardedTensor> plan;
  std::map<std::string, std::string> bytes;
};

ShardSpec Spec(int tp, int rank, bool ep) { return ShardSpec{tp, rank, ep ? tp : 1, ep ? rank : 0}; }

std::vector<Rank> ShardAll(const Checkpoint& ck, int tp, bool ep) {
  std::vector<Rank> ranks(static_cast<size_t>(tp));
  for (int r = 0; r < tp; ++r) {
    auto plan = PlanShards(ck, Spec(tp, r, ep));
    if (!plan.ok()) FAIL(plan.error().ToString());
    Rank& rk = ranks[static_cast<size_t>(r)];
    for (const ShardedTensor& s : *plan) {
      std::string b(s.nbytes, '\0');
      auto st = ReadShard(ck, s, b.data());
      if (!st.ok()) FAIL(st.error().ToString());
      rk.bytes[s.name] = std::move(b);
      rk.plan[s.name] = s;
    }
  }
  return ranks;
}

// The slice a rank should hold, derived here from config.json and the
// tensor's name independently of the rule tables: split (or replicate), the
// first row or column, and its local shape; nullopt when the rank holds none
// of it (another rank's expert).
struct Want {
  Split split = Split::kReplicate;
  int64_t start = 0;
  std::vector<int64_t> shape;
};

int64_t Expert(const std::string& name) {
  size_t at = name.find(".experts.");
  if (at == std::string::npos) return -1;
  return std::stoll(name.substr(at + 9));
}

std::optional<Want> Expected(const Checkpoint& ck, const TensorInfo& t, int tp, int rank, bool ep) {
  const ModelConfig& c = ck.config();
  std::string name = t.name;
  const bool scale = EndsWith(name, "_scale_inv");
  if (scale) name = name.substr(0, name.size() - 10);
  Want w;
  w.shape = t.shape;
  if (tp == 1) return w;
  const int64_t e = Expert(name);
  if (e >= 0 && ep) {
    const int64_t per = c.num_experts / tp;
    if (e < rank * per || e >= (rank + 1) * per) return std::nullopt;
    return w;
  }
  auto any = [&](std::initializer_list<const char*> parts) {
    for (const char* p : parts) {
      if (Has(name, p)) return true;
    }
    return false;
  };
  const bool rows = any({"embed_tokens", "lm_head", "q_proj", "k_proj", "v_proj", "q_b_proj", "kv_b_proj",
                         "gate_proj", "up_proj"});
  const bool cols = any({"o_proj", "down_proj"});
  if (!rows && !cols) return w;  // norms, routers, biases, q_a/kv_a
  const size_t dim = rows ? 0 : 1;
  w.split = rows ? Split::kRows : Split::kCols;
  const int64_t size = t.shape[dim];
  if (any({"k_proj", "v_proj"}) && tp > c.num_key_value_heads) {
    const int64_t head = rank * c.num_key_value_heads / tp;
    const int64_t per = size / c.num_key_value_heads;
    w.start = head * per;
    w.shape[dim] = per;
    return w;
  }
  w.shape[dim] = size / tp;
  w.start = rank * w.shape[dim];
  return w;
}

// Checks every rank's slice of every tensor against Expected, then puts
// the slices back together and compares with the checkpoint's bytes.
void CheckShards(const Checkpoint& ck, int tp, bool ep) {
  std::vector<Rank> ranks = ShardAll(ck, tp, ep);
  for (const TensorInfo& t : ck.tensors()) {
    INFO(t.name << " tp " << tp << (ep ? " ep" : ""));
    const std::string whole = ReadWhole(ck, t);
    int holders = 0;
    int64_t next = 0;
    std::vector<const std::string*> parts;
    Split split = Split::kReplicate;
    for (int r = 0; r < tp; ++r) {
      INFO("rank " << r);
      const Rank& rk = ranks[static_cast<size_t>(r)];
      auto want = Expected(ck, t, tp, r, ep);
      auto it = rk.plan.find(t.name);
      if (!want) {
        CHECK(it == rk.plan.end());
        continue;
      }
      REQUIRE(it != rk.plan.end());
      const ShardedTensor& s = it->second;
      ++holders;
      CHECK(s.split == want->split);
      CHECK(s.shape == want->shape);
      CHECK(s.dtype == t.dtype);
      split = s.split;
      const std::string& b = rk.bytes.at(t.name);
      if (s.split == Split::kReplicate) {
        CHECK(b == whole);
        continue;
      }
      // Scales follow their weight in block units.
      if (!EndsWith(t.name, "_scale_inv")) CHECK(s.start == want->start);
      if (s.start < next) continue;  // a replica of a KV head already taken
      CHECK(s.start == next);
      next = s.start + s.shape[s.split == Split::kRows ? 0 : 1];
      parts.push_back(&b);
    }
    if (Expert(t.name) >= 0 && ep && tp > 1) CHECK(holders == 1);  // each expert lives on one rank
    if (Expert(t.name) < 0 || !ep || tp == 1) CHECK(holders == tp);
    if (split == Split::kReplicate) continue;
    std::string joined;
    if (split == Split::kRows) {
      for (const std::string* p : parts) joined += *p;
    } else {
      for (int64_t row = 0; row < t.shape[0]; ++row) {
        for (const std::string* p : parts) {
          const size_t part = p->size() / static_cast<size_t>(t.shape[0]);
          joined += p->substr(static_cast<size_t>(row) * part, part);
        }
      }
    }
    CHECK(joined == whole);
  }
}

TEST_CASE("MoE checkpoints: every tensor gets its slice at TP 1, 2, 4 and under EP 2 and 4", "[moe]") {
  for (const char* name : {"qwen3moe-tiny-f32", "qwen3moe-tiny-bf16-sharded", "deepseekv3-tiny-f32"}) {
    if (!test::HaveTestData(name)) {
      WARN("SKIP: no test data " << name);
      continue;
    }
    auto ck = Checkpoint::Open(test::TestData(name));
    REQUIRE(ck.ok());
    CHECK(ck->config().num_experts == 8);
    for (int tp : {1, 2, 4}) CheckShards(*ck, tp, false);
    CheckShards(*ck, 2, true);
    CheckShards(*ck, 4, true);
  }
}

TEST_CASE("MoE slices spelled out for a few tensors", "[moe]") {
  if (!test::HaveTestData("deepseekv3-tiny-f32") || !test::HaveTestData("qwen3moe-tiny-f32")) return;
  auto ds = Checkpoint::Open(test::TestData("deepseekv3-tiny-f32"));
  REQUIRE(ds.ok());
  auto get = [](const std::vector<ShardedTensor>& plan, const std::string& n) -> const ShardedTensor* {
    for (const auto& s : plan) {
      if (s.name == n) return &s;
    }
    return nullptr;
  };
  auto p = PlanShards(*ds, ShardSpec{2, 1});
  REQUIRE(p.ok());
  // q_b: 4 heads of 32 + 16 rows; kv_b: 4 heads of 32 + 32 rows; o_proj: 4 heads of 32 columns.
  const ShardedTensor* qb = get(*p, "model.layers.0.self_attn.q_b_proj.weight");
  REQUIRE(qb);
  CHECK(qb->split == Split::kRows);
  CHECK(qb->start == 96);
  CHECK(qb->shape == std::vector<int64_t>{96, 96});
  const ShardedTensor* kvb = get(*p, "model.layers.1.self_attn.kv_b_proj.weight");
  REQUIRE(kvb);
  CHECK(kvb->start == 128);
  CHECK(kvb->shape == std::vector<int64_t>{128, 64});
  const ShardedTensor* o = get(*p, "model.layers.1.self_attn.o_proj.weight");
  REQUIRE(o);
  CHECK(o->split == Split::kCols);
  CHECK(o->start == 64);
  CHECK(o->shape == std::vector<int64_t>{256, 64});
  for (const char* n :
       {"model.layers.0.self_attn.q_a_proj.weight", "model.layers.0.self_attn.kv_a_proj_with_mqa.weight",
        "model.layers.0.self_attn.q_a_layernorm.weight", "model.layers.0.self_attn.kv_a_layernorm.weight",
        "model.layers.1.mlp.gate.weight", "model.layers.1.mlp.gate.e_score_correction_bias"}) {
    INFO(n);
    REQUIRE(get(*p, n));
    CHECK(get(*p, n)->split == Split::kReplicate);
  }
  const ShardedTensor* shared = get(*p, "model.layers.1.mlp.shared_experts.down_proj.weight");
  REQUIRE(shared);
  CHECK(shared->split == Split::kCols);
  CHECK(shared->shape == std::vector<int64_t>{256, 32});

  // EP 2, rank 1: experts 4..7 whole, none of 0..3; the shared expert still split.
  auto e = PlanShards(*ds, ShardSpec{2, 1, 2, 1});
  REQUIRE(e.ok());
  CHECK(get(*e, "model.layers.1.mlp.experts.3.up_proj.weight") == nullptr);
  const ShardedTensor* x4 = get(*e, "model.layers.1.mlp.experts.4.up_proj.weight");
  REQUIRE(x4);
  CHECK(x4->split == Split::kReplicate);
  CHECK(x4->shape == std::vector<int64_t>{64, 256});
  CHECK(get(*e, "model.layers.1.mlp.shared_experts.up_proj.weight")->shape == std::vector<int64_t>{32, 256});
  CHECK(e->size() == p->size() - 4 * 3);

  auto qw = Checkpoint::Open(test::TestData("qwen3moe-tiny-f32"));
  REQUIRE(qw.ok());
  auto q4 = PlanShards(*qw, ShardSpec{4, 3});
  REQUIRE(q4.ok());
  CHECK(get(*q4, "model.layers.0.self_attn.q_norm.weight")->split == Split::kReplicate);
  CHECK(get(*q4, "model.layers.0.mlp.experts.7.gate_proj.weight")->shape == std::vector<int64_t>{16, 256});
  CHECK(get(*q4, "model.layers.0.mlp.experts.7.gate_proj.weight")->start == 48);
  CHECK(get(*q4, "model.layers.0.mlp.experts.7.down_proj.weight")->shape == std::vector<int64_t>{256, 16});
  CHECK(get(*q4, "model.layers.1.self_attn.k_proj.weight")->start == 64);  // rank 3 holds KV head 1
}

TEST_CASE("the tiny block-FP8 MoE checkpoints split only at TP 1: every split cuts a block", "[moe]") {
  for (const char* name : {"qwen3moe-tiny-fp8-block", "deepseekv3-tiny-fp8-block"}) {
    if (!test::HaveTestData(name)) continue;
    INFO(name);
    auto ck = Checkpoint::Open(test::TestData(name));
    REQUIRE(ck.ok());
    CheckShards(*ck, 1, false);
    for (bool ep : {false, true}) {
      auto two = PlanShards(*ck, Spec(2, 0, ep));
      REQUIRE_FALSE(two.ok());
      const std::string& m = two.error().message();
      INFO(m);
      CHECK(two.error().code() == Code::kRefused);
      CHECK(Has(m, "which cuts through its 128x128 FP8 scale blocks"));
      CHECK(Has(m, "_scale_inv'): rank 0's "));
      CHECK(Has(m, " inside block "));
      CHECK(Has(m, "tp sizes this checkpoint can use: 1; with expert parallelism (ep_size = tp_size): 1"));
    }
  }
}

// A checkpoint written from a real one, changed on the way: tensors
// dropped, resized or added, config.json keys changed.
struct Rewritten {
  test::TempDir tmp;
  std::string dir = tmp.path();

  static std::string Bytes(size_t n) {
    std::string b(n, '\0');
    for (size_t i = 0; i < n; ++i) b[i] = static_cast<char>(i * 131 + 7);
    return b;
  }

  // edit returns false to drop a tensor; it may change its shape (the bytes
  // are then made up).
  Result<Checkpoint> From(const std::string& model, const std::function<bool(TensorToWrite&)>& edit,
                          const std::function<void(nlohmann::json&)>& config_edit = {},
                          std::vector<TensorToWrite> extra = {}) {
    auto src = Checkpoint::Open(test::TestData(model));
    REQUIRE(src.ok());
    std::vector<TensorToWrite> out;
    for (const TensorInfo& t : src->tensors()) {
      TensorToWrite w{t.name, t.dtype, t.shape, ReadWhole(*src, t), {}};
      if (!edit(w)) continue;
      size_t n = DTypeSize(w.dtype);
      for (int64_t d : w.shape) n *= static_cast<size_t>(d);
      if (n != w.data.size()) w.data = Bytes(n);
      out.push_back(std::move(w));
    }
    for (auto& x : extra) {
      size_t n = DTypeSize(x.dtype);
      for (int64_t d : x.shape) n *= static_cast<size_t>(d);
      x.data = Bytes(n);
      out.push_back(std::move(x));
    }
    auto cfg = ReadFile(test::TestData(model) + "/config.json");
    REQUIRE(cfg.ok());
    nlohmann::json j = nlohmann::json::parse(*cfg);
    if (config_edit) config_edit(j);
    REQUIRE(WriteFileAtomic(dir + "/config.json", j.dump()).ok());
    REQUIRE(WriteSafetensors(dir + "/model.safetensors", out).ok());
    return Checkpoint::Open(dir);
  }
};

// Every refusal of a malformed checkpoint holds at every size: the check
// comes before planning.
void CheckRefusedEverywhere(const Checkpoint& ck, Code code, const std::vector<std::string>& needles) {
  for (ShardSpec spec : {ShardSpec{1, 0}, ShardSpec{2, 1}, ShardSpec{2, 0, 2, 0}}) {
    auto p = PlanShards(ck, spec);
    INFO("tp " << spec.tp_size << " ep " << spec.ep_size);
    REQUIRE_FALSE(p.ok());
    INFO(p.error().message());
    CHECK(p.error().code() == code);
    for (const auto& n : needles) CHECK(Has(p.error().message(), n));
  }
}

TEST_CASE("malformed MoE checkpoints are refused with the tensor and the fix", "[moe]") {
  if (!test::HaveTestData("qwen3moe-tiny-f32") || !test::HaveTestData("deepseekv3-tiny-f32")) return;
  const auto keep = [](TensorToWrite&) { return true; };

  SECTION("an expert missing") {
    Rewritten r;
    auto ck = r.From("qwen3moe-tiny-f32", [](TensorToWrite& t) {
      return t.name != "model.layers.1.mlp.experts.5.up_proj.weight";
    });
    REQUIRE(ck.ok());
    CheckRefusedEverywhere(*ck, Code::kCorrupt,
                           {"expert 5 of layer 1 has no 'model.layers.1.mlp.experts.5.up_proj.weight'",
                            "(config.json: 8 experts)", "re-download it"});
  }
  SECTION("an expert of the wrong shape") {
    Rewritten r;
    auto ck = r.From("deepseekv3-tiny-f32", [](TensorToWrite& t) {
      if (t.name == "model.layers.1.mlp.experts.2.down_proj.weight") t.shape = {256, 48};
      return true;
    });
    REQUIRE(ck.ok());
    CheckRefusedEverywhere(
        *ck, Code::kCorrupt,
        {"tensor 'model.layers.1.mlp.experts.2.down_proj.weight' is [256, 48], but an expert "
         "of moe_intermediate_size 64 over hidden_size 256 has down_proj [256, 64]"});
  }
  SECTION("a router of the wrong width") {
    Rewritten r;
    auto ck = r.From("qwen3moe-tiny-f32", [](TensorToWrite& t) {
      if (t.name == "model.layers.0.mlp.gate.weight") t.shape = {7, 256};
      return true;
    });
    REQUIRE(ck.ok());
    CheckRefusedEverywhere(
        *ck, Code::kCorrupt,
        {"router 'model.layers.0.mlp.gate.weight' is [7, 256], but a router over 8 experts "
         "and hidden_size 256 is [8, 256]"});
  }
  SECTION("a router missing") {
    Rewritten r;
    auto ck = r.From("deepseekv3-tiny-f32",
                     [](TensorToWrite& t) { return t.name != "model.layers.1.mlp.gate.weight"; });
    REQUIRE(ck.ok());
    CheckRefusedEverywhere(*ck, Code::kCorrupt, {"layer 1 is sparse by config.json but has no router"});
  }
  SECTION("e_score_correction_bias missing") {
    Rewritten r;
    auto ck = r.From("deepseekv3-tiny-f32", [](TensorToWrite& t) {
      return t.name != "model.layers.1.mlp.gate.e_score_correction_bias";
    });
    REQUIRE(ck.ok());
    CheckRefusedEverywhere(
        *ck, Code::kCorrupt,
        {"layer 1 has a router but no 'model.layers.1.mlp.gate.e_score_correction_bias'", "re-download it"});
  }
  SECTION("e_score_correction_bias of the wrong length") {
    Rewritten r;
    auto ck = r.From("deepseekv3-tiny-f32", [](TensorToWrite& t) {
      if (t.name == "model.layers.1.mlp.gate.e_score_correction_bias") t.shape = {6};
      return true;
    });
    REQUIRE(ck.ok());
    CheckRefusedEverywhere(*ck, Code::kCorrupt, {"is [6], not one value per expert [8]"});
  }
  SECTION("an expert beyond num_experts") {
    Rewritten r;
    auto ck = r.From(
        "qwen3moe-tiny-f32", keep, {},
        {TensorToWrite{"model.layers.0.mlp.experts.8.up_proj.weight", DType::kF32, {64, 256}, {}, {}}});
    REQUIRE(ck.ok());
    CheckRefusedEverywhere(
        *ck, Code::kCorrupt,
        {"'model.layers.0.mlp.experts.8.up_proj.weight' belongs to expert 8, but config.json "
         "has 8 experts (0 to 7)"});
  }
  SECTION("experts in a layer config.json makes dense") {
    Rewritten r;
    auto ck = r.From(
        "deepseekv3-tiny-f32", keep, {},
        {TensorToWrite{"model.layers.0.mlp.experts.0.up_proj.weight", DType::kF32, {64, 256}, {}, {}}});
    REQUIRE(ck.ok());
    CheckRefusedEverywhere(*ck, Code::kCorrupt, {"config.json makes layer 0 dense"});
  }
  SECTION("an expert without a number, under expert parallelism") {
    Rewritten r;
    auto ck = r.From(
        "qwen3moe-tiny-f32", keep, {},
        {TensorToWrite{"model.layers.0.mlp.experts.x.up_proj.weight", DType::kF32, {64, 256}, {}, {}}});
    REQUIRE(ck.ok());
    auto p = PlanShards(*ck, ShardSpec{2, 0, 2, 0});
    REQUIRE_FALSE(p.ok());
    CHECK(p.error().code() == Code::kCorrupt);
    CHECK(Has(p.error().message(),
              "'model.layers.0.mlp.experts.x.up_proj.weight' is named like a routed expert "
              "but has no expert number"));
  }
  SECTION("no expert count in config.json") {
    Rewritten r;
    auto ck = r.From("qwen3moe-tiny-f32", keep, [](nlohmann::json& j) { j.erase("num_local_experts"); });
    REQUIRE(ck.ok());
    CheckRefusedEverywhere(*ck, Code::kCorrupt, {"has no expert count"});
  }
}

TEST_CASE("expert parallelism: sizes and ranks that cannot work are refused", "[moe]") {
  if (!test::HaveTestData("qwen3moe-tiny-f32") || !test::HaveTestData("llama-tiny-f32")) return;
  auto ck = Checkpoint::Open(test::TestData("qwen3moe-tiny-f32"));
  REQUIRE(ck.ok());
  for (ShardSpec bad : {ShardSpec{2, 0, 4, 0}, ShardSpec{2, 0, 2, 1}, ShardSpec{4, 1, 2, 1}}) {
    auto p = PlanShards(*ck, bad);
    REQUIRE_FALSE(p.ok());
    CHECK(p.error().code() == Code::kInvalidArgument);
    CHECK(Has(p.error().message(), "expert parallelism spans the tensor-parallel group"));
  }
  for (ShardSpec bad : {ShardSpec{2, 0, 0, 0}, ShardSpec{2, 0, 2, 2}}) {
    auto p = PlanShards(*ck, bad);
    REQUIRE_FALSE(p.ok());
    CHECK(Has(p.error().message(), "0 <= ep_rank < ep_size"));
  }

  // num_experts 6 cannot be cut into 4 equal shares; 2 works.
  Rewritten r;
  auto six = r.From(
      "qwen3moe-tiny-f32",
      [](TensorToWrite& t) {
        if (t.name.find(".mlp.experts.6.") != std::string::npos) return false;
        if (t.name.find(".mlp.experts.7.") != std::string::npos) return false;
        if (t.name.find(".mlp.gate.weight") != std::string::npos) t.shape = {6, 256};
        return true;
      },
      [](nlohmann::json& j) { j["num_local_experts"] = 6; });
  REQUIRE(six.ok());
  auto four = PlanShards(*six, ShardSpec{4, 0, 4, 0});
  REQUIRE_FALSE(four.ok());
  CHECK(four.error().code() == Code::kRefused);
  CHECK(Has(four.error().message(), "num_experts 6 is not divisible by ep_size 4"));
  CHECK(Has(four.error().message(), "with expert parallelism (ep_size = tp_size): 1, 2"));
  CHECK(PlanShards(*six, ShardSpec{4, 0}).ok());  // TP alone splits each expert
  CheckShards(*six, 2, true);

  // A dense model has nothing to partition.
  auto llama = Checkpoint::Open(test::TestData("llama-tiny-f32"));
  REQUIRE(llama.ok());
  auto dense = PlanShards(*llama, ShardSpec{2, 0, 2, 0});
  REQUIRE_FALSE(dense.ok());
  CHECK(Has(dense.error().message(), "has no routed experts that wsup can partition"));
}

// A Qwen3-MoE of block-aligned sizes: 2 heads of 128, 2 KV heads, 4
// experts of intermediate `inter`, every matrix block FP8.
Result<Checkpoint> WriteFp8Moe(const test::TempDir& tmp, int64_t inter) {
  std::vector<TensorToWrite> ts;
  auto add = [&](const std::string& n, DType d, std::vector<int64_t> shape) {
    size_t bytes = DTypeSize(d);
    for (int64_t x : shape) bytes *= static_cast<size_t>(x);
    ts.push_back({n, d, std::move(shape), Rewritten::Bytes(bytes), {}});
  };
  auto fp8 = [&](const std::string& n, int64_t rows, int64_t cols) {
    add(n, DType::kF8E4M3, {rows, cols});
    add(n + "_scale_inv", DType::kF32, {(rows + 127) / 128, (cols + 127) / 128});
  };
  add("model.embed_tokens.weight", DType::kBF16, {256, 256});
  add("lm_head.weight", DType::kBF16, {256, 256});
  add("model.norm.weight", DType::kBF16, {256});
  const std::string l = "model.layers.0.";
  add(l + "input_layernorm.weight", DType::kBF16, {256});
  add(l + "post_attention_layernorm.weight", DType::kBF16, {256});
  add(l + "self_attn.q_norm.weight", DType::kBF16, {128});
  add(l + "self_attn.k_norm.weight", DType::kBF16, {128});
  for (const char* p : {"q_proj", "k_proj", "v_proj", "o_proj"})
    fp8(l + "self_attn." + p + ".weight", 256, 256);
  add(l + "mlp.gate.weight", DType::kBF16, {4, 256});
  for (int e = 0; e < 4; ++e) {
    const std::string x = l + "mlp.experts." + std::to_string(e) + ".";
    fp8(x + "gate_proj.weight", inter, 256);
    fp8(x + "up_proj.weight", inter, 256);
    fp8(x + "down_proj.weight", 256, inter);
  }
  nlohmann::json cfg = {
      {"architectures", {"Qwen3MoeForCausalLM"}},
      {"vocab_size", 256},
      {"hidden_size", 256},
      {"num_hidden_layers", 1},
      {"num_attention_heads", 2},
      {"num_key_value_heads", 2},
      {"head_dim", 128},
      {"num_experts", 4},
      {"moe_intermediate_size", inter},
      {"quantization_config", {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"weight_block_size", {128, 128}}}}};
  REQUIRE(WriteFileAtomic(tmp.Join("config.json"), cfg.dump()).ok());
  REQUIRE(WriteSafetensors(tmp.Join("model.safetensors"), ts).ok());
  return Checkpoint::Open(tmp.path());
}

TEST_CASE("block FP8 experts: scales move with their expert, and a split through a block names it", "[moe]") {
  test::TempDir wide_dir;
  auto wide = WriteFp8Moe(wide_dir, 256);
  REQUIRE(wide.ok());
  CheckShards(*wide, 2, false);
  CheckShards(*wide, 2, true);
  auto ep = PlanShards(*wide, ShardSpec{2, 1, 2, 1});
  REQUIRE(ep.ok());
  bool saw = false;
  for (const ShardedTensor& s : *ep) {
    if (s.name == "model.layers.0.mlp.experts.2.down_proj.weight_scale_inv") {
      saw = true;
      CHECK(s.split == Split::kReplicate);
      CHECK(s.shape == std::vector<int64_t>{2, 2});
    }
    CHECK(s.name.find("experts.0.") == std::string::npos);
  }
  CHECK(saw);

  // Experts of 128: TP 2 gives each rank 64 rows of every expert, inside
  // one block; EP 2 keeps the experts whole.
  test::TempDir narrow_dir;
  auto narrow = WriteFp8Moe(narrow_dir, 128);
  REQUIRE(narrow.ok());
  auto tp2 = PlanShards(*narrow, ShardSpec{2, 1});
  REQUIRE_FALSE(tp2.ok());
  const std::string& m = tp2.error().message();
  INFO(m);
  CHECK(tp2.error().code() == Code::kRefused);
  CHECK(
      Has(m,
          "tensor 'model.layers.0.mlp.experts.0.gate_proj.weight': dimension 0 (128): tp_size 2 gives each "
          "rank 64 rows, which cuts through its 128x128 FP8 scale blocks "
          "('model.layers.0.mlp.experts.0.gate_proj.weight_scale_inv'): rank 1's rows [64, 128) start inside "
          "block row 0 (rows 0 to 127)"));
  CHECK(Has(m, "tp sizes this checkpoint can use: 1; with expert parallelism (ep_size = tp_size): 1, 2"));
  CheckShards(*narrow, 2, true);
}

}  // namespace
}  // namespace wsup
