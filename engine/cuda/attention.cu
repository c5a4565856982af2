// Tiled causal attention over the paged KV cache (engine/cuda/kernels.h,
// LaunchTiledAttention): the prefill path.
//
// A block takes one query tile (up to kAttnTile tokens of one sequence at
// consecutive positions) and one query head. It keeps the tile's queries in
// shared memory and walks the sequence's keys and values kKeyTile
// positions at a time, through the block table, so each cached row is read
// once per tile instead of once per token. Scores are kept per tile only:
// an online softmax (running maximum and sum per query row) rescales the
// output accumulators when a tile raises a row's maximum.
//
// 256 threads: thread (ty, tx) = (tid / 16, tid % 16) owns query rows
// 4 ty .. 4 ty + 3. For the scores it takes key columns 2 tx, 2 tx + 1;
// for the output, value columns 4 tx + 64 k .. + 3 (k < VK). A row's 16
// threads are one half-warp, so the row reductions are shuffles.
//
// Shared memory (floats): queries and keys transposed (d-major), so a
// thread's rows and columns are one vector load each per d; the softmax
// weights transposed likewise; values as cached (row-major).
#include <cuda_runtime.h>

#include <cstdint>

#include "engine/cuda/kernels.h"
#include "engine/cuda/kv_access.cuh"

namespace wsup::engine::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kKeyTile = 32;
constexpr int kQStride = kAttnTile + 4;  // Qt[d][row]; +4 keeps float4 rows aligned and spreads the banks
constexpr int kKStride = kKeyTile + 4;   // Kt[d][key]
constexpr int kPStride = kAttnTile + 4;  // Pt[key][row]

static_assert(kAttnTile == 64 && kKeyTile == 32 && kThreads == 256, "the thread mapping assumes these");

size_t SharedBytes(int64_t qd, int64_t vd) {
  return sizeof(float) * static_cast<size_t>(qd * kQStride + qd * kKStride + kKeyTile * vd + kKeyTile * kPStride);
}

// VK: value columns per thread in groups of 4, 64 columns apart (vd <= 64 VK).
template <int VK>
__global__ void __launch_bounds__(kThreads)
    TiledAttentionKernel(const float* q, const int32_t* tiles, int64_t q_heads, int64_t head_start, int64_t group,
                         int64_t kv_head_start, int64_t qd, int64_t vd, float scale, DevStepMeta meta, DevKvLayout kv,
                         int64_t layer, float* out) {
  extern __shared__ float4 shared4[];
  float* Qt = reinterpret_cast<float*>(shared4);
  float* Kt = Qt + qd * kQStride;
  float* Vs = Kt + qd * kKStride;
  float* Pt = Vs + kKeyTile * vd;

  const TileHead th = ReadTileHead(tiles, head_start, group, kv_head_start, meta);
  const int t0 = th.t0, n = th.n;
  const int64_t j = th.j, kvh = th.kvh, p0 = th.p0, last = th.last;
  const int32_t* table = th.table;
  const int tid = static_cast<int>(threadIdx.x), ty = tid / 16, tx = tid % 16;

  for (int64_t i = tid; i < kAttnTile * qd; i += kThreads) {
    const int r = static_cast<int>(i / qd);
    const int64_t d = i % qd;
    Qt[d * kQStride + r] = r < n ? q[((static_cast<int64_t>(t0) + r) * q_heads + j) * qd + d] : 0.0f;
  }

  float m[4], l[4], acc[4][VK][4];
  int64_t row_pos[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.0f;
    // Rows past the tile's tokens copy its last row's mask and are never
    // written: every row then has key 0, so its maximum is finite.
    const int r = ty * 4 + i < n ? ty * 4 + i : n - 1;
    row_pos[i] = p0 + r;
#pragma unroll
    for (int k = 0; k < VK; ++k) {
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[i][k][c] = 0.0f;
    }
  }

  for (int64_t k0 = 0; k0 <= last; k0 += kKeyTile) {
    __syncthreads();  // the queries are in; the previous tile's Vs and Pt are read
    for (int64_t i = tid; i < kKeyTile * qd; i += kThreads) {
      const int c = static_cast<int>(i / qd);
      const int64_t d = i % qd, p = k0 + c;
      Kt[d * kKStride + c] =
          p <= last ? KvAt(kv, table[p / kv.block_size], layer, 0, kvh, p % kv.block_size)[d] : 0.0f;
    }
    for (int64_t i = tid; i < kKeyTile * vd; i += kThreads) {
      const int c = static_cast<int>(i / vd);
      const int64_t d = i % vd, p = k0 + c;
      Vs[c * vd + d] = p <= last ? KvAt(kv, table[p / kv.block_size], layer, 1, kvh, p % kv.block_size)[d] : 0.0f;
    }
    __syncthreads();

    float s[4][2] = {};
    for (int64_t d = 0; d < qd; ++d) {
      const float4 qv = *reinterpret_cast<const float4*>(Qt + d * kQStride + ty * 4);
      const float2 kv2 = *reinterpret_cast<const float2*>(Kt + d * kKStride + tx * 2);
      s[0][0] += qv.x * kv2.x;
      s[0][1] += qv.x * kv2.y;
      s[1][0] += qv.y * kv2.x;
      s[1][1] += qv.y * kv2.y;
      s[2][0] += qv.z * kv2.x;
      s[2][1] += qv.z * kv2.y;
      s[3][0] += qv.w * kv2.x;
      s[3][1] += qv.w * kv2.y;
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float mx = -INFINITY;
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int64_t p = k0 + tx * 2 + c;
        s[i][c] = p <= row_pos[i] ? s[i][c] * scale : -INFINITY;
        mx = fmaxf(mx, s[i][c]);
      }
#pragma unroll
      for (int o = 8; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      // Finite: tile 0 holds key 0, which every row reads.
      const float m2 = fmaxf(m[i], mx);
      const float corr = expf(m[i] - m2);
      float sum = 0.0f;
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        s[i][c] = expf(s[i][c] - m2);  // a masked score gives 0
        sum += s[i][c];
        Pt[(tx * 2 + c) * kPStride + ty * 4 + i] = s[i][c];
      }
#pragma unroll
      for (int o = 8; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      l[i] = l[i] * corr + sum;
      m[i] = m2;
#pragma unroll
      for (int k = 0; k < VK; ++k) {
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[i][k][c] *= corr;
      }
    }
    __syncthreads();
    for (int c = 0; c < kKeyTile; ++c) {
      const float4 pv = *reinterpret_cast<const float4*>(Pt + c * kPStride + ty * 4);
      const float p[4] = {pv.x, pv.y, pv.z, pv.w};
#pragma unroll
      for (int k = 0; k < VK; ++k) {
        const int64_t col = tx * 4 + 64 * k;
        if (col < vd) {
          const float4 vv = *reinterpret_cast<const float4*>(Vs + c * vd + col);
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            acc[i][k][0] += p[i] * vv.x;
            acc[i][k][1] += p[i] * vv.y;
            acc[i][k][2] += p[i] * vv.z;
            acc[i][k][3] += p[i] * vv.w;
          }
        }
      }
    }
  }

