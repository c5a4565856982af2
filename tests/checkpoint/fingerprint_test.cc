#include "checkpoint/fingerprint.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors_writer.h"
#include "common/fs.h"
#include "testkit/test_util.h"
#include "tests/text_check.h"

namespace wsup {
namespace {

using test::Has;

const std::vector<std::string> kFields = {
    "model_path", "architecture",      "revision",     "checkpoint",   "checkpoint_files",
    "tp_size",    "tp_rank",           "pp_size",      "pp_rank",      "dp_size",
    "ep_size",    "ep_rank",           "quant_method", "quant_config", "dtype",
    "backend",    "device_capability", "cuda_driver",  "cuda_runtime", "layout_version"};

FingerprintInputs Inputs() {
  return {.model_path = "/models/tiny",
          .revision = "r1",
          .shard = ShardSpec{2, 1},
          .pp_size = 1,
          .pp_rank = 0,
          .dp_size = 1,
          .backend = "cuda",
          .device_capability = "9.0",
          .cuda_driver = "13000",
          .cuda_runtime = "13000"};
}

TEST_CASE("a fingerprint has every field, in order, from the checkpoint and the inputs") {
  if (!test::HaveTestData("llama-tiny-fp8-block")) return;
  auto ck = Checkpoint::Open(test::TestData("llama-tiny-fp8-block"));
  REQUIRE(ck.ok());
  Fingerprint fp = Fingerprint::Compute(*ck, Inputs());
  std::vector<std::string> names;
  for (const auto& [k, v] : fp.fields()) names.push_back(k);
  CHECK(names == kFields);
  CHECK(fp.Get("architecture") == "LlamaForCausalLM");
  CHECK(fp.Get("checkpoint").size() == 64);
  CHECK(fp.Get("checkpoint_files") == "1");
  CHECK(fp.Get("tp_size") == "2");
  CHECK(fp.Get("tp_rank") == "1");
  CHECK(fp.Get("quant_method") == "fp8");
  CHECK(fp.Get("quant_config") == ck->config().quant.json_sha256);
  CHECK(fp.Get("dtype") == "float32");  // config.json's dtype: the model's compute dtype
  CHECK(fp.Get("layout_version") == std::to_string(kArenaLayoutVersion));
  CHECK(fp.Get("no_such_field").empty());
  // Stable: the same checkpoint and inputs give the same fingerprint.
  auto again = Checkpoint::Open(test::TestData("llama-tiny-fp8-block"));
  REQUIRE(again.ok());
  CHECK(Fingerprint::Compute(*again, Inputs()).Compare(fp).empty());
}

TEST_CASE("each field changed alone yields one diff naming it with both values") {
  if (!test::HaveTestData("llama-tiny-f32")) return;
  auto ck = Checkpoint::Open(test::TestData("llama-tiny-f32"));
  REQUIRE(ck.ok());
  const Fingerprint ours = Fingerprint::Compute(*ck, Inputs());
  for (const std::string& field : kFields) {
    INFO(field);
    Fingerprint theirs = ours;
    theirs.Set(field, ours.Get(field) + "-changed");
    auto diffs = ours.Compare(theirs);
    REQUIRE(diffs.size() == 1);
    CHECK(diffs[0].field == field);
    CHECK(diffs[0].ours == ours.Get(field));
    CHECK(diffs[0].theirs == ours.Get(field) + "-changed");
    CHECK(Fingerprint::DescribeDiffs(diffs) ==
          field + ": ours=" + ours.Get(field) + " holder=" + ours.Get(field) + "-changed");
  }
  // Through the inputs as a caller would change them.
  auto diff_of = [&](const FingerprintInputs& in) { return ours.Compare(Fingerprint::Compute(*ck, in)); };
  FingerprintInputs in = Inputs();
  in.shard.tp_rank = 0;
  auto d = diff_of(in);
  REQUIRE(d.size() == 1);
  CHECK(Fingerprint::DescribeDiffs(d) == "tp_rank: ours=1 holder=0");
  // Expert parallelism: a holder of other experts is another fingerprint.
  in = Inputs();
  in.shard.ep_size = 2;
  in.shard.ep_rank = 1;
  d = diff_of(in);
  REQUIRE(d.size() == 2);
  CHECK(Fingerprint::DescribeDiffs(d) == "ep_size: ours=1 holder=2; ep_rank: ours=0 holder=1");
  in = Inputs();
  in.backend = "host";
  d = diff_of(in);
  REQUIRE(d.size() == 1);
  CHECK(d[0].field == "backend");
  in = Inputs();
  in.cuda_driver = "12080";
  d = diff_of(in);
  REQUIRE(d.size() == 1);
  CHECK(d[0].field == "cuda_driver");
}

TEST_CASE("a field one side lacks is a diff too") {
  Fingerprint a, b;
  a.Set("x", "1");
  a.Set("y", "2");
  b.Set("y", "2");
  b.Set("z", "3");
  auto d = a.Compare(b);
  REQUIRE(d.size() == 2);
  CHECK(Fingerprint::DescribeDiffs(d) == "x: ours=1 holder=(absent); z: ours=(absent) holder=3");
}

TEST_CASE("a rewritten header changes the checkpoint field - the same bytes do not") {
  test::TempDir tmp;
  REQUIRE(WriteFileAtomic(tmp.Join("config.json"), R"({"vocab_size": 8, "hidden_size": 8,
      "num_hidden_layers": 1, "num_attention_heads": 2, "torch_dtype": "float32"})")
              .ok());
  TensorToWrite t{"w", DType::kF32, {2}, std::string(8, 'a'), {}};
  REQUIRE(WriteSafetensors(tmp.Join("model.safetensors"), {t}).ok());
  auto one = Checkpoint::Open(tmp.path());
  REQUIRE(one.ok());
  Fingerprint f1 = Fingerprint::Compute(*one, Inputs());
  CHECK(f1.Get("dtype") == "float32");
  CHECK(f1.Get("quant_method") == "none");
  CHECK(f1.Get("quant_config") == "none");
  // Same header, different tensor bytes: headers are all the fingerprint reads.
  t.data = std::string(8, 'b');
  REQUIRE(WriteSafetensors(tmp.Join("model.safetensors"), {t}).ok());
  auto two = Checkpoint::Open(tmp.path());
  REQUIRE(two.ok());
  CHECK(f1.Compare(Fingerprint::Compute(*two, Inputs())).empty());
  t.name = "w2";
  REQUIRE(WriteSafetensors(tmp.Join("model.safetensors"), {t}).ok());
  auto three = Checkpoint::Open(tmp.path());
  REQUIRE(three.ok());
  auto d = f1.Compare(Fingerprint::Compute(*three, Inputs()));
  REQUIRE(d.size() == 1);
  CHECK(d[0].field == "checkpoint");
}

TEST_CASE("different checkpoints differ in the fields that say how") {
  if (!test::HaveTestData("llama-tiny-f32") || !test::HaveTestData("llama-tiny-bf16-sharded")) return;
  auto f32 = Checkpoint::Open(test::TestData("llama-tiny-f32"));
  auto bf16 = Checkpoint::Open(test::TestData("llama-tiny-bf16-sharded"));
  REQUIRE(f32.ok());
  REQUIRE(bf16.ok());
  auto d = Fingerprint::Compute(*f32, Inputs()).Compare(Fingerprint::Compute(*bf16, Inputs()));
  REQUIRE(d.size() == 3);
  CHECK(d[0].field == "checkpoint");
  CHECK(d[1].field == "checkpoint_files");
  CHECK(d[1].ours == "1");
  CHECK(d[1].theirs == "10");
  CHECK(d[2].field == "dtype");
  CHECK(Has(Fingerprint::DescribeDiffs(d), "dtype: ours=float32 holder=bfloat16"));
}

TEST_CASE("fingerprints round-trip through JSON and bad JSON is named") {
  Fingerprint fp;
  for (const std::string& f : kFields) fp.Set(f, f + "-value");
  nlohmann::json j = fp.ToJson();
  CHECK(j.is_object());
  CHECK(j["tp_rank"] == "tp_rank-value");
  auto back = Fingerprint::FromJson(nlohmann::json::parse(j.dump()));
  REQUIRE(back.ok());
  CHECK(back->fields() == fp.fields());  // canonical order restored
  CHECK(back->Compare(fp).empty());

  j["future_field"] = "x";
  auto extra = Fingerprint::FromJson(j);
  REQUIRE(extra.ok());
  CHECK(extra->fields().back().first == "future_field");
  CHECK(extra->Compare(fp).size() == 1);

  auto arr = Fingerprint::FromJson(nlohmann::json::array({1, 2}));
  REQUIRE_FALSE(arr.ok());
  CHECK(arr.error().code() == Code::kInvalidArgument);
  CHECK(Has(arr.error().message(), "fingerprint is a JSON array, not an object of strings"));
  nlohmann::json bad = fp.ToJson();
  bad["tp_size"] = 2;
  auto num = Fingerprint::FromJson(bad);
  REQUIRE_FALSE(num.ok());
  CHECK(Has(num.error().message(), "fingerprint field 'tp_size' is a JSON number, not a string"));
}

}  // namespace
}  // namespace wsup
