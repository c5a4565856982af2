// wsup-gen-llama: writes a Llama checkpoint of a chosen size with
// pseudo-random weights (uniform, small, so activations stay finite; norms
// 1.0), for engine benchmarks at realistic scale. It computes garbage, but
// at the real cost: every weight is read by every step.
//
// No eos_token_id is written, so generations always run to max_tokens.
//
//   wsup-gen-llama --out DIR                      # about 1.1B parameters, bf16
//   wsup-gen-llama --out DIR --hidden 256 --layers 2 --inter 512 --heads 4 --kv-heads 2 --vocab 512
#include <CLI/CLI.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>

#include "checkpoint/safetensors_writer.h"
#include "common/fs.h"

namespace {

// Fills bf16 (or f32) values uniform in [-amp, amp] from a per-tensor stream.
std::function<void(uint64_t, uint8_t*, size_t)> RandomFill(uint64_t seed, float amp, bool bf16) {
  uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
  return [state, amp, bf16](uint64_t, uint8_t* dst, size_t len) mutable {
    const size_t width = bf16 ? 2 : 4;
    for (size_t i = 0; i + width <= len; i += width) {
      state ^= state << 13;
      state ^= state >> 7;
      state ^= state << 17;
      const float u = static_cast<float>(state >> 40) / static_cast<float>(1ull << 24);  // [0, 1)
      const float v = (2.0f * u - 1.0f) * amp;
      uint32_t bits;
      std::memcpy(&bits, &v, 4);
      if (bf16) {
        const uint16_t h = static_cast<uint16_t>(bits >> 16);
        std::memcpy(dst + i, &h, 2);
      } else {
        std::memcpy(dst + i, &bits, 4);
      }
    }
  };
}

std::function<void(uint64_t, uint8_t*, size_t)> OnesFill(bool bf16) {
  return [bf16](uint64_t off, uint8_t* dst, size_t len) {
    const uint32_t one = 0x3f800000u;
    for (size_t i = 0; i < len; ++i) {
      const uint64_t k = off + i;
      dst[i] = bf16 ? static_cast<uint8_t>((one >> 16) >> (8 * (k % 2))) : static_cast<uint8_t>(one >> (8 * (k % 4)));
    }
  };
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"wsup-gen-llama: a Llama checkpoint with pseudo-random weights, for engine benchmarks"};
  std::string out, dtype = "bf16";
  int64_t hidden = 2048, layers = 16, heads = 32, kv_heads = 8, inter = 8192, vocab = 32000, max_pos = 4096;
  int shards = 4;
  uint64_t seed = 11;
  app.add_option("--out", out, "folder to write (created)")->required();
  app.add_option("--hidden", hidden, "hidden_size")->check(CLI::Range(int64_t{8}, int64_t{65536}));
  app.add_option("--layers", layers, "num_hidden_layers")->check(CLI::Range(int64_t{1}, int64_t{1024}));
  app.add_option("--heads", heads, "num_attention_heads")->check(CLI::Range(int64_t{1}, int64_t{1024}));
  app.add_option("--kv-heads", kv_heads, "num_key_value_heads")->check(CLI::Range(int64_t{1}, int64_t{1024}));
  app.add_option("--inter", inter, "intermediate_size")->check(CLI::Range(int64_t{8}, int64_t{1 << 20}));
  app.add_option("--vocab", vocab, "vocab_size (at least 256: the byte tokenizer)")->check(CLI::Range(int64_t{256}, int64_t{1 << 22}));
  app.add_option("--max-pos", max_pos, "max_position_embeddings")->check(CLI::Range(int64_t{16}, int64_t{1 << 20}));
  app.add_option("--dtype", dtype, "bf16 or f32")->check(CLI::IsMember({"bf16", "f32"}));
  app.add_option("--shards", shards, "shard files")->check(CLI::Range(1, 1000));
  app.add_option("--seed", seed, "seed of the weights");
  CLI11_PARSE(app, argc, argv);
  if (hidden % heads != 0 || heads % kv_heads != 0) {
    std::fprintf(stderr, "--hidden must be a multiple of --heads, and --heads of --kv-heads\n");
    return 2;
  }
  const int64_t hd = hidden / heads;
  const bool bf16 = dtype == "bf16";
  const wsup::DType dt = bf16 ? wsup::DType::kBF16 : wsup::DType::kF32;
  // Uniform amplitude a gives std a/sqrt(3); 1/sqrt(fan_in) keeps each
  // product's output near unit scale.
  auto amp = [](int64_t fan_in) { return static_cast<float>(std::sqrt(3.0 / static_cast<double>(fan_in))); };

