#include "checkpoint/sharding.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <map>

#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors_writer.h"
#include "common/fs.h"
#include "testkit/test_util.h"
#include "tests/text_check.h"

namespace wsup {
namespace {

using test::Has;

std::string ReadWhole(const Checkpoint& ck, const TensorInfo& t) {
  std::string b(t.nbytes, '\0');
  REQUIRE(ck.ReadTensor(t, b.data()).ok());
  return b;
}

// One rank's plan and the bytes ReadShard gave for each tensor.
struct RankShards {
  std::vector<ShardedTensor> plan;
  std::map<std::string, std::string> bytes;
  const ShardedTensor& Get(const std::string& name) const {
    for (const auto& s : plan) {
      if (s.name == name) return s;
    }
    FAIL("no shard " << name);
    return plan.front();
  }
};

std::vector<RankShards> ShardAll(const Checkpoint& ck, int tp) {
  std::vector<RankShards> ranks(static_cast<size_t>(tp));
  for (int r = 0; r < tp; ++r) {
    auto plan = PlanShards(ck, ShardSpec{tp, r});
    if (!plan.ok()) FAIL(plan.error().ToString());
    RankShards& rs = ranks[static_cast<size_t>(r)];
    rs.plan = *plan;
    REQUIRE(rs.plan.size() == ck.tensors().size());
    for (const ShardedTensor& s : rs.plan) {
      std::string b(s.nbytes, '\0');
      auto st = ReadShard(ck, s, b.data());
      if (!st.ok()) FAIL(st.error().ToString());
      rs.bytes[s.name] = std::move(b);
    }
  }
  return ranks;
}

// Puts the ranks' slices back together along the split dimension and
// compares with the original bytes. Ranks that hold the same replicated KV
// head are counted once.
void CheckReassembles(const Checkpoint& ck, const std::vector<RankShards>& ranks) {
  for (size_t i = 0; i < ck.tensors().size(); ++i) {
    const TensorInfo& t = ck.tensors()[i];
    INFO(t.name);
    const std::string whole = ReadWhole(ck, t);
    const ShardedTensor& s0 = ranks[0].Get(t.name);
    CHECK(s0.source == i);
    CHECK(s0.dtype == t.dtype);
    if (s0.split == Split::kReplicate) {
      for (const auto& r : ranks) CHECK(r.bytes.at(t.name) == whole);
      continue;
    }
    std::vector<const RankShards*> distinct;
    int64_t next = 0;
    for (const auto& r : ranks) {
      const ShardedTensor& s = r.Get(t.name);
      const int dim = s.split == Split::kRows ? 0 : 1;
      if (s.start < next) continue;  // a replica of a head already taken
      CHECK(s.start == next);
      next = s.start + s.shape[static_cast<size_t>(dim)];
      distinct.push_back(&r);
    }
    CHECK(next == t.shape[s0.split == Split::kRows ? 0 : 1]);
    std::string joined;
    if (s0.split == Split::kRows) {
      for (const RankShards* r : distinct) joined += r->bytes.at(t.name);
    } else {
      for (int64_t row = 0; row < t.shape[0]; ++row) {
        for (const RankShards* r : distinct) {
          const std::string& b = r->bytes.at(t.name);
          const size_t part = b.size() / static_cast<size_t>(t.shape[0]);
          joined += b.substr(static_cast<size_t>(row) * part, part);
        }
      }
    }
    CHECK(joined == whole);
  }
}

TEST_CASE("TP slices of the real checkpoints reassemble to the original tensors") {
  for (const char* name : {"llama-tiny-f32", "llama-tiny-bf16-sharded"}) {
    if (!test::HaveTestData(name)) continue;
    auto ck = Checkpoint::Open(test::TestData(name));
    REQUIRE(ck.ok());
    for (int tp : {1, 2, 4}) {
      INFO(name << " tp=" << tp);
      auto ranks = ShardAll(*ck, tp);
      CheckReassembles(*ck, ranks);
      const RankShards& r0 = ranks[0];
      CHECK(r0.Get("model.layers.0.self_attn.q_proj.weight").shape == std::vector<int64_t>{256 / tp, 256});
      const Split split = tp == 1 ? Split::kReplicate : Split::kCols;  // tp 1 holds everything whole
      CHECK(r0.Get("model.layers.0.self_attn.o_proj.weight").split == split);
      CHECK(r0.Get("model.layers.0.self_attn.o_proj.weight").shape == std::vector<int64_t>{256, 256 / tp});
      CHECK(r0.Get("model.layers.1.mlp.gate_proj.weight").shape == std::vector<int64_t>{576 / tp, 256});
      CHECK(r0.Get("model.layers.1.mlp.up_proj.weight").split ==
            (tp == 1 ? Split::kReplicate : Split::kRows));
      CHECK(r0.Get("model.layers.1.mlp.down_proj.weight").shape == std::vector<int64_t>{256, 576 / tp});
      CHECK(r0.Get("model.embed_tokens.weight").shape == std::vector<int64_t>{256 / tp, 256});
      CHECK(r0.Get("lm_head.weight").split == (tp == 1 ? Split::kReplicate : Split::kRows));
      CHECK(r0.Get("model.norm.weight").split == Split::kReplicate);
      CHECK(r0.Get("model.layers.0.input_layernorm.weight").split == Split::kReplicate);
    }
  }
}

TEST_CASE("with more ranks than KV heads each rank holds one whole KV head") {
  if (!test::HaveTestData("llama-tiny-f32")) return;
  auto ck = Checkpoint::Open(test::TestData("llama-tiny-f32"));
  REQUIRE(ck.ok());
  auto ranks = ShardAll(*ck, 4);  // 2 KV heads of 64 rows each
  for (const char* n : {"model.layers.0.self_attn.k_proj.weight", "model.layers.1.self_attn.v_proj.weight"}) {
    const TensorInfo& t = *ck->Find(n);
    const std::string whole = ReadWhole(*ck, t);
    const size_t head_bytes = 64 * 256 * 4;
    for (int r = 0; r < 4; ++r) {
      INFO(n << " rank " << r);
      const ShardedTensor& s = ranks[static_cast<size_t>(r)].Get(n);
      const int head = r * 2 / 4;
      CHECK(s.split == Split::kRows);
      CHECK(s.start == head * 64);
      CHECK(s.shape == std::vector<int64_t>{64, 256});
      CHECK(ranks[static_cast<size_t>(r)].bytes.at(n) ==
            whole.substr(static_cast<size_t>(head) * head_bytes, head_bytes));
    }
  }
}

TEST_CASE("block FP8 splits that cut a 128x128 block are refused by name") {
  if (!test::HaveTestData("llama-tiny-fp8-block")) return;
  auto ck = Checkpoint::Open(test::TestData("llama-tiny-fp8-block"));
  REQUIRE(ck.ok());
  auto plan = PlanShards(*ck, ShardSpec{2, 0});
  REQUIRE_FALSE(plan.ok());
  const std::string& m = plan.error().message();
  CHECK(plan.error().code() == Code::kRefused);
  CHECK(Has(m,
            "tensor 'model.layers.0.mlp.down_proj.weight': dimension 1 (576): tp_size 2 gives each rank 288 "
            "columns, which cuts through its 128x128 FP8 scale blocks"));
  CHECK(Has(m, "'model.layers.0.mlp.down_proj.weight_scale_inv'"));
  CHECK(Has(m, "tp sizes this checkpoint can use: 1"));
  // tp 1 keeps everything whole, scales included.
  auto ranks = ShardAll(*ck, 1);
  CheckReassembles(*ck, ranks);
}

// A synthetic Llama-shaped checkpoint whose dimensions allow block FP8 at tp 2.
struct Synthetic {
  test::TempDir tmp;
  std::string dir = tmp.path();
  std::vector<TensorToWrite> tensors;

