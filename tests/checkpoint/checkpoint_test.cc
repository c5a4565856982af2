#include "checkpoint/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <nlohmann/json.hpp>

#include "checkpoint/safetensors_writer.h"
#include "common/fs.h"
#include "common/sha256.h"
#include "testkit/test_util.h"
#include "tests/text_check.h"

namespace wsup {
namespace {

using nlohmann::json;

using test::Has;

// The checkpoint's tensors.json: name -> {file, dtype (torch name), shape, sha256}.
json ReadTensorsJson(const std::string& dir) {
  auto text = ReadFile(dir + "/tensors.json");
  REQUIRE(text.ok());
  return json::parse(*text);
}

void CheckEveryTensorAgainstItsDigest(const std::string& name) {
  if (!test::HaveTestData(name)) {
    WARN("test data " << name << " is absent; skipped");
    return;
  }
  const std::string dir = test::TestData(name);
  auto ck = Checkpoint::Open(dir);
  REQUIRE(ck.ok());
  json expected = ReadTensorsJson(dir);
  REQUIRE(ck->tensors().size() == expected.size());
  for (auto it = expected.begin(); it != expected.end(); ++it) {
    INFO(name << ": " << it.key());
    const TensorInfo* t = ck->Find(it.key());
    REQUIRE(t != nullptr);
    auto dtype = DTypeFromTorchName((*it)["dtype"].get<std::string>());
    REQUIRE(dtype.ok());
    CHECK(t->dtype == *dtype);
    CHECK(t->shape == (*it)["shape"].get<std::vector<int64_t>>());
    CHECK(ck->files()[static_cast<size_t>(t->file)].name == (*it)["file"].get<std::string>());
    std::vector<uint8_t> bytes(t->nbytes);
    REQUIRE(ck->ReadTensor(*t, bytes.data()).ok());
    CHECK(Sha256Hex(bytes.data(), bytes.size()) == (*it)["sha256"].get<std::string>());
  }
}

TEST_CASE("every tensor of the real checkpoints reads back to its recorded sha256") {
  CheckEveryTensorAgainstItsDigest("llama-tiny-f32");
  CheckEveryTensorAgainstItsDigest("llama-tiny-bf16-sharded");
  CheckEveryTensorAgainstItsDigest("llama-tiny-fp8-block");
  CheckEveryTensorAgainstItsDigest("llama-tiny-fp8-pertensor");
}

TEST_CASE("Open reads config.json and the shard layout") {
  if (!test::HaveTestData("llama-tiny-bf16-sharded")) return;
  auto ck = Checkpoint::Open(test::TestData("llama-tiny-bf16-sharded"));
  REQUIRE(ck.ok());
  const ModelConfig& c = ck->config();
  CHECK(c.architecture == "LlamaForCausalLM");
  CHECK(c.model_type == "llama");
  CHECK(c.torch_dtype == "bfloat16");
  CHECK(c.vocab_size == 256);
  CHECK(c.hidden_size == 256);
  CHECK(c.intermediate_size == 576);
  CHECK(c.num_hidden_layers == 2);
  CHECK(c.num_attention_heads == 4);
  CHECK(c.num_key_value_heads == 2);
  CHECK(c.head_dim == 64);
  CHECK(c.rope_theta == Approx(10000.0));
  CHECK(c.rms_norm_eps == Approx(1e-5));
  CHECK_FALSE(c.tie_word_embeddings);
  CHECK(c.quant.method == "none");
  CHECK(c.quant.json_sha256.empty());
  REQUIRE(ck->files().size() == 10);
  CHECK(ck->files()[0].name == "model-00001-of-00010.safetensors");
  CHECK(ck->total_bytes() == 2820608);  // the index's total_size
  for (const ShardFile& f : ck->files()) {
    CHECK(f.header_sha256.size() == 64);
    CHECK(f.header_len > 0);
  }
  CHECK(ck->Find("no.such.tensor") == nullptr);
}

TEST_CASE("Open reads the block FP8 quantization_config") {
  if (!test::HaveTestData("llama-tiny-fp8-block")) return;
  auto ck = Checkpoint::Open(test::TestData("llama-tiny-fp8-block"));
  REQUIRE(ck.ok());
  const QuantConfig& q = ck->config().quant;
  CHECK(q.method == "fp8");
  CHECK(q.fmt == "e4m3");
  CHECK(q.activation_scheme == "dynamic");
  CHECK(q.weight_block_size == std::vector<int64_t>{128, 128});
  CHECK(q.json_sha256 == Sha256Hex(q.json));
  CHECK(json::parse(q.json)["weight_block_size"] == json({128, 128}));
}

TEST_CASE("ParseModelConfig reads both config layouts and applies defaults") {
  struct Layout {
    const char* name;
    const char* text;
    const char* torch_dtype;
    double rope_theta;
    int64_t head_dim;
    int64_t num_key_value_heads;
    bool tie_word_embeddings;
  } layouts[] = {
      {"older layout: top-level rope_theta and torch_dtype; head_dim and kv heads defaulted",
       R"({"architectures": ["LlamaForCausalLM"], "torch_dtype": "float16",
        "vocab_size": 32000, "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
        "rope_theta": 500000.0, "tie_word_embeddings": true})",
       "float16", 500000.0, 128, 32, true},
      {"newer layout: rope_parameters and dtype",
       R"({"dtype": "bfloat16", "vocab_size": 8, "hidden_size": 8,
        "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
        "rope_parameters": {"rope_theta": 1234.5, "rope_type": "default"}})",
       "bfloat16", 1234.5, 16, 1, false},
  };
  for (const Layout& k : layouts) {
    INFO(k.name);
    auto c = ParseModelConfig(k.text, "c.json");
    REQUIRE(c.ok());
    CHECK(c->torch_dtype == k.torch_dtype);
    CHECK(c->rope_theta == Approx(k.rope_theta));
    CHECK(c->head_dim == k.head_dim);
    CHECK(c->num_key_value_heads == k.num_key_value_heads);
    CHECK(c->tie_word_embeddings == k.tie_word_embeddings);
  }
  SECTION("bad values are named with the key and the file") {
    struct Case {
      const char* text;
      const char* expect;
    } cases[] = {
        {"{", "not valid JSON"},
        {"[1]", "not a JSON object"},
        {"{\"a\": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]"
         "]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}",
         "nested deeper than the limit of 64 levels"},
        {R"({"vocab_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2})",
         "'hidden_size' is missing"},
        {R"({"vocab_size": 8, "hidden_size": "big", "num_hidden_layers": 1, "num_attention_heads": 2})",
         "'hidden_size' is \"big\", not a positive integer"},
        {R"({"vocab_size": 8, "hidden_size": -8, "num_hidden_layers": 1, "num_attention_heads": 2})",
         "'hidden_size' is -8"},
        {R"({"vocab_size": 8, "hidden_size": 9, "num_hidden_layers": 1, "num_attention_heads": 2})",
         "not divisible by num_attention_heads"},
        {R"({"vocab_size": 8, "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 4,
             "num_key_value_heads": 3})",
         "not a multiple of num_key_value_heads 3"},
        {R"({"vocab_size": 8, "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
             "quantization_config": [1]})",
         "quantization_config is [1], not an object"},
        {R"({"vocab_size": 8, "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
             "quantization_config": {"quant_method": "fp8", "weight_block_size": [128]}})",
         "weight_block_size is [128]"},
        {R"({"vocab_size": 8, "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
             "architectures": "Llama"})",
         "'architectures'"},
    };
    for (const Case& k : cases) {
      INFO(k.text);
      auto c = ParseModelConfig(k.text, "/m/config.json");
      REQUIRE_FALSE(c.ok());
      CHECK(c.error().code() == Code::kCorrupt);
      CHECK(Has(c.error().message(), "/m/config.json"));
      CHECK(Has(c.error().message(), k.expect));
      CHECK(Has(c.error().message(), "config.json"));
    }
  }
}