  std::vector<wsup::TensorToWrite> all;
  uint64_t n = 0;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, bool norm, int64_t fan_in) {
    wsup::TensorToWrite t;
    t.name = name;
    t.dtype = dt;
    t.shape = shape;
    t.fill = norm ? OnesFill(bf16) : RandomFill(seed + n++, amp(fan_in), bf16);
    all.push_back(std::move(t));
  };
  add("model.embed_tokens.weight", {vocab, hidden}, false, 3);
  for (int64_t l = 0; l < layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {hidden}, true, 0);
    add(p + "self_attn.q_proj.weight", {heads * hd, hidden}, false, hidden);
    add(p + "self_attn.k_proj.weight", {kv_heads * hd, hidden}, false, hidden);
    add(p + "self_attn.v_proj.weight", {kv_heads * hd, hidden}, false, hidden);
    add(p + "self_attn.o_proj.weight", {hidden, heads * hd}, false, heads * hd * layers);
    add(p + "post_attention_layernorm.weight", {hidden}, true, 0);
    add(p + "mlp.gate_proj.weight", {inter, hidden}, false, hidden);
    add(p + "mlp.up_proj.weight", {inter, hidden}, false, hidden);
    add(p + "mlp.down_proj.weight", {hidden, inter}, false, inter * layers);
  }
  add("model.norm.weight", {hidden}, true, 0);
  add("lm_head.weight", {vocab, hidden}, false, hidden);

  if (auto st = wsup::MakeDirs(out); !st.ok()) {
    std::fprintf(stderr, "%s\n", st.error().message().c_str());
    return 1;
  }
  auto start = std::chrono::steady_clock::now();
  uint64_t total = 0, params = 0;
  for (const auto& t : all) {
    uint64_t e = 1;
    for (int64_t d : t.shape) e *= static_cast<uint64_t>(d);
    params += e;
    total += e * (bf16 ? 2 : 4);
  }
  // Consecutive tensors into files of about total / shards bytes each.
  std::map<std::string, std::string> weight_map;
  std::vector<std::vector<wsup::TensorToWrite>> files(1);
  uint64_t in_file = 0;
  for (auto& t : all) {
    uint64_t e = 1;
    for (int64_t d : t.shape) e *= static_cast<uint64_t>(d);
    if (in_file >= total / static_cast<uint64_t>(shards) && static_cast<int>(files.size()) < shards) {
      files.emplace_back();
      in_file = 0;
    }
    in_file += e * (bf16 ? 2 : 4);
    files.back().push_back(std::move(t));
  }
  const int nfiles = static_cast<int>(files.size());
  for (int f = 0; f < nfiles; ++f) {
    char fname[64];
    std::snprintf(fname, sizeof fname, "model-%05d-of-%05d.safetensors", f + 1, nfiles);
    for (const auto& t : files[static_cast<size_t>(f)]) weight_map[t.name] = fname;
    if (auto st = wsup::WriteSafetensors(out + "/" + fname, files[static_cast<size_t>(f)]); !st.ok()) {
      std::fprintf(stderr, "%s\n", st.error().message().c_str());
      return 1;
    }
  }
  if (auto st = wsup::WriteSafetensorsIndex(out + "/model.safetensors.index.json", weight_map, total); !st.ok()) {
    std::fprintf(stderr, "%s\n", st.error().message().c_str());
    return 1;
  }
  nlohmann::json cfg = {{"architectures", {"LlamaForCausalLM"}},
                        {"model_type", "llama"},
                        {"hidden_size", hidden},
                        {"intermediate_size", inter},
                        {"num_hidden_layers", layers},
                        {"num_attention_heads", heads},
                        {"num_key_value_heads", kv_heads},
                        {"head_dim", hd},
                        {"vocab_size", vocab},
                        {"max_position_embeddings", max_pos},
                        {"rms_norm_eps", 1e-5},
                        {"rope_theta", 500000.0},
                        {"tie_word_embeddings", false},
                        {"torch_dtype", bf16 ? "bfloat16" : "float32"}};
  if (auto st = wsup::WriteFileAtomic(out + "/config.json", cfg.dump(2) + "\n"); !st.ok()) {
    std::fprintf(stderr, "%s\n", st.error().message().c_str());
    return 1;
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("gen-llama: %.3f B parameters, %s, %d files, %.2f GiB in %.1f s\n", static_cast<double>(params) / 1e9,
              dtype.c_str(), nfiles, static_cast<double>(total) / (1ull << 30), secs);
  return 0;
}