  static std::string Bytes(size_t n, uint32_t seed) {
    std::string b(n, '\0');
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; ++i) {
      x ^= x << 13;
      x ^= x >> 17;
      x ^= x << 5;
      b[i] = static_cast<char>(x);
    }
    return b;
  }
  void Add(const std::string& name, DType dtype, std::vector<int64_t> shape) {
    size_t n = DTypeSize(dtype);
    for (int64_t d : shape) n *= static_cast<size_t>(d);
    tensors.push_back(
        {name, dtype, std::move(shape), Bytes(n, static_cast<uint32_t>(tensors.size() + 1)), {}});
  }
  void AddFp8(const std::string& w, int64_t rows, int64_t cols) {
    Add(w, DType::kF8E4M3, {rows, cols});
    Add(w + "_scale_inv", DType::kF32, {(rows + 127) / 128, (cols + 127) / 128});
  }
  Result<Checkpoint> Write(const std::string& config) {
    REQUIRE(WriteFileAtomic(dir + "/config.json", config).ok());
    REQUIRE(WriteSafetensors(dir + "/model.safetensors", tensors).ok());
    return Checkpoint::Open(dir);
  }
};

constexpr const char* kBlockConfig = R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 256,
  "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 1, "num_attention_heads": 2,
  "num_key_value_heads": 2, "head_dim": 128,
  "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}})";

TEST_CASE("block FP8 scales split with their weights") {
  Synthetic s;
  s.Add("model.embed_tokens.weight", DType::kBF16, {256, 256});
  for (const char* p : {"q_proj", "k_proj", "v_proj", "o_proj"}) {
    s.AddFp8(std::string("model.layers.0.self_attn.") + p + ".weight", 256, 256);
  }
  s.AddFp8("model.layers.0.mlp.gate_proj.weight", 512, 256);
  s.AddFp8("model.layers.0.mlp.up_proj.weight", 512, 256);
  s.AddFp8("model.layers.0.mlp.down_proj.weight", 256, 512);
  s.Add("model.layers.0.input_layernorm.weight", DType::kBF16, {256});
  auto ck = s.Write(kBlockConfig);
  REQUIRE(ck.ok());
  auto ranks = ShardAll(*ck, 2);
  CheckReassembles(*ck, ranks);
  const ShardedTensor& down = ranks[1].Get("model.layers.0.mlp.down_proj.weight_scale_inv");
  CHECK(down.split == Split::kCols);
  CHECK(down.start == 2);
  CHECK(down.shape == std::vector<int64_t>{2, 2});
  const ShardedTensor& gate = ranks[1].Get("model.layers.0.mlp.gate_proj.weight_scale_inv");
  CHECK(gate.split == Split::kRows);
  CHECK(gate.start == 2);
  CHECK(gate.shape == std::vector<int64_t>{2, 2});

  // tp 4 would give k/v (2 heads of 128 rows) replicas, fine, but q's 2 heads
  // cannot be cut in 4.
  auto four = PlanShards(*ck, ShardSpec{4, 0});
  REQUIRE_FALSE(four.ok());
  CHECK(Has(four.error().message(), "tp sizes this checkpoint can use: 1, 2"));
}

TEST_CASE("a block scale of the wrong shape is refused") {
  Synthetic s;
  s.Add("model.layers.0.mlp.gate_proj.weight", DType::kF8E4M3, {512, 256});
  s.Add("model.layers.0.mlp.gate_proj.weight_scale_inv", DType::kF32, {2, 2});
  auto ck = s.Write(kBlockConfig);
  REQUIRE(ck.ok());
  auto plan = PlanShards(*ck, ShardSpec{1, 0});
  REQUIRE_FALSE(plan.ok());
  CHECK(plan.error().code() == Code::kCorrupt);
  CHECK(Has(plan.error().message(),
            "tensor 'model.layers.0.mlp.gate_proj.weight_scale_inv' does not hold one "
            "scale per 128x128 block of 'model.layers.0.mlp.gate_proj.weight'"));
}

TEST_CASE("column slices read through both the direct and the bounce-buffer paths") {
  Synthetic s;
  s.Add("model.layers.0.mlp.down_proj.weight", DType::kI8, {10, 1 << 20});  // 128 KiB per rank at tp 8
  s.Add("model.layers.1.mlp.down_proj.weight", DType::kF32, {3, 1 << 17});  // 256 KiB per rank at tp 2
  s.Add("model.layers.2.mlp.down_proj.weight", DType::kF32, {1, 64});
  auto ck = s.Write(R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 8, "hidden_size": 64,
      "num_hidden_layers": 3, "num_attention_heads": 8})");
  REQUIRE(ck.ok());
  CheckReassembles(*ck, ShardAll(*ck, 8));
  CheckReassembles(*ck, ShardAll(*ck, 2));
}