TEST_CASE("dtype names round-trip and unknown ones are refused") {
  for (DType d : {DType::kF64, DType::kF32, DType::kF16, DType::kBF16, DType::kF8E4M3, DType::kF8E5M2,
                  DType::kI64, DType::kI32, DType::kI16, DType::kI8, DType::kU8, DType::kBool}) {
    auto back = ParseDType(DTypeName(d));
    REQUIRE(back.ok());
    CHECK(*back == d);
    CHECK(DTypeSize(d) >= 1);
  }
  CHECK(DTypeSize(DType::kBF16) == 2);
  CHECK(DTypeSize(DType::kF8E4M3) == 1);
  CHECK(DTypeSize(DType::kI64) == 8);
  CHECK_FALSE(ParseDType("Q4").ok());
  CHECK(*DTypeFromTorchName("torch.bfloat16") == DType::kBF16);
  CHECK(*DTypeFromTorchName("float8_e4m3fn") == DType::kF8E4M3);
  CHECK_FALSE(DTypeFromTorchName("float4").ok());
}

// ---- malformed checkpoints, each built in its own folder ----

constexpr const char* kTinyConfig = R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
  "dtype": "float32", "vocab_size": 8, "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1,
  "num_attention_heads": 2, "num_key_value_heads": 1, "rms_norm_eps": 1e-5})";

