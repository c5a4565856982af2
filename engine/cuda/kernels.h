// CUDA kernels of the reference engine: the float32 compute of the CPU path
// (engine/kernels.h) on the GPU, over weights that stay where they lie (the
// holder's arena, mapped into this process) in their stored dtype.
//
// Matrix products: small batches (decode) use a fused kernel that reads each
// weight row once in its stored dtype and multiplies it against every token
// of the step. Larger batches (prefill, wide decode): bfloat16 weights go
// through cuBLAS on tensor cores as they lie, against the activations split
// into two bfloat16 terms (LaunchSplitBf16; two products summed in float32,
// within 2^-16 of the float32 product, relative), or one term when the
// engine is told to (--matmul bf16, transformers' own bf16 arithmetic);
// float32 weights go through SGEMM (no TF32); f16 and FP8 weights are
// widened to float32 in a scratch buffer for SGEMM.
//
// KV cache layout (per rank, float32), the same as the CPU's KvStorage:
//   [block][layer][k|v][kv_head][position in block][kv_dim]
// (kv_dim is head_dim for Llama and Qwen3-MoE; DeepSeek-V3 caches each
// head's expanded k and v in slots of max(qk_nope + qk_rope, v_head_dim).)
//
// Mixture of experts: the router's logits are a plain product; the routing
// (softmax or sigmoid, groups, top-k, weights) runs on the device, one
// block per token, exactly as the CPU's RankModel::Experts decides
// (engine/cuda/routing.h, tested on the CPU). Then
// each expert's token list is built on the device, and one launch per
// projection multiplies every expert's rows against the tokens routed to
// it (a block per expert and row slice reads each row once per step), and
// the weighted sum over a token's experts goes back in expert id order.
// Every grid depends on the step's token count only, never on the routing,
// so MoE steps are captured into CUDA graphs like dense ones.
//
// Every launcher enqueues on `stream` and never synchronizes, so a whole
// step can be captured into a CUDA graph. This header is plain C++ (no CUDA
// headers), so host code compiled by the C++ compiler can include it.
#pragma once

#include <cstdint>

