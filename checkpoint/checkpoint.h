// Checkpoint: a validated, read-only view of a Hugging Face safetensors
// checkpoint folder (config.json plus one model.safetensors, or shards named
// by model.safetensors.index.json).
//
// Open() validates everything before anything is trusted: header length
// within the file, JSON well formed, known dtypes, shape x dtype size equal
// to the byte range, ranges inside the file and not overlapping, every
// tensor named in the index present, no duplicates across shards. A bad
// checkpoint yields an Error naming the file, the tensor and the fix.
//
// Open() reads config.json, the index, and per shard file one pread of the
// 8-byte length and one of the header; never tensor data. Tensor bytes are
// read on demand with ReadTensor() / ReadRange() (pread, so a Checkpoint may
// be read from many threads at once after Open() returns). Copies share the
// open files, which close with the last copy.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/status.h"

namespace wsup {

enum class DType { kF64, kF32, kF16, kBF16, kF8E4M3, kF8E5M2, kI64, kI32, kI16, kI8, kU8, kBool };

// "F32" <-> DType, as written in safetensors headers.
Result<DType> ParseDType(std::string_view name);
const char* DTypeName(DType dtype);
size_t DTypeSize(DType dtype);
// "float32", "bfloat16", "float8_e4m3fn" (torch names, as in config.json's
// dtype and in the test data's tensors.json) -> DType.
Result<DType> DTypeFromTorchName(std::string_view name);

// Bounds applied before anything in a file is trusted. Real headers are a
// few MiB at most (a 100,000-tensor checkpoint); the bound keeps a corrupt
// length from making Open() allocate gigabytes.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100ull << 20;
inline constexpr size_t kMaxConfigBytes = 16u << 20;  // config.json, index.json

struct TensorInfo {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  int file;         // index into Checkpoint::files()
  uint64_t offset;  // absolute byte offset of the data in that file
  uint64_t nbytes;
  int64_t numel() const;
};

struct ShardFile {
  std::string path;           // absolute or as given
  std::string name;           // file name inside the folder
  uint64_t size = 0;          // bytes
  uint64_t header_len = 0;    // the 8-byte prefix's value
  std::string header_sha256;  // hex sha256 of the header JSON bytes
};

struct QuantConfig {
  std::string method = "none";  // quant_method, or "none"
  std::string fmt;              // e.g. "e4m3"
  std::string activation_scheme;
  std::vector<int64_t> weight_block_size;  // empty unless block-wise
  std::string json;                        // the quantization_config object, compact
  std::string json_sha256;                 // of json, or empty when absent
};

struct ModelConfig {
  std::string architecture;  // architectures[0], e.g. "LlamaForCausalLM"
  std::string model_type;    // e.g. "llama"
  std::string torch_dtype;   // "dtype" or "torch_dtype"
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;  // hidden_size / num_attention_heads when absent
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;  // rope_theta, or rope_parameters.rope_theta
  bool tie_word_embeddings = false;
  QuantConfig quant;
  // rope_parameters.rope_type (or rope_scaling's) when it is not the
  // default rope, e.g. "yarn", and the key that said so; empty otherwise.
  std::string rope_type;
  std::string rope_type_key;

  // Mixture of experts; num_experts 0 for a dense model. The key names vary
  // by family: num_experts or num_local_experts (Qwen-MoE, Mixtral),
  // n_routed_experts (DeepSeek); experts_key is the one config.json used
  // (empty when none).
  int64_t num_experts = 0;
  std::string experts_key;
  int64_t num_experts_per_tok = 0;        // the router's top k; 0 when absent
  std::optional<bool> norm_topk_prob;     // absent: the family's default
  int64_t n_group = 1, topk_group = 1;    // DeepSeek: expert groups, and how many are kept
  double routed_scaling_factor = 1.0;     // DeepSeek: the routed experts' weight
  int64_t moe_intermediate_size = 0;
  int64_t n_shared_experts = 0;          // DeepSeek: mlp.shared_experts
  int64_t first_k_dense_replace = 0;     // DeepSeek: layers below it are dense
  int64_t moe_layer_freq = 1;            // DeepSeek: every moe_layer_freq-th layer after those is sparse
  int64_t decoder_sparse_step = 1;       // Qwen-MoE: layer l is sparse when (l + 1) % step == 0
  std::vector<int64_t> mlp_only_layers;  // Qwen-MoE: layers kept dense
  // Multi-head latent attention (DeepSeek-V2/V3); all 0 when absent.
  int64_t q_lora_rank = 0;  // 0: q_proj directly, no q_a/q_b
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  std::optional<bool> rope_interleave;  // DeepSeek: absent means interleaved

  // Whether layer l (< num_hidden_layers) has routed experts, by the rules
  // of the config's family.
  bool IsMoeLayer(int64_t layer) const;
};

// Parses config.json text; `path` is used in messages only.
Result<ModelConfig> ParseModelConfig(std::string_view json_text, const std::string& path);

// One parsed safetensors header, validated against the file's size.
struct SafetensorsHeader {
  uint64_t header_len = 0;
  std::vector<TensorInfo> tensors;  // file index left 0; offsets absolute
  std::string metadata_json;        // "__metadata__", compact, or empty
};

// Parses and validates the first bytes of a safetensors file. `data` holds
// at least the first min(len, file_size) bytes of the file; `file_size` is the
// full file size. Never reads past data+len. The fuzz target calls this.
Result<SafetensorsHeader> ParseSafetensorsHeader(const uint8_t* data, size_t len, uint64_t file_size,
                                                 const std::string& file_name);

class Checkpoint {
 public:
  // Opens and validates the checkpoint in `dir`.
  static Result<Checkpoint> Open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  const ModelConfig& config() const { return config_; }
  const std::vector<ShardFile>& files() const { return files_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* Find(std::string_view name) const;
  uint64_t total_bytes() const;

  // Reads all of t's bytes into dst (t.nbytes bytes).
  Status ReadTensor(const TensorInfo& t, void* dst) const;
  // Reads `len` bytes at absolute `offset` of file `file` into dst.
  Status ReadRange(int file, uint64_t offset, uint64_t len, void* dst) const;

 private:
  std::string dir_;
  ModelConfig config_;
  std::vector<ShardFile> files_;
  std::vector<TensorInfo> tensors_;
  std::unordered_map<std::string, size_t> by_name_;
  std::vector<std::shared_ptr<int>> fds_;  // one open fd per file, closed with the last copy
};

}  // namespace wsup
