#include "engine/cuda/kernels.h"
#include "engine/cuda/kv_access.cuh"
#include "engine/cuda/routing.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace wsup::engine::cuda {

namespace {

constexpr int kWarp = 32;

cudaStream_t S(Stream s) { return static_cast<cudaStream_t>(s); }

__device__ __forceinline__ float Bf16Bits(uint16_t v) { return __uint_as_float(static_cast<uint32_t>(v) << 16); }
__device__ __forceinline__ float F16Bits(uint16_t v) { return __half2float(__ushort_as_half(v)); }
__device__ __forceinline__ float Fp8Bits(uint8_t v) {
  __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(v), __NV_E4M3);
  return __half2float(__half(h));
}

// Element (r, c) of a matrix as float32 (scalar path; used where a row is
// read once per step, not in the hot products).
__device__ __forceinline__ float LoadElem(const DevMatrix& m, int64_t r, int64_t c) {
  const int64_t i = r * m.cols + c;
  switch (m.dtype) {
    case kDevBf16:
      return Bf16Bits(static_cast<const uint16_t*>(m.data)[i]);
    case kDevF16:
      return F16Bits(static_cast<const uint16_t*>(m.data)[i]);
    case kDevFp8E4M3:
      return Fp8Bits(static_cast<const uint8_t*>(m.data)[i]) *
             m.scale[(r / m.block_rows) * m.scale_cols + c / m.block_cols];
    default:
      return static_cast<const float*>(m.data)[i];
  }
}

__device__ __forceinline__ float WarpSum(float v) {
  for (int o = kWarp / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// ---- embedding, norms, elementwise ----

__global__ void EmbedKernel(DevMatrix emb, DevStepMeta meta, int64_t vocab_start, float* x) {
  const int t = blockIdx.x;
  const int64_t id = static_cast<int64_t>(meta.tokens[t]) - vocab_start;
  float* row = x + static_cast<int64_t>(t) * emb.cols;
  const bool mine = id >= 0 && id < emb.rows;
  for (int64_t c = threadIdx.x; c < emb.cols; c += blockDim.x) row[c] = mine ? LoadElem(emb, id, c) : 0.0f;
}

__global__ void RmsNormKernel(const float* x, DevMatrix w, const int32_t* rows_index, int64_t n, int64_t stride,
                              float eps, float* out) {
  __shared__ float partial[32];
  const int r = blockIdx.x;
  const int64_t src = rows_index ? rows_index[r] : r;
  const float* in = x + src * stride;
  float ss = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ss += in[i] * in[i];
  ss = WarpSum(ss);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  if (lane == 0) partial[warp] = ss;
  __syncthreads();
  if (warp == 0) {
    float v = lane < static_cast<int>(blockDim.x / kWarp) ? partial[lane] : 0.0f;
    v = WarpSum(v);
    if (lane == 0) partial[0] = v;
  }
  __syncthreads();
  const float inv = 1.0f / sqrtf(partial[0] / static_cast<float>(n) + eps);
  float* o = out + static_cast<int64_t>(r) * n;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) o[i] = LoadElem(w, 0, i) * (in[i] * inv);
}

__global__ void SiluMulKernel(float* gate, const float* up, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = gate[i];
    gate[i] = g / (1.0f + expf(-g)) * up[i];
  }
}

__global__ void AddKernel(float* x, const float* y, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    x[i] += y[i];
  }
}

// hi = x rounded to bfloat16; lo (when given) = the rest, rounded too:
// hi + lo carries 16 of float32's 24 significand bits, and a bfloat16
// weight times either is exact in float32.
__global__ void SplitBf16Kernel(const float* x, int64_t n, __nv_bfloat16* hi, __nv_bfloat16* lo) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = x[i];
    const __nv_bfloat16 h = __float2bfloat16_rn(v);
    hi[i] = h;
    if (lo) lo[i] = __float2bfloat16_rn(v - __bfloat162float(h));
  }
}

__global__ void DequantKernel(DevMatrix w, float* out) {
  const int64_t total = w.rows * w.cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = LoadElem(w, i / w.cols, i % w.cols);
  }
}

// ---- the small-batch product: one warp per output row ----

