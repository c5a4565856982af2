// The decoder models the reference engine computes, as one tensor-parallel
// rank computes them, exactly as transformers 5 does:
//  - Llama (LlamaForCausalLM, MistralForCausalLM): RMSNorm, rotary
//    embeddings (HF "default" rope, rotate_half), grouped-query attention
//    over a paged KV cache, SwiGLU MLP, tied or untied lm_head.
//  - Qwen3-MoE (Qwen3MoeForCausalLM): the same attention with a per-head
//    RMSNorm on q and k before rope; sparse layers route each token by
//    softmax over the router's logits to its top-k SwiGLU experts
//    (renormalised when norm_topk_prob), dense layers (mlp_only_layers,
//    decoder_sparse_step) keep a SwiGLU MLP.
//  - DeepSeek-V3 (DeepseekV3ForCausalLM): multi-head latent attention (low-
//    rank q and kv, a rope key shared by the heads, interleaved rope), the
//    first first_k_dense_replace layers dense, the others mixture-of-experts
//    with sigmoid scores, group-limited choice biased by
//    e_score_correction_bias, routed_scaling_factor and shared experts.
// Compute is float32; weights stay where the WeightSource keeps them and
// are converted row by row inside the kernels. Mixture-of-experts models
// run on the CPU at any tp their heads allow, and at tp 1 on one GPU
// (engine/cuda/, which mirrors this file and keeps its KV cache layout).
//
// KV cache: Llama and Qwen3-MoE cache each KV head's rotated k and its v.
// DeepSeek-V3 caches the expanded per-head k (nope part then rotated rope
// part, qk_nope + qk_rope wide) and v (v_head_dim, in a slot as wide as k),
// not the compressed latent: attention then is the same loop for every
// family, at the price of heads x (qk_head_dim + v) floats per position
// instead of kv_lora_rank + qk_rope.
//
// A rank holds (checkpoint/sharding.h): q/k/v/gate/up rows, o/down columns,
// a vocabulary slice of embed_tokens and lm_head; norms whole. It sums
// partial results over ranks with its Communicator after o_proj, down_proj
// and the embedding lookup, and gathers the logits. When tp exceeds the KV
// heads, each rank holds the one KV head its query heads use.
// DeepSeek-V3's q_a_proj, kv_a_proj_with_mqa and their norms are whole on
// every rank; q_b_proj and kv_b_proj hold the rank's heads (rows), o_proj
// their columns. Mixture of experts: the router (and DeepSeek-V3's
// e_score_correction_bias) is whole, so every rank routes every token the
// same way; shared experts and dense layers split like a Llama MLP. Routed
// experts either split each expert's intermediate dimension (ep 1), or,
// under expert parallelism (ep = tp), rank r holds experts
// [r*E/ep, (r+1)*E/ep) whole and computes only the tokens routed to them.
// Either way a rank's experts give a partial sum of the layer's output, and
// the all-reduce after down_proj completes it.
//
// One forward step takes a flat batch of tokens from any number of
// sequences (prompt tokens of new sequences and the next token of running
// ones), so each weight row is read once per step.
//
// Ownership: a RankModel borrows its WeightSource and KvStorage. Threads:
// one rank's thread calls Forward(); it uses the rank's ThreadPool.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/architecture/architecture.h"
#include "checkpoint/checkpoint.h"
#include "common/status.h"
#include "engine/kv_memory.h"
#include "engine/communicator.h"
#include "engine/kernels.h"
#include "engine/thread_pool.h"
#include "engine/weights.h"

namespace wsup::engine {

// The family and its name come from the descriptors (checkpoint/architecture/).
using ::wsup::Family;
using ::wsup::FamilyName;

struct ModelDims {
  Family family = Family::kLlama;
  const Architecture* arch = nullptr;  // the family's descriptor: tensor names and shapes
  int64_t vocab = 0, hidden = 0, inter = 0, layers = 0;
  int64_t heads = 0, kv_heads = 0, head_dim = 0, max_pos = 0;
  float eps = 1e-6f;
  double theta = 10000.0;
  bool tied = false;
  int64_t block_rows = 128, block_cols = 128;  // FP8 scale blocks
  // Attention as the cache sees it: a query head's q and k are q_dim wide,
  // its v v_dim; a cached k or v slot is kv_dim floats. Llama: all head_dim.
  int64_t q_dim = 0, v_dim = 0, kv_dim = 0;
  float attn_scale = 1.0f;
  bool qk_norm = false;  // Qwen3-MoE: RMSNorm per head on q and k
  // DeepSeek-V3 attention (MLA). q_lora_rank 0: a plain q_proj.
  int64_t q_lora_rank = 0, kv_lora_rank = 0, qk_nope = 0, qk_rope = 0;
  bool rope_interleave = false;
  float latent_eps = 1e-6f;  // q_a_layernorm, kv_a_layernorm (transformers' default)
  // Mixture of experts: which layers are sparse, and how tokens are routed.
  std::vector<bool> sparse;  // per layer
  int64_t experts = 0, top_k = 0, moe_inter = 0, shared_inter = 0;
  bool norm_topk = false;
  bool sigmoid_router = false;  // DeepSeek-V3: sigmoid, bias, groups, scaling
  int64_t n_group = 1, topk_group = 1;
  float routed_scale = 1.0f;
  // This rank's slice.
  int tp = 1, rank = 0;
  int ep = 1;  // 1, or tp: routed experts held whole, experts / ep a rank
  int64_t local_heads = 0, head_start = 0;
  int64_t local_kv_heads = 0, kv_head_start = 0;
  int64_t local_inter = 0, local_vocab = 0, vocab_start = 0;
  int64_t local_moe_inter = 0, local_shared_inter = 0;  // a routed expert's and the shared experts' rows here
  int64_t local_experts = 0, expert_start = 0;          // the routed experts this rank computes