TensorToWrite F32(const std::string& name, std::vector<int64_t> shape, float base = 0) {
  TensorToWrite t;
  t.name = name;
  t.dtype = DType::kF32;
  t.shape = std::move(shape);
  int64_t n = 1;
  for (int64_t d : t.shape) n *= d;
  t.data.resize(static_cast<size_t>(n) * 4);
  for (int64_t i = 0; i < n; ++i) {
    float v = base + static_cast<float>(i);
    std::memcpy(t.data.data() + i * 4, &v, 4);
  }
  return t;
}

// A header written by hand, padded like the reference writer.
std::string Pad(std::string h) {
  h.append((8 - h.size() % 8) % 8, ' ');
  return h;
}

struct Fixture {
  test::TempDir tmp;
  std::string dir = tmp.Join("model");
  Fixture() { REQUIRE(MakeDirs(dir).ok()); }
  std::string Path(const std::string& name) const { return dir + "/" + name; }
  void Config(const std::string& text = kTinyConfig) {
    REQUIRE(WriteFileAtomic(Path("config.json"), text).ok());
  }
  void Single(const std::vector<TensorToWrite>& ts, const SafetensorsWriteOptions& o = {}) {
    REQUIRE(WriteSafetensors(Path("model.safetensors"), ts, o).ok());
  }
  Error OpenFails() const {
    auto ck = Checkpoint::Open(dir);
    REQUIRE_FALSE(ck.ok());
    return ck.error();
  }
  // One file with a header written by hand over the tensors' bytes, which must not open.
  Error HeaderFails(const std::string& header, const std::vector<TensorToWrite>& ts) {
    SafetensorsWriteOptions o;
    o.header_override = Pad(header);
    Single(ts, o);
    return OpenFails();
  }
};

uint64_t FileSize(const std::string& path) {
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  return static_cast<uint64_t>(st.st_size);
}

TEST_CASE("a checkpoint written by the writer opens and reads back") {
  Fixture f;
  f.Config();
  auto a = F32("a", {2, 3}, 1);
  auto b = F32("b", {4}, 100);
  f.Single({a, b});
  auto ck = Checkpoint::Open(f.dir);
  REQUIRE(ck.ok());
  REQUIRE(ck->tensors().size() == 2);
  CHECK(ck->tensors()[0].name == "a");  // storage order
  CHECK(ck->tensors()[0].offset % 8 == 0);
  std::string got(24, '\0');
  REQUIRE(ck->ReadTensor(*ck->Find("a"), got.data()).ok());
  CHECK(got == a.data);
  std::string part(8, '\0');
  const TensorInfo& tb = *ck->Find("b");
  REQUIRE(ck->ReadRange(tb.file, tb.offset + 4, 8, part.data()).ok());
  CHECK(part == b.data.substr(4, 8));
  // A read outside the file is refused, not attempted.
  auto past = ck->ReadRange(0, ck->files()[0].size - 4, 8, part.data());
  REQUIRE_FALSE(past.ok());
  CHECK(Has(past.error().message(), "past the file's"));
  CHECK_FALSE(ck->ReadRange(7, 0, 1, part.data()).ok());
}

