// CUDA kernels of the reference engine: the float32 compute of the CPU path
// (engine/kernels.h) on the GPU, over weights that stay where they lie (the
// holder's arena, mapped into this process) in their stored dtype.
//
// Matrix products: small batches (decode) use a fused kernel that reads each
// weight row once in its stored dtype and multiplies it against every token
// of the step; larger batches (prefill, wide decode) convert the matrix to
// float32 in a scratch buffer and call cuBLAS SGEMM (no TF32), so every
// product is a float32 product, as the golden outputs need.
//
// KV cache layout (per rank, float32), the same as the CPU's KvStorage:
//   [block][layer][k|v][kv_head][position in block][head_dim]
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
  int64_t head_dim = 0;
  int block_size = 0;
};

// Tokens per step up to which the fused small-batch product is used.
inline constexpr int kSmallBatch = 8;
// Largest head_dim the attention kernel supports.
inline constexpr int64_t kMaxHeadDim = 256;

using Stream = void*;  // cudaStream_t

// x[t] = embedding row (tokens[t] - vocab_start) when this rank holds it, else 0.
void LaunchEmbed(const DevMatrix& emb, const DevStepMeta& meta, int T, int64_t vocab_start, float* x, Stream s);

// out[r] = rmsnorm(x[rows_index ? rows_index[r] : r]) * w, rows of n values.
void LaunchRmsNorm(const float* x, const DevMatrix& w, const int32_t* rows_index, int rows, int64_t n, float eps,
                   float* out, Stream s);

// y[t][o] = sum_i x[t][i] * w[o][i], t < T <= kSmallBatch.
void LaunchGemvSmall(const DevMatrix& w, const float* x, int T, float* y, Stream s);

// out[r][c] = w[r][c] as float32.
void LaunchDequant(const DevMatrix& w, float* out, Stream s);

// Rotary embedding of q (T x q_heads x head_dim) and k (T x kv_heads x
// head_dim) in place, then k and v written into the cache at each token's
// position.
void LaunchRopeAndStore(float* q, float* k, const float* v, int T, int64_t q_heads, const float* inv_freq,
                        const DevStepMeta& meta, const DevKvLayout& kv, int64_t layer, Stream s);

// Causal attention of each token's query heads over its sequence's cached
// positions 0..positions[t]. Query head j (local) reads local KV head
// (head_start + j) / group - kv_head_start.
void LaunchAttention(const float* q, int T, int64_t q_heads, int64_t head_start, int64_t group, int64_t kv_head_start,
                     const DevStepMeta& meta, const DevKvLayout& kv, int64_t layer, float* out, Stream s);

// gate[i] = silu(gate[i]) * up[i].
void LaunchSiluMul(float* gate, const float* up, int64_t n, Stream s);

// x[i] += y[i].
void LaunchAdd(float* x, const float* y, int64_t n, Stream s);

}  // namespace wsup::engine::cuda