// Loads kVec consecutive weights of row r starting at column c (16 bytes).
template <int DT>
struct VecLoad;

template <>
struct VecLoad<kDevF32> {
  static constexpr int kVec = 4;
  __device__ static void Load(const DevMatrix& m, int64_t r, int64_t c, float* out) {
    const float4 v = *reinterpret_cast<const float4*>(static_cast<const float*>(m.data) + r * m.cols + c);
    out[0] = v.x, out[1] = v.y, out[2] = v.z, out[3] = v.w;
  }
};

template <>
struct VecLoad<kDevBf16> {
  static constexpr int kVec = 8;
  __device__ static void Load(const DevMatrix& m, int64_t r, int64_t c, float* out) {
    const uint4 v = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(m.data) + r * m.cols + c);
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      out[2 * k] = __uint_as_float(w[k] << 16);
      out[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
    }
  }
};

template <>
struct VecLoad<kDevF16> {
  static constexpr int kVec = 8;
  __device__ static void Load(const DevMatrix& m, int64_t r, int64_t c, float* out) {
    const uint4 v = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(m.data) + r * m.cols + c);
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      out[2 * k] = F16Bits(static_cast<uint16_t>(w[k] & 0xffffu));
      out[2 * k + 1] = F16Bits(static_cast<uint16_t>(w[k] >> 16));
    }
  }
};

template <>
struct VecLoad<kDevFp8E4M3> {
  static constexpr int kVec = 16;
  __device__ static void Load(const DevMatrix& m, int64_t r, int64_t c, float* out) {
    const uint4 v = *reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(m.data) + r * m.cols + c);
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
    const float* srow = m.scale + (r / m.block_rows) * m.scale_cols;
#pragma unroll
    for (int k = 0; k < 16; ++k) {
      const int64_t col = c + k;
      out[k] = Fp8Bits(static_cast<uint8_t>(w[k / 4] >> (8 * (k % 4)))) * srow[col / m.block_cols];
    }
  }
};

constexpr int kGemvWarps = 8;

// acc[t] = lane's share of row `row` of w times x[t], t < T. Vector path:
// cols % kVec == 0 and rows 16-byte aligned (checked by the launcher);
// scalar path otherwise.
template <int DT, bool kVecPath>
__device__ __forceinline__ void RowDot(const DevMatrix& w, int64_t row, const float* x, int T, int lane,
                                       float (&acc)[kSmallBatch]) {
#pragma unroll
  for (int t = 0; t < kSmallBatch; ++t) acc[t] = 0.0f;
  if constexpr (kVecPath) {
    constexpr int V = VecLoad<DT>::kVec;
    float wv[V];
    // Unrolled so that several 16-byte loads of the row are in flight per
    // lane: a decode step is bound by how many weight bytes are in flight.
#pragma unroll 4
    for (int64_t c = static_cast<int64_t>(lane) * V; c < w.cols; c += kWarp * V) {
      VecLoad<DT>::Load(w, row, c, wv);
#pragma unroll
      for (int t = 0; t < kSmallBatch; ++t) {
        if (t < T) {
          const float* xr = x + static_cast<int64_t>(t) * w.cols + c;
#pragma unroll
          for (int k = 0; k < V; k += 4) {
            const float4 xv = *reinterpret_cast<const float4*>(xr + k);
            acc[t] += wv[k] * xv.x + wv[k + 1] * xv.y + wv[k + 2] * xv.z + wv[k + 3] * xv.w;
          }
        }
      }
    }
  } else {
    for (int64_t c = lane; c < w.cols; c += kWarp) {
      const float wv = LoadElem(w, row, c);
#pragma unroll
      for (int t = 0; t < kSmallBatch; ++t) {
        if (t < T) acc[t] += wv * x[static_cast<int64_t>(t) * w.cols + c];
      }
    }
  }
}