TEST_CASE("the writer streams filled tensors and refuses inconsistent ones") {
  Fixture f;
  f.Config();
  TensorToWrite filled;
  filled.name = "filled";
  filled.dtype = DType::kU8;
  filled.shape = {3, 5 << 20};  // 15 MiB: more than one fill call
  int calls = 0;
  filled.fill = [&](uint64_t off, uint8_t* dst, size_t len) {
    ++calls;
    for (size_t i = 0; i < len; ++i) dst[i] = static_cast<uint8_t>((off + i) * 7 / 3);
  };
  f.Single({F32("small", {3}), filled});
  CHECK(calls >= 2);
  auto ck = Checkpoint::Open(f.dir);
  REQUIRE(ck.ok());
  const TensorInfo& t = *ck->Find("filled");
  std::vector<uint8_t> got(t.nbytes);
  REQUIRE(ck->ReadTensor(t, got.data()).ok());
  bool same = true;
  for (size_t i = 0; i < got.size(); ++i) same = same && got[i] == static_cast<uint8_t>(i * 7 / 3);
  CHECK(same);

  auto header = SafetensorsHeaderJson({F32("a", {3})}, {});
  REQUIRE(header.ok());
  CHECK(header->size() % 8 == 0);
  TensorToWrite wrong = F32("wrong", {3});
  wrong.data.pop_back();
  Status s = WriteSafetensors(f.Path("x.safetensors"), {wrong});
  REQUIRE_FALSE(s.ok());
  CHECK(Has(s.error().message(), "tensor 'wrong': 11 bytes given but its shape and dtype need 12"));
  CHECK_FALSE(WriteSafetensors(f.Path("x.safetensors"), {F32("a", {1}), F32("a", {1})}).ok());
  struct stat st {};
  CHECK(::stat(f.Path("x.safetensors").c_str(), &st) != 0);  // nothing half-written left behind
}

TEST_CASE("Open reads headers only: a 16 GiB sparse checkpoint opens at once") {
  Fixture f;
  f.Config();
  const uint64_t big = 16ull << 30;
  SafetensorsWriteOptions o;
  o.header_override = Pad(R"({"huge": {"dtype": "F32", "shape": [4, 1073741824], "data_offsets": [0, )" +
                          std::to_string(big) + "]}}");
  o.truncate_to = 8 + o.header_override->size() + big;  // sparse: no data is written or read
  f.Single({}, o);
  auto ck = Checkpoint::Open(f.dir);
  REQUIRE(ck.ok());
  CHECK(ck->total_bytes() == big);
  CHECK(ck->Find("huge")->numel() == 4ll << 30);
  CHECK(ck->files()[0].header_len == o.header_override->size());
  CHECK(ck->files()[0].header_sha256 == Sha256Hex(*o.header_override));
}