TEST_CASE("sizes that do not divide are refused with the sizes that would") {
  if (!test::HaveTestData("llama-tiny-f32")) return;
  auto ck = Checkpoint::Open(test::TestData("llama-tiny-f32"));
  REQUIRE(ck.ok());
  auto three = PlanShards(*ck, ShardSpec{3, 0});
  REQUIRE_FALSE(three.ok());
  CHECK(three.error().code() == Code::kRefused);
  CHECK(Has(three.error().message(), "is not divisible by tp_size 3"));
  CHECK(Has(three.error().message(), "tp sizes this checkpoint can use: 1, 2, 4"));
  auto eight = PlanShards(*ck, ShardSpec{8, 7});
  REQUIRE_FALSE(eight.ok());
  CHECK(Has(eight.error().message(), "tp sizes this checkpoint can use: 1, 2, 4"));

  for (ShardSpec bad : {ShardSpec{0, 0}, ShardSpec{2, 2}, ShardSpec{2, -1}}) {
    auto p = PlanShards(*ck, bad);
    REQUIRE_FALSE(p.ok());
    CHECK(p.error().code() == Code::kInvalidArgument);
    CHECK(Has(p.error().message(), "0 <= tp_rank < tp_size"));
  }
}

TEST_CASE("tensors and architectures without rules are refused only when tp > 1") {
  Synthetic s;
  s.Add("model.layers.0.mlp.gate_proj.weight", DType::kF32, {8, 8});
  s.Add("model.layers.0.mystery.weight", DType::kF32, {8, 8});
  auto ck = s.Write(R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 8, "hidden_size": 8,
      "num_hidden_layers": 1, "num_attention_heads": 2})");
  REQUIRE(ck.ok());
  CHECK(PlanShards(*ck, ShardSpec{1, 0}).ok());
  auto two = PlanShards(*ck, ShardSpec{2, 0});
  REQUIRE_FALSE(two.ok());
  CHECK(Has(two.error().message(),
            "tensor 'model.layers.0.mystery.weight' matches no tensor-parallel rule for "
            "LlamaForCausalLM"));
  CHECK(Has(two.error().message(), "use tp_size 1"));

  Synthetic other;
  other.Add("w", DType::kF32, {8, 8});
  auto ck2 = other.Write(R"({"architectures": ["FalconForCausalLM"], "vocab_size": 8, "hidden_size": 8,
      "num_hidden_layers": 1, "num_attention_heads": 2})");
  REQUIRE(ck2.ok());
  auto p1 = PlanShards(*ck2, ShardSpec{1, 0});
  REQUIRE(p1.ok());
  CHECK((*p1)[0].split == Split::kReplicate);
  auto p2 = PlanShards(*ck2, ShardSpec{2, 1});
  REQUIRE_FALSE(p2.ok());
  CHECK(Has(p2.error().message(), "architecture 'FalconForCausalLM' has no tensor-parallel sharding rules"));
}