// Up to kGemvJobs products over one input in one launch, one warp per
// output row: a decode step of a small model is as much launches as weight
// reads (a 2k x 2k bf16 matrix is 3 microseconds of HBM), so the q, k and v
// projections go in one launch, and gate and up with their SiLU in another.
constexpr int kGemvJobs = 3;
enum GemvEpilogue : int {
  kGemvStore = 0,       // y[m] = x . w[m]^T
  kGemvAccumulate = 1,  // y[m] += x . w[m]^T (a residual add, as LaunchAdd)
  kGemvSiluGateUp = 2,  // y[0] = silu(x . w[0]^T) * (x . w[1]^T) (as LaunchSiluMul)
};
struct GemvJobs {
  DevMatrix w[kGemvJobs];
  float* y[kGemvJobs];
  int64_t first[kGemvJobs + 1];  // warp rows: matrix m takes [first[m], first[m + 1])
  int n = 0;
};

template <int DT, bool kVecPath, int EPI>
__global__ void __launch_bounds__(kGemvWarps* kWarp) GemvSmallKernel(GemvJobs jobs, const float* x, int T) {
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t g = static_cast<int64_t>(blockIdx.x) * kGemvWarps + warp;
  if (g >= jobs.first[jobs.n]) return;
  const int m = jobs.n > 1 && g >= jobs.first[1] ? (jobs.n > 2 && g >= jobs.first[2] ? 2 : 1) : 0;
  const DevMatrix& w = m == 0 ? jobs.w[0] : (m == 1 ? jobs.w[1] : jobs.w[2]);
  float* y = m == 0 ? jobs.y[0] : (m == 1 ? jobs.y[1] : jobs.y[2]);
  const int64_t row = g - jobs.first[m];
  float acc[kSmallBatch];
  RowDot<DT, kVecPath>(w, row, x, T, lane, acc);
  if constexpr (EPI == kGemvSiluGateUp) {
    float up[kSmallBatch];
    RowDot<DT, kVecPath>(jobs.w[1], row, x, T, lane, up);
#pragma unroll
    for (int t = 0; t < kSmallBatch; ++t) {
      if (t < T) {
        const float gv = WarpSum(acc[t]), uv = WarpSum(up[t]);
        if (lane == 0) y[static_cast<int64_t>(t) * w.rows + row] = gv / (1.0f + expf(-gv)) * uv;
      }
    }
  } else {
#pragma unroll
    for (int t = 0; t < kSmallBatch; ++t) {
      if (t < T) {
        const float v = WarpSum(acc[t]);
        if (lane == 0) {
          float* out = y + static_cast<int64_t>(t) * w.rows + row;
          if constexpr (EPI == kGemvAccumulate) {
            *out += v;
          } else {
            *out = v;
          }
        }
      }
    }
  }
}

template <int DT>
bool GemvAligned(const DevMatrix& w, const float* x) {
  constexpr int V = VecLoad<DT>::kVec;
  constexpr int64_t kBytes = DT == kDevF32 ? 4 : (DT == kDevFp8E4M3 ? 1 : 2);
  return reinterpret_cast<uintptr_t>(w.data) % 16 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
         w.cols % V == 0 && (w.cols * kBytes) % 16 == 0 && (DT != kDevFp8E4M3 || w.block_cols % 16 == 0);
}

// Every job's matrix is of dtype DT, with the input's columns.
template <int DT, int EPI>
void GemvSmallFor(const GemvJobs& jobs, const float* x, int T, cudaStream_t s) {
  bool aligned = true;
  for (int m = 0; m < jobs.n; ++m) aligned = aligned && GemvAligned<DT>(jobs.w[m], x);
  const dim3 grid(static_cast<unsigned>((jobs.first[jobs.n] + kGemvWarps - 1) / kGemvWarps));
  if (aligned) {
    GemvSmallKernel<DT, true, EPI><<<grid, kGemvWarps * kWarp, 0, s>>>(jobs, x, T);
  } else {
    GemvSmallKernel<DT, false, EPI><<<grid, kGemvWarps * kWarp, 0, s>>>(jobs, x, T);
  }
}

template <int EPI>
void GemvSmallDispatch(const GemvJobs& jobs, const float* x, int T, cudaStream_t s) {
  switch (jobs.w[0].dtype) {
    case kDevBf16:
      return GemvSmallFor<kDevBf16, EPI>(jobs, x, T, s);
    case kDevF16:
      return GemvSmallFor<kDevF16, EPI>(jobs, x, T, s);
    case kDevFp8E4M3:
      return GemvSmallFor<kDevFp8E4M3, EPI>(jobs, x, T, s);
    default:
      return GemvSmallFor<kDevF32, EPI>(jobs, x, T, s);
  }
}