TEST_CASE("malformed checkpoints are refused with the file, the tensor and the fix") {
  Fixture f;
  f.Config();
  const std::string model = f.Path("model.safetensors");
  auto a = F32("layer.a", {4});
  auto b = F32("layer.b", {4}, 10);

  SECTION("truncated file") {
    f.Single({a, b});
    REQUIRE(::truncate(model.c_str(), static_cast<off_t>(FileSize(model) - 6)) == 0);
    Error e = f.OpenFails();
    CHECK(e.code() == Code::kCorrupt);
    CHECK(Has(e.message(), model + ": tensor 'layer.b': data ends at byte"));
    CHECK(Has(e.message(), "past the file's " + std::to_string(FileSize(model)) + " bytes"));
    CHECK(Has(e.message(), "the file is truncated: re-download it"));
  }
  SECTION("file shorter than the length prefix") {
    REQUIRE(WriteFileAtomic(model, "abc").ok());
    Error e = f.OpenFails();
    CHECK(Has(e.message(), model + ": the file is 3 bytes, shorter than the 8-byte header length"));
    CHECK(Has(e.message(), "re-download"));
  }
  SECTION("header length past the end of the file") {
    SafetensorsWriteOptions o;
    o.header_len_override = 1 << 20;
    f.Single({a, b}, o);
    Error e = f.OpenFails();
    CHECK(Has(e.message(), model + ": the header length 1048576 runs past the file's"));
    CHECK(Has(e.message(), "re-download"));
  }
  SECTION("header length beyond the bound, in a file that large") {
    SafetensorsWriteOptions o;
    o.header_len_override = kMaxSafetensorsHeaderBytes + 1;
    o.truncate_to = kMaxSafetensorsHeaderBytes + 64;  // sparse: no disk used
    f.Single({a, b}, o);
    Error e = f.OpenFails();
    CHECK(Has(e.message(), model + ": the header length 104857601 is more than the 104857600 bytes"));
  }
  SECTION("header that is not JSON") {
    Error e = f.HeaderFails(R"({"layer.a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]})", {a});
    CHECK(Has(e.message(), model + ": the header is not valid JSON"));
    CHECK(Has(e.message(), "re-download it"));
  }
  SECTION("header JSON that is not an object") {
    Error e = f.HeaderFails("[1, 2, 3]", {a});
    CHECK(Has(e.message(), model + ": the header is [1,2,3], not a JSON object"));
  }
  SECTION("overlapping ranges") {
    Error e = f.HeaderFails(R"({"layer.a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                                "layer.b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}})", {a, b});
    CHECK(
        Has(e.message(), model + ": tensor 'layer.b' (bytes 8..24) overlaps tensor 'layer.a' (bytes 0..16)"));
  }
  SECTION("range past the end of the file") {
    Error e = f.HeaderFails(R"({"layer.a": {"dtype": "F32", "shape": [4], "data_offsets": [1000, 1016]}})", {a});
    CHECK(Has(e.message(), model + ": tensor 'layer.a': data ends at byte"));
    CHECK(Has(e.message(), "truncated: re-download it"));
  }
  SECTION("unknown dtype") {
    Error e = f.HeaderFails(R"({"layer.a": {"dtype": "Q4_K", "shape": [4], "data_offsets": [0, 16]}})", {a});
    CHECK(Has(e.message(), model + ": tensor 'layer.a': unknown dtype 'Q4_K'"));
    CHECK(Has(e.message(), "F8_E4M3"));  // lists what is known
  }
  SECTION("shape x dtype size differs from the byte range") {
    Error e = f.HeaderFails(R"({"layer.a": {"dtype": "F32", "shape": [5], "data_offsets": [0, 16]}})", {a});
    CHECK(
        Has(e.message(),
            model + ": tensor 'layer.a': shape [5] of F32 needs 20 bytes but data_offsets [0, 16] hold 16"));
  }
  SECTION("absurd shape whose size overflows") {
    Error e = f.HeaderFails(R"({"layer.a": {"dtype": "F32", "shape": [4294967296, 4294967296, 16],
                                             "data_offsets": [0, 16]}})", {a});
    CHECK(Has(e.message(), model + ": tensor 'layer.a': shape"));
    CHECK(Has(e.message(), "more elements than"));
  }
  SECTION("shape whose bytes overflow only after the dtype size") {
    Error e = f.HeaderFails(R"({"layer.a": {"dtype": "F64", "shape": [4611686018427387904],
                                             "data_offsets": [0, 0]}})", {a});
    CHECK(Has(e.message(), "more elements than"));
  }
  SECTION("negative dimension") {
    Error e = f.HeaderFails(R"({"layer.a": {"dtype": "F32", "shape": [-4], "data_offsets": [0, 16]}})", {a});
    CHECK(Has(e.message(), model + ": tensor 'layer.a': dimension 0 is -4, negative"));
  }
  SECTION("fractional dimension and missing offsets") {
    Error e = f.HeaderFails(R"({"layer.a": {"dtype": "F32", "shape": [4.5], "data_offsets": [0, 16]}})", {a});
    CHECK(Has(e.message(), "dimension 0 is 4.5, not an integer"));
    e = f.HeaderFails(R"({"layer.a": {"dtype": "F32", "shape": [4]}})", {a});
    CHECK(Has(e.message(), "tensor 'layer.a': 'data_offsets' is missing"));
  }
  SECTION("the same tensor twice in one header") {
    Error e = f.HeaderFails(R"({"layer.a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                                "layer.a": {"dtype": "F32", "shape": [4], "data_offsets": [16, 32]}})", {a, b});
    CHECK(Has(e.message(), model + ": tensor 'layer.a' appears twice in the header"));
  }
  SECTION("deeply nested header JSON") {
    Error e = f.HeaderFails("{\"x\": " + std::string(100000, '[') + std::string(100000, ']') + "}", {a});
    CHECK(Has(e.message(), model + ": the header is JSON nested deeper than the limit of 64 levels"));
  }
  SECTION("metadata that is not an object of strings") {
    Error e = f.HeaderFails(R"({"__metadata__": {"format": ["pt"]}})", {});
    CHECK(Has(e.message(), model + R"(: __metadata__ is {"format":["pt"]}, not an object of strings)"));
  }
  SECTION("missing config.json") {
    f.Single({a});
    REQUIRE(::unlink(f.Path("config.json").c_str()) == 0);
    Error e = f.OpenFails();
    CHECK(e.code() == Code::kNotFound);
    CHECK(Has(e.message(), f.Path("config.json") + ": missing"));
    CHECK(Has(e.message(), "copy it from the model repository"));
  }
  SECTION("malformed config.json") {
    f.Single({a});
    f.Config(R"({"vocab_size": 8,)");
    Error e = f.OpenFails();
    CHECK(e.code() == Code::kCorrupt);
    CHECK(Has(e.message(), f.Path("config.json") + ": not valid JSON"));
    CHECK(Has(e.message(), "restore it from the model repository"));
  }
  SECTION("no weights at all") {
    Error e = f.OpenFails();
    CHECK(e.code() == Code::kNotFound);
    CHECK(Has(e.message(), "has neither model.safetensors nor model.safetensors.index.json"));
  }
  SECTION("a folder that does not exist") {
    auto ck = Checkpoint::Open(f.Path("nope"));
    REQUIRE_FALSE(ck.ok());
    CHECK(Has(ck.error().message(), f.Path("nope") + ": checkpoint folder not found"));
  }
}