  // Checks the config (architecture, sizes) and that tp (and ep) split it
  // the way checkpoint/sharding.h does.
  static Result<ModelDims> From(const ModelConfig& cfg, int tp, int rank, int ep = 1);
};

// One rank's KV cache on the CPU: blocks of block_size positions, each
// holding K and V for every layer and local KV head, at the block ids of a
// KvLayout (engine/kv_memory.h: the scratch, and the node's pool while this
// engine owns it). Allocated (and touched) once at startup; the scheduler
// hands out block ids.
//
// The scratch is anonymous memory advised to use huge pages: a killed
// engine's exit frees it in a few hundred page-table entries instead of a
// quarter million 4 KiB pages per GiB, and that teardown is what delays
// everyone who waits for the process to die (the supervisor, the front).
class KvStorage {
 public:
  static uint64_t BlockBytes(const ModelDims& d, int block_size);
  Status Allocate(const ModelDims& d, const KvLayout& layout);
  KvMemory& memory() { return *mem_; }
  bool allocated() const { return mem_ != nullptr; }
  int block_size() const { return block_size_; }
  // K (kv = 0) or V (kv = 1) of `head` in `layer` at block offset 0; the
  // block's positions follow at kv_dim strides.
  float* At(int block, int64_t layer, int kv, int64_t head) {
    return data_ + ((((static_cast<size_t>(block) * layers_ + layer) * 2 + kv) * heads_ + head) *
                               block_size_) * head_dim_;
  }

 private:
  std::unique_ptr<KvMemory> mem_;
  float* data_ = nullptr;
  int block_size_ = 0;
  size_t layers_ = 0, heads_ = 0, head_dim_ = 0;
};

// What one step computes. Per token: its id, position and sequence (an
// index into block_tables). logit_rows: tokens whose next-token logits
// are wanted (the last token of each sequence that samples this step).
struct StepBatch {
  std::vector<int32_t> tokens;
  std::vector<int32_t> positions;
  std::vector<int32_t> seq;
  std::vector<const std::vector<int32_t>*> block_tables;
  std::vector<int32_t> logit_rows;
};

// A rank's weights, found and checked (names, local shapes, dtypes, FP8
// block scales), as the kernels read them (engine/model_bind.cc). Names and
// shapes are the family descriptor's (ModelDims::arch). A layer's MLP inputs are either
// the checkpoint's gate_proj and up_proj or the engine layout's fused
// gate_up_proj (engine/layout_publish.h), read as two views of its halves. The CPU model and the CUDA rank
// bind through this one function, so both refuse the same checkpoints with
// the same words.
struct ExpertWeights {
  MatrixRef gate, up, down;
};
struct LayerWeights {
  MatrixRef in_norm, post_norm;
  MatrixRef q, k, v, o, gate, up, down;
  MatrixRef q_norm, k_norm;                         // Qwen3-MoE
  MatrixRef q_a, q_a_norm, q_b, kv_a, kv_a_norm, kv_b;  // DeepSeek-V3 (q: q_proj without q_lora_rank)
  bool moe = false;
  MatrixRef router, router_bias;      // [experts, hidden]; bias [experts] (DeepSeek-V3)
  std::vector<ExpertWeights> experts;  // this rank's: experts expert_start.. of ModelDims
  ExpertWeights shared;               // DeepSeek-V3 shared experts (shared_inter rows)
};
struct ModelWeights {
  MatrixRef embed, lm_head, final_norm;
  std::vector<LayerWeights> layers;
};
// bound, when given, gets the name of every tensor bound, in order (a test
// checks it against the descriptor).
Result<ModelWeights> BindWeights(const ModelDims& dims, const WeightSource& weights,
                                 std::vector<std::string>* bound = nullptr);

class RankModel {
 public:
  // Finds and checks every tensor this rank needs (names, local shapes,
  // dtypes, FP8 scales), naming the tensor and the fix on a mismatch.
  static Result<std::unique_ptr<RankModel>> Bind(const ModelDims& dims, const WeightSource& weights, int threads);

  const ModelDims& dims() const { return dims_; }

  // Runs the step on this rank. logits gets logit_rows.size() x vocab
  // floats (all of the vocabulary, gathered from every rank).
  Status Forward(const StepBatch& batch, KvStorage& kv, Communicator& comm, std::vector<float>* logits);

 private:
  using Layer = LayerWeights;
  explicit RankModel(const ModelDims& d, int threads) : dims_(d), pool_(threads) {}
  void Attention(const StepBatch& batch, KvStorage& kv, int64_t layer, const float* q, float* out);
  // q_ gets the rotated queries; the new keys and values go to the cache.
  void GqaProjections(const StepBatch& batch, KvStorage& kv, int64_t layer, const Layer& L);
  void MlaProjections(const StepBatch& batch, KvStorage& kv, int64_t layer, const Layer& L);
  // proj_ = the layer's MLP (dense or experts) of h_.
  void DenseMlp(const ExpertWeights& w, int64_t inter, const float* in, int64_t rows, float* out);
  void Experts(const Layer& L, int64_t T);

  ModelDims dims_;
  ThreadPool pool_;
  MatrixRef embed_, lm_head_, final_norm_;
  std::vector<Layer> layers_;
  std::vector<float> inv_freq_;
  // Scratch reused across steps (grown, never shrunk).
  std::vector<float> x_, h_, q_, k_, v_, attn_, proj_, gate_, up_, norm_w_, head_in_, local_logits_, gathered_;
  std::vector<float> lat_, lat_norm_, qk_norm_w_, router_logits_, expert_in_, expert_out_;
};

}  // namespace wsup::engine