GemvJobs OneJob(const DevMatrix& w, float* y) {
  GemvJobs j;
  j.w[0] = w;
  j.y[0] = y;
  j.first[0] = 0;
  j.first[1] = w.rows;
  j.n = 1;
  return j;
}

// ---- rotary embedding and the KV cache ----

__global__ void RopeStoreKernel(float* q, float* k, const float* v, int64_t q_heads, const float* inv_freq,
                                DevStepMeta meta, DevKvLayout kv, int64_t layer) {
  const int t = blockIdx.x;
  const int64_t hd = kv.head_dim, half = hd / 2;
  const int64_t pos = meta.positions[t];
  const int64_t heads = q_heads + kv.kv_heads;
  for (int64_t i = threadIdx.x; i < heads * half; i += blockDim.x) {
    const int64_t h = i / half, j = i % half;
    float* head = h < q_heads ? q + (static_cast<int64_t>(t) * q_heads + h) * hd
                              : k + (static_cast<int64_t>(t) * kv.kv_heads + (h - q_heads)) * hd;
    const float angle = static_cast<float>(pos) * inv_freq[j];
    const float c = cosf(angle), sn = sinf(angle);
    const float a = head[j], b = head[j + half];
    head[j] = a * c - b * sn;
    head[j + half] = b * c + a * sn;
  }
  __syncthreads();
  const int32_t block = meta.block_table[static_cast<int64_t>(meta.seq[t]) * meta.max_blocks + pos / kv.block_size];
  const int64_t off = pos % kv.block_size;
  for (int64_t i = threadIdx.x; i < kv.kv_heads * hd; i += blockDim.x) {
    const int64_t h = i / hd, d = i % hd;
    const int64_t src = (static_cast<int64_t>(t) * kv.kv_heads + h) * hd + d;
    KvAt(kv, block, layer, 0, h, off)[d] = k[src];
    KvAt(kv, block, layer, 1, h, off)[d] = v[src];
  }
}

// One block per (token, query head); each warp walks every kAttnWarps-th
// position with an online softmax, then the warps merge. Block x takes
// token list[x] (every token of the step when list is null): decode
// tokens, whose one query row would leave a tile of attention.cu idle.
constexpr int kAttnWarps = 4;
constexpr int kPerLane = static_cast<int>(kMaxHeadDim / kWarp);

__global__ void __launch_bounds__(kAttnWarps* kWarp)
    AttentionKernel(const float* q, int64_t q_heads, int64_t head_start, int64_t group, int64_t kv_head_start,
                    int64_t qd, int64_t vd, float scale, DevStepMeta meta, DevKvLayout kv, int64_t layer,
                    const int32_t* list, float* out) {
  __shared__ float qs[kMaxHeadDim];
  __shared__ float wm[kAttnWarps], wl[kAttnWarps];
  __shared__ float wacc[kAttnWarps][kMaxHeadDim];
  const int t = list ? list[blockIdx.x] : static_cast<int>(blockIdx.x);
  const int64_t j = blockIdx.y;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const float* qh = q + (static_cast<int64_t>(t) * q_heads + j) * qd;
  for (int64_t i = threadIdx.x; i < qd; i += blockDim.x) qs[i] = qh[i];
  __syncthreads();

  const int64_t kvh = (head_start + j) / group - kv_head_start;
  const int64_t pos = meta.positions[t];
  const int32_t* table = meta.block_table + static_cast<int64_t>(meta.seq[t]) * meta.max_blocks;
  float m = -INFINITY, l = 0.0f;
  float acc[kPerLane];
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) acc[k] = 0.0f;
  for (int64_t p = warp; p <= pos; p += kAttnWarps) {
    const int32_t block = table[p / kv.block_size];
    const float* kp = KvAt(kv, block, layer, 0, kvh, p % kv.block_size);
    const float* vp = KvAt(kv, block, layer, 1, kvh, p % kv.block_size);
    float dot = 0.0f;
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      const int64_t i = lane + static_cast<int64_t>(k) * kWarp;
      if (i < qd) dot += qs[i] * kp[i];
    }
    const float s = WarpSum(dot) * scale;
    const float m2 = fmaxf(m, s);
    const float corr = expf(m - m2), e = expf(s - m2);
    l = l * corr + e;
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      const int64_t i = lane + static_cast<int64_t>(k) * kWarp;
      if (i < vd) acc[k] = acc[k] * corr + e * vp[i];
    }
    m = m2;
  }
  if (lane == 0) {
    wm[warp] = m;
    wl[warp] = l;
  }
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    const int64_t i = lane + static_cast<int64_t>(k) * kWarp;
    if (i < vd) wacc[warp][i] = acc[k];
  }
  __syncthreads();
  float mx = -INFINITY;
  for (int w = 0; w < kAttnWarps; ++w) mx = fmaxf(mx, wm[w]);
  float total = 0.0f;
  for (int w = 0; w < kAttnWarps; ++w) total += wm[w] == -INFINITY ? 0.0f : wl[w] * expf(wm[w] - mx);
  float* o = out + (static_cast<int64_t>(t) * q_heads + j) * vd;
  for (int64_t i = threadIdx.x; i < vd; i += blockDim.x) {
    float v = 0.0f;
    for (int w = 0; w < kAttnWarps; ++w) {
      if (wm[w] != -INFINITY) v += wacc[w][i] * expf(wm[w] - mx);
    }
    o[i] = v / total;
  }
}

