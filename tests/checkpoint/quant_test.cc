#include "checkpoint/quant.h"

#include <catch2/catch.hpp>

#include "checkpoint/checkpoint.h"
#include "testkit/test_util.h"
#include "tests/text_check.h"

namespace wsup {
namespace {

using test::Has;

ModelConfig WithQuant(const std::string& quant_json) {
  auto c = ParseModelConfig(R"({"vocab_size": 8, "hidden_size": 8, "num_hidden_layers": 1,
      "num_attention_heads": 2, "quantization_config": )" +
                                quant_json + "}",
                            "config.json");
  REQUIRE(c.ok());
  return *c;
}

TEST_CASE("the real per-tensor FP8 checkpoint is refused, naming the method and mode off") {
  if (!test::HaveTestData("llama-tiny-fp8-pertensor")) return;
  auto ck = Checkpoint::Open(test::TestData("llama-tiny-fp8-pertensor"));
  REQUIRE(ck.ok());
  Status s = CheckZeroCopyAllowed(*ck);
  REQUIRE_FALSE(s.ok());
  CHECK(s.code() == Code::kRefused);
  const std::string& m = s.error().message();
  CHECK(Has(m, test::TestData("llama-tiny-fp8-pertensor")));
  CHECK(Has(m, "quantization method 'fp8 (per-tensor)'"));
  CHECK(Has(m, "fold per-tensor FP8 weight scales"));
  CHECK(Has(m, "cannot reproduce"));
  CHECK(Has(m, "weight-cache mode `off`"));
}

TEST_CASE("unquantized and block FP8 checkpoints are allowed") {
  for (const char* name : {"llama-tiny-f32", "llama-tiny-bf16-sharded", "llama-tiny-fp8-block"}) {
    if (!test::HaveTestData(name)) continue;
    INFO(name);
    auto ck = Checkpoint::Open(test::TestData(name));
    REQUIRE(ck.ok());
    Status s = CheckZeroCopyAllowed(*ck);
    CHECK(s.ok());
    if (!s.ok()) FAIL(s.ToString());
  }
}

TEST_CASE("post-load-transformed formats are refused by name") {
  struct Case {
    const char* quant;
    const char* method;
    const char* why;
  } cases[] = {
      {R"({"quant_method": "awq", "bits": 4, "group_size": 128})", "'awq'", "repack"},
      {R"({"quant_method": "gptq", "bits": 4, "desc_act": true})", "'gptq'", "g_idx"},
      {R"({"quant_method": "gptq_marlin"})", "'gptq_marlin'", "Marlin"},
      {R"({"quant_method": "compressed-tensors", "format": "pack-quantized"})", "'compressed-tensors'",
       "repack"},
      {R"({"quant_method": "bitsandbytes", "load_in_4bit": true})", "'bitsandbytes'", "bitsandbytes"},
      {R"({"quant_method": "fp8", "activation_scheme": "static"})", "'fp8 (per-tensor)'", "per-tensor"},
      {R"({"quant_method": "shiny_new_method"})", "'shiny_new_method'", "does not know"},
      {R"({"bits": 4})", "'unknown'", "does not know"},
  };
  for (const Case& c : cases) {
    INFO(c.quant);
    Status s = CheckZeroCopyAllowed(WithQuant(c.quant), {"model.layers.0.mlp.up_proj.weight"}, "/m");
    REQUIRE_FALSE(s.ok());
    CHECK(s.code() == Code::kRefused);
    CHECK(Has(s.error().message(), std::string("/m: quantization method ") + c.method));
    CHECK(Has(s.error().message(), c.why));
    CHECK(Has(s.error().message(), "`off`"));
  }
}

TEST_CASE("an older compressed-tensors config under compression_config is refused too") {
  auto c = ParseModelConfig(R"({"vocab_size": 8, "hidden_size": 8, "num_hidden_layers": 1,
      "num_attention_heads": 2, "compression_config": {"format": "int-quantized"}})",
                            "config.json");
  REQUIRE(c.ok());
  CHECK(c->quant.method == "compressed-tensors");
  Status s = CheckZeroCopyAllowed(*c, {"a.weight"}, "/m");
  REQUIRE_FALSE(s.ok());
  CHECK(Has(s.error().message(), "'compressed-tensors'"));
}

TEST_CASE("tensor names contradicting the quantization config are refused") {
  ModelConfig block = WithQuant(R"({"quant_method": "fp8", "weight_block_size": [128, 128]})");
  CHECK(CheckZeroCopyAllowed(block, {"a.weight", "a.weight_scale_inv"}, "/m").ok());
  Status per_tensor = CheckZeroCopyAllowed(block, {"a.weight", "a.weight_scale"}, "/m");
  REQUIRE_FALSE(per_tensor.ok());
  CHECK(Has(per_tensor.error().message(), "tensor 'a.weight_scale' is a per-tensor scale"));

  auto plain = ParseModelConfig(R"({"vocab_size": 8, "hidden_size": 8, "num_hidden_layers": 1,
      "num_attention_heads": 2})",
                                "config.json");
  REQUIRE(plain.ok());
  CHECK(CheckZeroCopyAllowed(*plain, {"a.weight", "a.bias"}, "/m").ok());
  Status awq_names = CheckZeroCopyAllowed(*plain, {"a.qweight", "a.qzeros"}, "/m");
  REQUIRE_FALSE(awq_names.ok());
  CHECK(awq_names.code() == Code::kRefused);
  CHECK(Has(awq_names.error().message(),
            "tensor 'a.qweight' is a packed int4 (AWQ/GPTQ) tensor but config.json "
            "has no quantization_config"));
}

}  // namespace
}  // namespace wsup