TEST_CASE("malformed sharded checkpoints are refused with the shard and the tensor") {
  Fixture f;
  f.Config();
  const std::string s1 = "model-00001-of-00002.safetensors";
  const std::string s2 = "model-00002-of-00002.safetensors";
  auto a = F32("layer.a", {4});
  auto b = F32("layer.b", {4}, 10);
  auto write_index = [&](const std::map<std::string, std::string>& m) {
    REQUIRE(WriteSafetensorsIndex(f.Path("model.safetensors.index.json"), m, 32).ok());
  };
  REQUIRE(WriteSafetensors(f.Path(s1), {a}).ok());

  SECTION("a good pair of shards opens") {
    REQUIRE(WriteSafetensors(f.Path(s2), {b}).ok());
    write_index({{"layer.a", s1}, {"layer.b", s2}});
    auto ck = Checkpoint::Open(f.dir);
    REQUIRE(ck.ok());
    CHECK(ck->files().size() == 2);
    CHECK(ck->Find("layer.b")->file == 1);
  }
  SECTION("index naming a missing shard") {
    write_index({{"layer.a", s1}, {"layer.b", s2}});
    Error e = f.OpenFails();
    CHECK(e.code() == Code::kNotFound);
    CHECK(Has(e.message(), f.Path(s2) + ": missing, but model.safetensors.index.json names it"));
    CHECK(Has(e.message(), "re-download"));
  }
  SECTION("index naming a tensor absent from its shard") {
    REQUIRE(WriteSafetensors(f.Path(s2), {b}).ok());
    write_index({{"layer.a", s1}, {"layer.b", s2}, {"layer.c", s2}});
    Error e = f.OpenFails();
    CHECK(Has(e.message(),
              f.Path(s2) + ": tensor 'layer.c' is named by model.safetensors.index.json but absent"));
  }
  SECTION("a tensor in two shards") {
    REQUIRE(WriteSafetensors(f.Path(s2), {F32("layer.a", {4}, 7), b}).ok());
    write_index({{"layer.a", s1}, {"layer.b", s2}});
    Error e = f.OpenFails();
    CHECK(Has(e.message(), f.Path(s2) + ": tensor 'layer.a' is also in " + f.Path(s1)));
    CHECK(Has(e.message(), "exactly one shard"));
  }
  SECTION("a tensor the index does not name, or places elsewhere") {
    REQUIRE(WriteSafetensors(f.Path(s2), {b, F32("layer.extra", {2})}).ok());
    write_index({{"layer.a", s1}, {"layer.b", s2}});
    CHECK(Has(f.OpenFails().message(), f.Path(s2) + ": tensor 'layer.extra' is not named in"));
    REQUIRE(WriteSafetensors(f.Path(s2), {b}).ok());
    write_index({{"layer.a", s2}, {"layer.b", s1}});
    CHECK(Has(f.OpenFails().message(),
              f.Path(s1) +
                  ": tensor 'layer.a' is in this file but model.safetensors.index.json says it is in " + s2));
  }
  SECTION("index naming a file outside the folder") {
    write_index({{"layer.a", "../" + s1}});
    Error e = f.OpenFails();
    CHECK(Has(e.message(),
              "tensor 'layer.a' maps to \"../" + s1 + "\", not a file name in the checkpoint folder"));
  }
  SECTION("index that is not JSON or has no weight_map") {
    REQUIRE(WriteFileAtomic(f.Path("model.safetensors.index.json"), "{\"weight_map\": ").ok());
    CHECK(Has(f.OpenFails().message(), "model.safetensors.index.json: not valid JSON"));
    REQUIRE(WriteFileAtomic(f.Path("model.safetensors.index.json"), "{}").ok());
    CHECK(Has(f.OpenFails().message(), "model.safetensors.index.json: has no 'weight_map' object"));
  }
}

