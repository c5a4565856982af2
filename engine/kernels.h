// CPU kernels of the reference engine: float32 compute over weights stored
// as F32, BF16, F16 or block FP8 (E4M3 with one float32 scale per block).
//
// Weights are read where they lie (the holder's mapping, or the disk
// loader's buffer): a kernel converts one weight row at a time into a small
// per-thread float buffer and uses it against every row of the batch, so
// each weight row is read once per step whatever the batch size.
//
// Thread-safety: pure functions over caller-owned buffers; MatMulT uses the
// given pool.
#pragma once

#include <cstdint>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "engine/thread_pool.h"

namespace wsup::engine {

// Scalar conversions (exact: every BF16, F16 and E4M3 value is a float).
float Bf16ToFloat(uint16_t v);
float F16ToFloat(uint16_t v);
// E4M3 ("fn": no infinities, 0x7f/0xff are NaN) through a 256-entry table.
float Fp8E4M3ToFloat(uint8_t v);
const float* Fp8E4M3Table();

// A row-major matrix of weights, rows x cols, as stored. For block FP8,
// block_scale points to ceil(rows/block_rows) x ceil(cols/block_cols)
// float32 scales; the weight is fp8 value x its block's scale.
struct MatrixRef {
  DType dtype = DType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  const void* data = nullptr;
  const float* block_scale = nullptr;
  int64_t block_rows = 0;
  int64_t block_cols = 0;
};

// True for the dtypes the kernels read: F32, BF16, F16, F8_E4M3 (with scales).
bool KernelSupports(DType dtype);

// Writes row r of m, as float32, to dst[0..cols).
void LoadRow(const MatrixRef& m, int64_t r, float* dst);

// y[b * m.rows + o] = sum_i x[b * m.cols + i] * m[o][i] for every b < batch
// and o < m.rows: x times m transposed, the shape of every projection.
void MatMulT(const MatrixRef& m, const float* x, int64_t batch, float* y, ThreadPool& pool);

float Dot(const float* a, const float* b, int64_t n);

// out = x / sqrt(mean(x^2) + eps) * weight, for one row of n values.
// `weight` is float32 (a converted norm row).
void RmsNorm(const float* x, const float* weight, int64_t n, float eps, float* out);

// Rotary embedding of one head in place, Hugging Face "default" rope with
// the rotate_half convention: pairs (j, j + d/2). inv_freq has d/2 entries.
void ApplyRope(float* head, int64_t head_dim, int64_t pos, const float* inv_freq);

// inv_freq[i] = 1 / theta^(2i/d), computed in float32 as transformers does.
std::vector<float> RopeInvFreq(int64_t head_dim, double theta);

// x * sigmoid(x).
float Silu(float x);

}  // namespace wsup::engine