// ---- DeepSeek-V3 attention inputs ----

// One block per (token, head): the head's q rope part and the shared rope
// key, regrouped (evens, then odds) when interleaved, rotated as
// rotate_half does; then the head's k and v slots.
__global__ void MlaRopeStoreKernel(float* q, const float* lat, int64_t lat_stride, int64_t rope_at, const float* kvb,
                                   int64_t nope, int64_t rope, int64_t vd, bool interleave, const float* inv_freq,
                                   DevStepMeta meta, DevKvLayout kv, int64_t layer) {
  __shared__ float qs[kMaxRope], ks[kMaxRope], kr[kMaxRope];
  const int t = blockIdx.x;
  const int64_t j = blockIdx.y, heads = gridDim.y;
  const int64_t half = rope / 2, qd = nope + rope;
  float* qh = q + (static_cast<int64_t>(t) * heads + j) * qd + nope;
  const float* kh = lat + static_cast<int64_t>(t) * lat_stride + rope_at;
  for (int64_t i = threadIdx.x; i < rope; i += blockDim.x) {
    const int64_t dst = interleave ? (i % 2 == 0 ? i / 2 : half + i / 2) : i;
    qs[dst] = qh[i];
    ks[dst] = kh[i];
  }
  __syncthreads();
  const int64_t pos = meta.positions[t];
  for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
    const float angle = static_cast<float>(pos) * inv_freq[i];
    const float c = cosf(angle), sn = sinf(angle);
    qh[i] = qs[i] * c - qs[i + half] * sn;
    qh[i + half] = qs[i + half] * c + qs[i] * sn;
    kr[i] = ks[i] * c - ks[i + half] * sn;
    kr[i + half] = ks[i + half] * c + ks[i] * sn;
  }
  __syncthreads();
  const int32_t block = meta.block_table[static_cast<int64_t>(meta.seq[t]) * meta.max_blocks + pos / kv.block_size];
  const int64_t off = pos % kv.block_size;
  const float* src = kvb + (static_cast<int64_t>(t) * heads + j) * (nope + vd);
  float* kslot = KvAt(kv, block, layer, 0, j, off);
  float* vslot = KvAt(kv, block, layer, 1, j, off);
  for (int64_t i = threadIdx.x; i < qd; i += blockDim.x) kslot[i] = i < nope ? src[i] : kr[i - nope];
  for (int64_t i = threadIdx.x; i < vd; i += blockDim.x) vslot[i] = src[nope + i];
}

// ---- mixture of experts ----