TEST_CASE("attention weights that disagree with config.json are refused") {
  Synthetic s;
  s.Add("model.layers.0.self_attn.q_proj.weight", DType::kF32, {12, 8});
  auto ck = s.Write(R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 8, "hidden_size": 8,
      "num_hidden_layers": 1, "num_attention_heads": 2})");
  REQUIRE(ck.ok());
  auto p = PlanShards(*ck, ShardSpec{2, 0});
  REQUIRE_FALSE(p.ok());
  CHECK(p.error().code() == Code::kCorrupt);
  CHECK(Has(p.error().message(), "dimension 0 (12) is not num_attention_heads x head_dim = 2 x 4"));
}

TEST_CASE("ReadShard refuses a shard that does not fit its source") {
  if (!test::HaveTestData("llama-tiny-f32")) return;
  auto ck = Checkpoint::Open(test::TestData("llama-tiny-f32"));
  REQUIRE(ck.ok());
  auto plan = PlanShards(*ck, ShardSpec{2, 1});
  REQUIRE(plan.ok());
  ShardedTensor bad = plan->front();
  bad.start += 1000;
  std::string buf(bad.nbytes, '\0');
  auto st = ReadShard(*ck, bad, buf.data());
  REQUIRE_FALSE(st.ok());
  CHECK(st.code() == Code::kInternal);
  CHECK(Has(st.error().message(), "does not fit its source tensor"));
  bad = plan->front();
  bad.source = 9999;
  CHECK_FALSE(ReadShard(*ck, bad, buf.data()).ok());
}

}  // namespace
}  // namespace wsup
