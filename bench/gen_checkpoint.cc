// wsup-gen-checkpoint: writes a synthetic Hugging Face checkpoint of a given
// shape (shard files, tensor count, total bytes) for load and attach
// benchmarks at production scale, without a real model.
//
// The tensors are bf16 matrices named like a mixture-of-experts Llama
// (model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight), filled with
// pseudo-random bytes (a fast xorshift, so compression or zero pages cannot
// flatter a measurement). Files are written with the project's own
// safetensors writer, plus config.json and model.safetensors.index.json.
//
//   wsup-gen-checkpoint --out DIR --shards 161 --tensors 20000 --total-bytes 40G
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>

#include "checkpoint/safetensors_writer.h"
#include "common/fs.h"

namespace {

uint64_t ParseBytes(const std::string& s) {
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  std::string unit = end ? end : "";
  uint64_t mul = 1;
  if (unit == "K" || unit == "KiB") mul = 1ull << 10;
  if (unit == "M" || unit == "MiB") mul = 1ull << 20;
  if (unit == "G" || unit == "GiB") mul = 1ull << 30;
  if (unit == "T" || unit == "TiB") mul = 1ull << 40;
  return static_cast<uint64_t>(v * static_cast<double>(mul));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"wsup-gen-checkpoint: a synthetic safetensors checkpoint for benchmarks"};
  std::string out, total_str = "4G";
  int shards = 161, tensors = 20000;
  uint64_t seed = 7;
  app.add_option("--out", out, "folder to write (created)")->required();
  app.add_option("--shards", shards, "number of shard files")->check(CLI::Range(1, 100000));
  app.add_option("--tensors", tensors, "number of tensors")->check(CLI::Range(1, 10000000));
  app.add_option("--total-bytes", total_str, "bytes of tensor data in all, e.g. 40G");
  app.add_option("--seed", seed, "seed of the pseudo-random bytes");
  CLI11_PARSE(app, argc, argv);
  uint64_t total = ParseBytes(total_str);
  if (total < static_cast<uint64_t>(tensors) * 2 * 64) {
    std::fprintf(stderr, "--total-bytes %s is too small for %d tensors; give at least %d KiB\n", total_str.c_str(),
                 tensors, tensors / 8 + 1);
    return 2;
  }
  if (tensors < shards) {
    std::fprintf(stderr, "--tensors must be at least --shards (every file holds one tensor or more)\n");
    return 2;
  }
  if (auto st = wsup::MakeDirs(out); !st.ok()) {
    std::fprintf(stderr, "%s\n", st.error().message().c_str());
    return 1;
  }
  // Equal bf16 matrices of 1024 columns; the remainder of the byte budget is
  // dropped (at most one row per tensor).
  const int64_t cols = 1024;
  int64_t rows = static_cast<int64_t>(total / static_cast<uint64_t>(tensors) / 2 / cols);
  if (rows < 1) rows = 1;
  const int experts = 64;
  auto start = std::chrono::steady_clock::now();
  std::map<std::string, std::string> weight_map;
  uint64_t written = 0;
  int t = 0;
  for (int s = 0; s < shards; ++s) {
    int in_this = tensors / shards + (s < tensors % shards ? 1 : 0);
    std::vector<wsup::TensorToWrite> batch;
    char fname[64];
    std::snprintf(fname, sizeof fname, "model-%05d-of-%05d.safetensors", s + 1, shards);
    for (int i = 0; i < in_this; ++i, ++t) {
      int layer = t / (experts * 3), expert = (t / 3) % experts;
      static const char* kProj[] = {"gate_proj", "up_proj", "down_proj"};
      wsup::TensorToWrite w;
      w.name = "model.layers." + std::to_string(layer) + ".mlp.experts." + std::to_string(expert) + "." +
               kProj[t % 3] + ".weight";
      w.dtype = wsup::DType::kBF16;
      w.shape = {rows, cols};
      uint64_t state = seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(t) + 1;
      w.fill = [state](uint64_t, uint8_t* dst, size_t len) mutable {
        size_t i = 0;
        for (; i + 8 <= len; i += 8) {
          state ^= state << 13;
          state ^= state >> 7;
          state ^= state << 17;
          std::memcpy(dst + i, &state, 8);
        }
        for (; i < len; ++i) dst[i] = static_cast<uint8_t>(state >> (8 * (i % 8)));
      };
      weight_map[w.name] = fname;
      written += static_cast<uint64_t>(rows * cols * 2);
      batch.push_back(std::move(w));
    }
    if (auto st = wsup::WriteSafetensors(out + "/" + fname, batch); !st.ok()) {
      std::fprintf(stderr, "%s\n", st.error().message().c_str());
      return 1;
    }
  }
  if (auto st = wsup::WriteSafetensorsIndex(out + "/model.safetensors.index.json", weight_map, written); !st.ok()) {
    std::fprintf(stderr, "%s\n", st.error().message().c_str());
    return 1;
  }
  nlohmann::json cfg = {{"architectures", {"LlamaForCausalLM"}},
                        {"model_type", "llama"},
                        {"hidden_size", cols},
                        {"intermediate_size", rows},
                        {"num_hidden_layers", t / (experts * 3) + 1},
                        {"num_attention_heads", 8},
                        {"num_key_value_heads", 8},
                        {"vocab_size", 32000},
                        {"max_position_embeddings", 4096},
                        {"rms_norm_eps", 1e-5},
                        {"rope_theta", 10000.0},
                        {"torch_dtype", "bfloat16"}};
  if (auto st = wsup::WriteFileAtomic(out + "/config.json", cfg.dump(2) + "\n"); !st.ok()) {
    std::fprintf(stderr, "%s\n", st.error().message().c_str());
    return 1;
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("gen: %d shards, %d tensors, %.2f GiB in %.1f s (%.2f GB/s)\n", shards, t,
              static_cast<double>(written) / (1ull << 30), secs, static_cast<double>(written) / secs / 1e9);
  return 0;
}