// One block per token; thread 0 decides (engine/cuda/routing.h: a handful
// of comparisons per expert; the products around it are where the time
// goes).
__global__ void RouteKernel(const float* logits, DevMatrix bias, DevRouting r, int32_t* ids, float* weights) {
  __shared__ float prob[kMaxExperts], choice[kMaxExperts], b[kMaxExperts];
  __shared__ bool taken[kMaxExperts];
  if (threadIdx.x != 0) return;
  const int t = blockIdx.x;
  if (r.sigmoid) {
    for (int64_t e = 0; e < r.experts; ++e) b[e] = LoadElem(bias, 0, e);
  }
  RouteToken(logits + static_cast<int64_t>(t) * r.experts, b, r, prob, choice, taken,
             ids + static_cast<int64_t>(t) * r.top_k, weights + static_cast<int64_t>(t) * r.top_k);
}

// One block: thread e counts expert e's slots, thread 0 turns the counts
// into offsets, thread e lists its slots in ascending order.
__global__ void ExpertListsKernel(const int32_t* ids, int P, int64_t E, int32_t* offsets, int32_t* order) {
  __shared__ int32_t count[kMaxExperts];
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
    int32_t n = 0;
    for (int p = 0; p < P; ++p) n += ids[p] == e;
    count[e] = n;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t at = 0;
    for (int64_t e = 0; e < E; ++e) {
      offsets[e] = at;
      at += count[e];
    }
    offsets[E] = at;
  }
  __syncthreads();
  for (int64_t e = threadIdx.x; e < E; e += blockDim.x) {
    int32_t at = offsets[e];
    for (int p = 0; p < P; ++p) {
      if (ids[p] == e) order[at++] = p;
    }
  }
}

// Block (row slice, expert): each warp one output row of the expert,
// against the expert's slots kSmallBatch at a time.
template <int DT>
__global__ void __launch_bounds__(kGemvWarps* kWarp)
    ExpertGemvKernel(const DevMatrix* ws, const int32_t* offsets, const int32_t* order, const float* x, int x_div,
                     float* y) {
  const int e = blockIdx.y;
  const int beg = offsets[e], end = offsets[e + 1];
  if (beg == end) return;
  const DevMatrix w = ws[e];
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kGemvWarps + warp;
  if (row >= w.rows) return;
  constexpr int V = VecLoad<DT>::kVec;
  constexpr int64_t kBytes = DT == kDevF32 ? 4 : (DT == kDevFp8E4M3 ? 1 : 2);
  const bool vec = reinterpret_cast<uintptr_t>(w.data) % 16 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                   w.cols % V == 0 && (w.cols * kBytes) % 16 == 0 && w.cols % 4 == 0 &&
                   (DT != kDevFp8E4M3 || w.block_cols % 16 == 0);
  for (int base = beg; base < end; base += kSmallBatch) {
    const int n = end - base < kSmallBatch ? end - base : kSmallBatch;
    const float* xr[kSmallBatch];
    float acc[kSmallBatch];
#pragma unroll
    for (int i = 0; i < kSmallBatch; ++i) {
      acc[i] = 0.0f;
      xr[i] = i < n ? x + static_cast<int64_t>(order[base + i] / x_div) * w.cols : x;
    }
    if (vec) {
      float wv[V];
      for (int64_t c = static_cast<int64_t>(lane) * V; c < w.cols; c += kWarp * V) {
        VecLoad<DT>::Load(w, row, c, wv);
#pragma unroll
        for (int i = 0; i < kSmallBatch; ++i) {
          if (i < n) {
#pragma unroll
            for (int k = 0; k < V; k += 4) {
              const float4 xv = *reinterpret_cast<const float4*>(xr[i] + c + k);
              acc[i] += wv[k] * xv.x + wv[k + 1] * xv.y + wv[k + 2] * xv.z + wv[k + 3] * xv.w;
            }
          }
        }
      }
    } else {
      for (int64_t c = lane; c < w.cols; c += kWarp) {
        const float wv = LoadElem(w, row, c);
#pragma unroll
        for (int i = 0; i < kSmallBatch; ++i) {
          if (i < n) acc[i] += wv * xr[i][c];
        }
      }
    }
#pragma unroll
    for (int i = 0; i < kSmallBatch; ++i) {
      if (i < n) {
        const float v = WarpSum(acc[i]);
        if (lane == 0) y[static_cast<int64_t>(order[base + i]) * w.rows + row] = v;
      }
    }
  }
}