TEST_CASE("ParseSafetensorsHeader never trusts the length it is given") {
  std::string h = Pad(R"({"t": {"dtype": "I32", "shape": [2], "data_offsets": [0, 8]}})");
  std::string file(8, '\0');
  for (int i = 0; i < 8; ++i) file[static_cast<size_t>(i)] = static_cast<char>((h.size() >> (8 * i)) & 0xff);
  file += h;
  file += std::string(8, 'x');
  const auto* p = reinterpret_cast<const uint8_t*>(file.data());
  auto ok = ParseSafetensorsHeader(p, file.size(), file.size(), "f");
  REQUIRE(ok.ok());
  CHECK(ok->header_len == h.size());
  REQUIRE(ok->tensors.size() == 1);
  CHECK(ok->tensors[0].offset == 8 + h.size());
  CHECK(ok->tensors[0].dtype == DType::kI32);
  // Given fewer bytes than the header needs: refused, nothing read past them.
  std::vector<uint8_t> short_copy(p, p + 8 + h.size() - 1);
  auto cut = ParseSafetensorsHeader(short_copy.data(), short_copy.size(), file.size(), "f");
  REQUIRE_FALSE(cut.ok());
  CHECK_FALSE(ParseSafetensorsHeader(p, 4, file.size(), "f").ok());
  CHECK_FALSE(ParseSafetensorsHeader(p, file.size(), 7, "f").ok());
  // The data region is what the file size says, not what was passed.
  CHECK(Has(ParseSafetensorsHeader(p, 8 + h.size(), 8 + h.size() + 4, "f").error().message(),
            "data ends at byte"));
}

}  // namespace
}  // namespace wsup