#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = ty * 4 + i;
    if (r >= n) continue;
    float* o = out + ((static_cast<int64_t>(t0) + r) * q_heads + j) * vd;
#pragma unroll
    for (int k = 0; k < VK; ++k) {
      const int64_t col = tx * 4 + 64 * k;
      if (col < vd) {
#pragma unroll
        for (int c = 0; c < 4; ++c) o[col + c] = acc[i][k][c] / l[i];
      }
    }
  }
}

template <int VK>
void LaunchFor(const float* q, const int32_t* tiles, int n_tiles, int64_t q_heads, int64_t head_start, int64_t group,
               int64_t kv_head_start, int64_t qd, int64_t vd, float scale, const DevStepMeta& meta,
               const DevKvLayout& kv, int64_t layer, float* out, cudaStream_t s) {
  const size_t bytes = SharedBytes(qd, vd);
  const dim3 grid(static_cast<unsigned>(n_tiles), static_cast<unsigned>(q_heads));
  TiledAttentionKernel<VK><<<grid, kThreads, bytes, s>>>(q, tiles, q_heads, head_start, group, kv_head_start, qd, vd,
                                                         scale, meta, kv, layer, out);
}

}  // namespace

bool TiledAttentionFits(int64_t q_dim, int64_t v_dim) {
  if (q_dim < 1 || v_dim < 4 || v_dim % 4 != 0 || v_dim > 4 * 64 || q_dim > kMaxHeadDim) return false;
  int device = 0, limit = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess) return false;
  const size_t bytes = SharedBytes(q_dim, v_dim);
  if (bytes > static_cast<size_t>(limit)) return false;
  // Above 48 KiB a kernel must opt in, per device: once here, at the
  // rank's start, not at every launch.
  const int want = static_cast<int>(bytes);
  return cudaFuncSetAttribute(TiledAttentionKernel<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, want) ==
             cudaSuccess &&
         cudaFuncSetAttribute(TiledAttentionKernel<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, want) ==
             cudaSuccess &&
         cudaFuncSetAttribute(TiledAttentionKernel<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, want) ==
             cudaSuccess;
}

void LaunchTiledAttention(const float* q, const int32_t* tiles, int n_tiles, int64_t q_heads, int64_t head_start,
                          int64_t group, int64_t kv_head_start, int64_t q_dim, int64_t v_dim, float scale,
                          const DevStepMeta& meta, const DevKvLayout& kv, int64_t layer, float* out, Stream s) {
  if (n_tiles <= 0) return;
  auto* st = static_cast<cudaStream_t>(s);
  if (v_dim <= 64) {
    LaunchFor<1>(q, tiles, n_tiles, q_heads, head_start, group, kv_head_start, q_dim, v_dim, scale, meta, kv, layer,
                 out, st);
  } else if (v_dim <= 128) {
    LaunchFor<2>(q, tiles, n_tiles, q_heads, head_start, group, kv_head_start, q_dim, v_dim, scale, meta, kv, layer,
                 out, st);
  } else {
    LaunchFor<4>(q, tiles, n_tiles, q_heads, head_start, group, kv_head_start, q_dim, v_dim, scale, meta, kv, layer,
                 out, st);
  }
}

}  // namespace wsup::engine::cuda