__global__ void ExpertCombineKernel(const float* y, const int32_t* ids, const float* weights, int64_t K, int64_t n,
                                    float* out) {
  const int t = blockIdx.x;
  // The token's slots in ascending expert id (K is small).
  int slot[kMaxTopK];
  for (int64_t k = 0; k < K; ++k) slot[k] = static_cast<int>(k);
  const int32_t* id = ids + static_cast<int64_t>(t) * K;
  for (int64_t a = 1; a < K; ++a) {
    for (int64_t b = a; b > 0 && id[slot[b]] < id[slot[b - 1]]; --b) {
      const int tmp = slot[b];
      slot[b] = slot[b - 1];
      slot[b - 1] = tmp;
    }
  }
  const float* w = weights + static_cast<int64_t>(t) * K;
  for (int64_t c = threadIdx.x; c < n; c += blockDim.x) {
    float v = 0.0f;
    for (int64_t k = 0; k < K; ++k) {
      const int64_t p = static_cast<int64_t>(t) * K + slot[k];
      v += y[p * n + c] * w[slot[k]];
    }
    out[static_cast<int64_t>(t) * n + c] = v;
  }
}

unsigned GridFor(int64_t n, int threads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(blocks < 4096 ? (blocks > 0 ? blocks : 1) : 4096);
}

}  // namespace

void LaunchEmbed(const DevMatrix& emb, const DevStepMeta& meta, int T, int64_t vocab_start, float* x, Stream s) {
  EmbedKernel<<<T, 256, 0, S(s)>>>(emb, meta, vocab_start, x);
}

void LaunchRmsNorm(const float* x, const DevMatrix& w, const int32_t* rows_index, int rows, int64_t n, float eps,
                   float* out, Stream s, int64_t in_stride) {
  RmsNormKernel<<<rows, 256, 0, S(s)>>>(x, w, rows_index, n, in_stride > 0 ? in_stride : n, eps, out);
}

void LaunchGemvSmall(const DevMatrix& w, const float* x, int T, float* y, Stream s) {
  GemvSmallDispatch<kGemvStore>(OneJob(w, y), x, T, S(s));
}

bool GemvSmallFuses(const DevMatrix* const* ws, int n) {
  if (n < 1 || n > kGemvJobs) return false;
  for (int m = 1; m < n; ++m) {
    if (ws[m]->dtype != ws[0]->dtype || ws[m]->cols != ws[0]->cols) return false;
    if (ws[0]->dtype == kDevFp8E4M3 &&
        (ws[m]->block_rows != ws[0]->block_rows || ws[m]->block_cols != ws[0]->block_cols)) {
      return false;
    }
  }
  return true;
}

void LaunchGemvSmallMany(const DevMatrix* const* ws, float* const* ys, int n, const float* x, int T, Stream s) {
  GemvJobs jobs;
  jobs.first[0] = 0;
  for (int m = 0; m < n; ++m) {
    jobs.w[m] = *ws[m];
    jobs.y[m] = ys[m];
    jobs.first[m + 1] = jobs.first[m] + ws[m]->rows;
  }
  jobs.n = n;
  GemvSmallDispatch<kGemvStore>(jobs, x, T, S(s));
}

void LaunchGemvSmallAdd(const DevMatrix& w, const float* x, int T, float* y, Stream s) {
  GemvSmallDispatch<kGemvAccumulate>(OneJob(w, y), x, T, S(s));
}

void LaunchGemvSmallSiluGateUp(const DevMatrix& gate, const DevMatrix& up, const float* x, int T, float* y, Stream s) {
  GemvJobs jobs = OneJob(gate, y);
  jobs.w[1] = up;
  GemvSmallDispatch<kGemvSiluGateUp>(jobs, x, T, S(s));
}

void LaunchSplitBf16(const float* x, int64_t n, uint16_t* hi, uint16_t* lo, Stream s) {
  SplitBf16Kernel<<<GridFor(n, 256), 256, 0, S(s)>>>(x, n, reinterpret_cast<__nv_bfloat16*>(hi),
                                                     reinterpret_cast<__nv_bfloat16*>(lo));
}