namespace wsup::engine::cuda {

enum DevDType : int { kDevF32 = 0, kDevBf16 = 1, kDevF16 = 2, kDevFp8E4M3 = 3 };

// A weight matrix in device memory: rows x cols, row-major, as stored. For
// block FP8, scale points to ceil(rows/block_rows) x scale_cols float32
// block scales (weight = value x scale).
struct DevMatrix {
  int dtype = kDevF32;
  int64_t rows = 0;
  int64_t cols = 0;
  const void* data = nullptr;
  const float* scale = nullptr;
  int64_t block_rows = 1;
  int64_t block_cols = 1;
  int64_t scale_cols = 0;
};

// Where one step's tokens go in the KV cache: token t of the step is at
// positions[t] of sequence seq[t]; that sequence's blocks are
// block_table[seq[t] * max_blocks .. + max_blocks).
struct DevStepMeta {
  const int32_t* tokens = nullptr;
  const int32_t* positions = nullptr;
  const int32_t* seq = nullptr;
  const int32_t* block_table = nullptr;
  const int32_t* logit_rows = nullptr;
  int max_blocks = 0;
};

struct DevKvLayout {
  float* base = nullptr;
  int64_t layers = 0;
  int64_t kv_heads = 0;  // local
  int64_t head_dim = 0;  // the slot width (kv_dim)
  int block_size = 0;
};

// How a mixture-of-experts layer picks its experts (engine/model.h).
struct DevRouting {
  int64_t experts = 0, top_k = 0;
  bool sigmoid = false;  // DeepSeek-V3: sigmoid scores, bias, groups
  int64_t n_group = 1, topk_group = 1;
  bool norm_topk = false;
  float routed_scale = 1.0f;
};

// Tokens per step up to which the fused small-batch product is used.
inline constexpr int kSmallBatch = 8;
// Largest head_dim (q, k and v widths) the attention kernel supports.
inline constexpr int64_t kMaxHeadDim = 256;
// Largest expert count and top-k the routing kernels support, and the
// widest rope part of a DeepSeek-V3 head.
inline constexpr int64_t kMaxExperts = 512;
inline constexpr int64_t kMaxTopK = 16;
inline constexpr int64_t kMaxRope = 512;

using Stream = void*;  // cudaStream_t

// x[t] = embedding row (tokens[t] - vocab_start) when this rank holds it, else 0.
void LaunchEmbed(const DevMatrix& emb, const DevStepMeta& meta, int T, int64_t vocab_start, float* x, Stream s);

// out[r] = rmsnorm(x[rows_index ? rows_index[r] : r]) * w, rows of n values.
// Input rows are in_stride apart (0: n), so the first n values of a wider
// row can be normalised; out rows are n apart. In place works (x == out,
// in_stride 0).
void LaunchRmsNorm(const float* x, const DevMatrix& w, const int32_t* rows_index, int rows, int64_t n, float eps,
                   float* out, Stream s, int64_t in_stride = 0);

// y[t][o] = sum_i x[t][i] * w[o][i], t < T <= kSmallBatch.
void LaunchGemvSmall(const DevMatrix& w, const float* x, int T, float* y, Stream s);

// Fused small-batch products, for the decode step's launches (the same
// arithmetic as the unfused kernels, so the same bits):
// - true when LaunchGemvSmallMany and LaunchGemvSmallSiluGateUp take these
//   n matrices (n <= 3, one dtype and width, FP8 with one block shape);
// - ys[m] = x . ws[m]^T for each m < n, in one launch;
// - y += x . w^T (LaunchGemvSmall then LaunchAdd);
// - y = silu(x . gate^T) * (x . up^T) (two products, then LaunchSiluMul).
bool GemvSmallFuses(const DevMatrix* const* ws, int n);
void LaunchGemvSmallMany(const DevMatrix* const* ws, float* const* ys, int n, const float* x, int T, Stream s);
void LaunchGemvSmallAdd(const DevMatrix& w, const float* x, int T, float* y, Stream s);
void LaunchGemvSmallSiluGateUp(const DevMatrix& gate, const DevMatrix& up, const float* x, int T, float* y, Stream s);

// The n float32 values of x as bfloat16 terms for tensor-core products:
// hi[i] = x[i] rounded, and when lo is given lo[i] = x[i] - hi[i] rounded
// (hi + lo is within 2^-16 of x[i], relative). Buffers of uint16_t bits.
void LaunchSplitBf16(const float* x, int64_t n, uint16_t* hi, uint16_t* lo, Stream s);

// out[r][c] = w[r][c] as float32.
void LaunchDequant(const DevMatrix& w, float* out, Stream s);

// Rotary embedding of q (T x q_heads x head_dim) and k (T x kv_heads x
// head_dim) in place, then k and v written into the cache at each token's
// position.
void LaunchRopeAndStore(float* q, float* k, const float* v, int T, int64_t q_heads, const float* inv_freq,
                        const DevStepMeta& meta, const DevKvLayout& kv, int64_t layer, Stream s);

// DeepSeek-V3 (MLA): q is T x heads x (nope + rope), lat T x lat_stride
// with the shared rope key at column rope_at, kvb T x heads x (nope + v_dim)
// (kv_b_proj's output). Rotates each head's q rope part in place and the
// shared key (interleaved pairs regrouped first when interleave), then
// caches per head k = [k_nope, rotated key] and v.
void LaunchMlaRopeStore(float* q, const float* lat, int64_t lat_stride, int64_t rope_at, const float* kvb, int T,
                        int64_t heads, int64_t nope, int64_t rope, int64_t v_dim, bool interleave,
                        const float* inv_freq, const DevStepMeta& meta, const DevKvLayout& kv, int64_t layer,
                        Stream s);

// Causal attention of each token's query heads over its sequence's cached
// positions 0..positions[t]. Query head j (local) reads local KV head
// (head_start + j) / group - kv_head_start. q and the cached k are q_dim
// wide, v v_dim; out is T x q_heads x v_dim; scores are scaled by scale.
// One block per token and head: the decode path. With `list`, only the T
// tokens list[0..T) of the step.
void LaunchAttention(const float* q, int T, int64_t q_heads, int64_t head_start, int64_t group, int64_t kv_head_start,
                     int64_t q_dim, int64_t v_dim, float scale, const DevStepMeta& meta, const DevKvLayout& kv,
                     int64_t layer, float* out, Stream s, const int32_t* list = nullptr);

// Query tiles for LaunchTiledAttention: up to kAttnTile step tokens of one
// sequence at consecutive positions (a prompt chunk), as (first token,
// count) pairs.
inline constexpr int kAttnTile = 64;

// True when LaunchTiledAttention takes these head widths (v_dim a multiple
// of 4; shared memory within the device's limit), having opted the kernel in
// to that much shared memory on the current device. Call once per rank.
bool TiledAttentionFits(int64_t q_dim, int64_t v_dim);

// The same attention as LaunchAttention for the tokens of `n_tiles` tiles
// (pairs at tiles[2i], tiles[2i + 1]): each block loads a tile's queries
// once and walks the sequence's cached keys and values in tiles of 32
// positions (the FlashAttention method: online softmax, nothing of size
// positions x positions is stored), so a prompt chunk of n tokens reads
// the cache n/64 times instead of n times. Float32 throughout, as the
// golden outputs need.
void LaunchTiledAttention(const float* q, const int32_t* tiles, int n_tiles, int64_t q_heads, int64_t head_start,
                          int64_t group, int64_t kv_head_start, int64_t q_dim, int64_t v_dim, float scale,
                          const DevStepMeta& meta, const DevKvLayout& kv, int64_t layer, float* out, Stream s);

// True when LaunchTcAttention takes these head widths with `terms`
// bfloat16 terms per operand (1 or 2) on the current device: sm_80 or
// later, shared memory within its limit. Opts the kernel in to that much
// shared memory. Call once per rank.
bool TcAttentionFits(int64_t q_dim, int64_t v_dim, int terms);

// How LaunchTcAttention splits each tile's keys over blocks (see
// attention_tc.cu): `splits` ranges of keys_per_split keys (whole key
// tiles). The partial results need TcAttentionScratchFloats of scratch;
// at most kTcMaxPartials (tile, head, range) blocks are planned.
struct TcSplit {
  int splits = 1;
  int64_t keys_per_split = 0;
};
inline constexpr int kTcKeyTile = 64;  // keys a block takes at a time
inline constexpr int64_t kTcMaxPartials = 1024;
inline constexpr int64_t kTcMinSplitKeys = 256;
int64_t TcAttentionScratchFloats(int64_t v_dim);
// For n_tiles tiles of q_heads heads whose longest reads max_keys keys, on
// a device of `sms` multiprocessors: splits enough for two blocks a
// multiprocessor, none when the tiles alone fill it.
TcSplit PlanTcSplit(int n_tiles, int64_t q_heads, int64_t max_keys, int sms);

// LaunchTiledAttention's attention with both products of each key tile on
// tensor cores (engine/cuda/attention_tc.cu). terms 2 splits every operand
// into two bfloat16 terms (within about 2^-16 of float32: the golden
// outputs hold); terms 1 is bfloat16 arithmetic. With split.splits > 1
// (and scratch) the keys are split over blocks and merged after.
void LaunchTcAttention(const float* q, const int32_t* tiles, int n_tiles, int64_t q_heads, int64_t head_start,
                       int64_t group, int64_t kv_head_start, int64_t q_dim, int64_t v_dim, float scale, int terms,
                       const TcSplit& split, float* scratch, const DevStepMeta& meta, const DevKvLayout& kv,
                       int64_t layer, float* out, Stream s);

// Routing of T tokens from the router's logits (T x experts): ids and
// weights get T x top_k, slot k of token t at t * top_k + k. bias is the
// DeepSeek-V3 e_score_correction_bias (one row; data null otherwise).
void LaunchRoute(const float* logits, const DevMatrix& bias, const DevRouting& r, int T, int32_t* ids, float* weights,
                 Stream s);

// From the P = T x top_k routed slots: offsets[e]..offsets[e + 1] index
// order, the slots routed to expert e in ascending slot order.
void LaunchExpertLists(const int32_t* ids, int P, int64_t experts, int32_t* offsets, int32_t* order, Stream s);

// For each expert e and each slot p routed to it:
// y[p][o] = sum_i x[p / x_div][i] * ws[e][o][i]. ws is a device array of
// `experts` matrices of rows x cols, all of dtype `dtype`. x_div is top_k
// when x holds one row per token, 1 when one row per slot.
void LaunchExpertGemv(const DevMatrix* ws, int dtype, int64_t experts, int64_t rows, const int32_t* offsets,
                      const int32_t* order, const float* x, int x_div, float* y, Stream s);

// out[t][c] = sum over token t's slots, in ascending expert id, of
// weights[slot] * y[slot][c]; y is (T x top_k) x n.
void LaunchExpertCombine(const float* y, const int32_t* ids, const float* weights, int T, int64_t top_k, int64_t n,
                         float* out, Stream s);

// gate[i] = silu(gate[i]) * up[i].
void LaunchSiluMul(float* gate, const float* up, int64_t n, Stream s);

// x[i] += y[i].
void LaunchAdd(float* x, const float* y, int64_t n, Stream s);

}  // namespace wsup::engine::cuda