void LaunchDequant(const DevMatrix& w, float* out, Stream s) {
  DequantKernel<<<GridFor(w.rows * w.cols, 256), 256, 0, S(s)>>>(w, out);
}

void LaunchRopeAndStore(float* q, float* k, const float* v, int T, int64_t q_heads, const float* inv_freq,
                        const DevStepMeta& meta, const DevKvLayout& kv, int64_t layer, Stream s) {
  RopeStoreKernel<<<T, 128, 0, S(s)>>>(q, k, v, q_heads, inv_freq, meta, kv, layer);
}

void LaunchAttention(const float* q, int T, int64_t q_heads, int64_t head_start, int64_t group, int64_t kv_head_start,
                     int64_t q_dim, int64_t v_dim, float scale, const DevStepMeta& meta, const DevKvLayout& kv,
                     int64_t layer, float* out, Stream s, const int32_t* list) {
  if (T <= 0) return;
  const dim3 grid(static_cast<unsigned>(T), static_cast<unsigned>(q_heads));
  AttentionKernel<<<grid, kAttnWarps * kWarp, 0, S(s)>>>(q, q_heads, head_start, group, kv_head_start, q_dim, v_dim,
                                                          scale, meta, kv, layer, list, out);
}

void LaunchMlaRopeStore(float* q, const float* lat, int64_t lat_stride, int64_t rope_at, const float* kvb, int T,
                        int64_t heads, int64_t nope, int64_t rope, int64_t v_dim, bool interleave,
                        const float* inv_freq, const DevStepMeta& meta, const DevKvLayout& kv, int64_t layer,
                        Stream s) {
  const dim3 grid(static_cast<unsigned>(T), static_cast<unsigned>(heads));
  MlaRopeStoreKernel<<<grid, 64, 0, S(s)>>>(q, lat, lat_stride, rope_at, kvb, nope, rope, v_dim, interleave, inv_freq,
                                            meta, kv, layer);
}

void LaunchRoute(const float* logits, const DevMatrix& bias, const DevRouting& r, int T, int32_t* ids, float* weights,
                 Stream s) {
  RouteKernel<<<T, kWarp, 0, S(s)>>>(logits, bias, r, ids, weights);
}

void LaunchExpertLists(const int32_t* ids, int P, int64_t experts, int32_t* offsets, int32_t* order, Stream s) {
  ExpertListsKernel<<<1, 256, 0, S(s)>>>(ids, P, experts, offsets, order);
}

void LaunchExpertGemv(const DevMatrix* ws, int dtype, int64_t experts, int64_t rows, const int32_t* offsets,
                      const int32_t* order, const float* x, int x_div, float* y, Stream s) {
  const dim3 grid(static_cast<unsigned>((rows + kGemvWarps - 1) / kGemvWarps), static_cast<unsigned>(experts));
  const int threads = kGemvWarps * kWarp;
  switch (dtype) {
    case kDevBf16:
      return ExpertGemvKernel<kDevBf16><<<grid, threads, 0, S(s)>>>(ws, offsets, order, x, x_div, y);
    case kDevF16:
      return ExpertGemvKernel<kDevF16><<<grid, threads, 0, S(s)>>>(ws, offsets, order, x, x_div, y);
    case kDevFp8E4M3:
      return ExpertGemvKernel<kDevFp8E4M3><<<grid, threads, 0, S(s)>>>(ws, offsets, order, x, x_div, y);
    default:
      return ExpertGemvKernel<kDevF32><<<grid, threads, 0, S(s)>>>(ws, offsets, order, x, x_div, y);
  }
}

void LaunchExpertCombine(const float* y, const int32_t* ids, const float* weights, int T, int64_t top_k, int64_t n,
                         float* out, Stream s) {
  ExpertCombineKernel<<<T, 256, 0, S(s)>>>(y, ids, weights, top_k, n, out);
}

void LaunchSiluMul(float* gate, const float* up, int64_t n, Stream s) {
  SiluMulKernel<<<GridFor(n, 256), 256, 0, S(s)>>>(gate, up, n);
}

void LaunchAdd(float* x, const float* y, int64_t n, Stream s) { AddKernel<<<GridFor(n, 256), 256, 0, S(s)>>>(x, y, n); }

}  // namespace wsup::engine::cuda
