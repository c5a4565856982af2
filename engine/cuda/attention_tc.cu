// Tensor-core causal attention over the paged KV cache (engine/cuda/kernels.h,
// LaunchTcAttention): the prefill path on sm_80 and later.
//
// The same FlashAttention method as attention.cu's float32 kernel: a block
// takes one query tile (up to kAttnTile tokens of one sequence at
// consecutive positions) and one query head, and walks the sequence's keys
// and values in the paged cache kKeys positions at a time with an online
// softmax. What differs is where the products run. Both products of a key
// tile, the scores S = Q K^T and the update O += P V, are WMMA bfloat16
// tensor-core products with float32 accumulators. The float32 kernel does
// them one multiply-add at a time on the CUDA cores, about 15 times fewer
// operations a second, and at 8k tokens attention is most of a prefill.
//
// Why the operands are split: one bfloat16 term keeps 8 significant bits,
// and scores rounded so miss the golden logits by about 1e-2. With TERMS 2
// each operand x is held as hi + lo (hi = x rounded, lo = the rest rounded),
// and a product a.b is taken as hi.hi + hi.lo + lo.hi: within about 2^-16 of
// float32, three tensor-core products for one. TERMS 1 is bfloat16
// arithmetic, as transformers does it in bf16 (--matmul bf16).
//
// 4 warps; warp w owns query rows 16 w .. 16 w + 15 (one WMMA tile high).
// Per key tile, each warp:
//   - takes its 16 x kKeys scores into shared memory (float),
//   - runs the softmax there, two lanes a row: the running maximum and sum
//     per row live in those lanes' registers, the weights P go back to
//     shared memory as bfloat16 terms, and the row's output accumulator is
//     rescaled in place,
//   - adds P V into its output rows, loaded into and stored from WMMA
//     accumulators around the product (a fragment's layout is opaque, so
//     rows cannot be rescaled inside it).
// Widths are padded with zeros to a multiple of 16 (a WMMA step).
//
// Why the keys are split over blocks: a short chunk of a long prompt (the
// step bound makes chunks short once attention dominates) is one query
// tile per head, 32 blocks for 32 heads, on a GPU of 132 SMs, each block
// walking every key before it. Such a launch splits each tile's keys into
// ranges of whole key tiles over gridDim.z blocks; each writes its
// unnormalised output rows with their maximum and sum, and a second kernel
// merges the ranges (the online softmax's rescaling, once more).
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <cstdint>

#include "engine/cuda/kernels.h"
#include "engine/cuda/kv_access.cuh"

namespace wsup::engine::cuda {

namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kRows = 16;   // query rows a warp owns: one WMMA tile
constexpr int kKeys = kTcKeyTile;  // keys per tile
constexpr int kBfPad = 8;   // bfloat16 rows: a multiple of 8 elements (WMMA), banks spread
constexpr int kFPad = 4;    // float rows: a multiple of 4 elements (WMMA)

static_assert(kWarps * kRows == kAttnTile, "each query row of a tile has one warp");
static_assert(kKeys == 64, "the softmax gives each of a row's two lanes 32 keys");

using bf16 = __nv_bfloat16;

// Where each array lies in the dynamic shared memory, in bytes (each
// region 128-byte aligned: WMMA needs 32), and the row strides in elements.
struct TcLayout {
  int qdp = 0, vdp = 0;              // q and v widths rounded up to 16
  int q_ld = 0, v_ld = 0;            // bfloat16 rows of Q and K, of V
  int s_ld = 0, p_ld = 0, o_ld = 0;  // scores (float), weights (bf16), output (float)
  uint32_t q_hi = 0, q_lo = 0, k_hi = 0, k_lo = 0, v_hi = 0, v_lo = 0, s = 0, p_hi = 0, p_lo = 0, o = 0;
  uint32_t bytes = 0;
};

int Round16(int64_t x) { return static_cast<int>((x + 15) / 16 * 16); }

TcLayout MakeLayout(int64_t qd, int64_t vd, int terms) {
  TcLayout L;
  L.qdp = Round16(qd);
  L.vdp = Round16(vd);
  L.q_ld = L.qdp + kBfPad;
  L.v_ld = L.vdp + kBfPad;
  L.s_ld = kKeys + kFPad;
  L.p_ld = kKeys + kBfPad;
  L.o_ld = L.vdp + kFPad;
  uint32_t at = 0;
  auto take = [&at](size_t bytes) {
    const uint32_t off = at;
    at += static_cast<uint32_t>((bytes + 127) / 128 * 128);
    return off;
  };
  const size_t b = sizeof(bf16);
  // With one term the lo arrays are never touched: they alias hi.
  L.q_hi = take(kAttnTile * L.q_ld * b);
  L.q_lo = terms > 1 ? take(kAttnTile * L.q_ld * b) : L.q_hi;
  L.k_hi = take(kKeys * L.q_ld * b);
  L.k_lo = terms > 1 ? take(kKeys * L.q_ld * b) : L.k_hi;
  L.v_hi = take(kKeys * L.v_ld * b);
  L.v_lo = terms > 1 ? take(kKeys * L.v_ld * b) : L.v_hi;
  L.s = take(kWarps * kRows * L.s_ld * sizeof(float));
  L.p_hi = take(kWarps * kRows * L.p_ld * b);
  L.p_lo = terms > 1 ? take(kWarps * kRows * L.p_ld * b) : L.p_hi;
  L.o = take(kWarps * kRows * L.o_ld * sizeof(float));
  L.bytes = at;
  return L;
}

template <int TERMS>
__device__ __forceinline__ void Split(float x, bf16* hi, bf16* lo) {
  const bf16 h = __float2bfloat16_rn(x);
  *hi = h;
  if constexpr (TERMS > 1) *lo = __float2bfloat16_rn(x - __bfloat162float(h));
}

// Loads kKeys cached rows of `which` (0 k, 1 v) from position k0 on, `w`
// wide, into hi/lo (ld apart, padded to wp with zeros; zeros past `end`).
// VEC4: w and the cache rows are whole float4s.
template <int TERMS, bool VEC4>
__device__ __forceinline__ void LoadKv(const DevKvLayout& kv, const int32_t* table, int64_t layer, int which,
                                       int64_t kvh, int64_t k0, int64_t end, int64_t w, int wp, int ld, bf16* hi,
                                       bf16* lo, int tid) {
  if constexpr (VEC4) {
    const int wp4 = wp / 4;
    for (int i = tid; i < kKeys * wp4; i += kThreads) {
      const int c = i / wp4, d = (i % wp4) * 4;
      const int64_t p = k0 + c;
      float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (p < end && d < w) {
        x = *reinterpret_cast<const float4*>(KvAt(kv, table[p / kv.block_size], layer, which, kvh, p % kv.block_size) +
                                             d);
      }
      bf16* h = hi + c * ld + d;
      bf16* l = lo + c * ld + d;
      Split<TERMS>(x.x, h, l);
      Split<TERMS>(x.y, h + 1, l + 1);
      Split<TERMS>(x.z, h + 2, l + 2);
      Split<TERMS>(x.w, h + 3, l + 3);
    }
  } else {
    for (int i = tid; i < kKeys * wp; i += kThreads) {
      const int c = i / wp, d = i % wp;
      const int64_t p = k0 + c;
      const float x =
          p < end && d < w ? KvAt(kv, table[p / kv.block_size], layer, which, kvh, p % kv.block_size)[d] : 0.0f;
      Split<TERMS>(x, hi + c * ld + d, lo + c * ld + d);
    }
  }
}

// Partial results of one (tile, head, key range) block when keys are
// split: 64 output rows of vdp floats, then the 64 rows' maxima and sums.
__host__ __device__ inline int64_t PartFloats(int vdp) { return static_cast<int64_t>(kAttnTile) * (vdp + 2); }

template <int TERMS, bool VEC4>
__global__ void __launch_bounds__(kThreads)
    TcAttentionKernel(const float* q, const int32_t* tiles, int64_t q_heads, int64_t head_start, int64_t group,
                      int64_t kv_head_start, int64_t qd, int64_t vd, float scale, DevStepMeta meta, DevKvLayout kv,
                      int64_t layer, float* out, TcLayout L, int64_t keys_per_split, float* part) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using namespace nvcuda;
  using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major>;
  using FragBCol = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major>;
  using FragBRow = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major>;
  using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

  extern __shared__ __align__(128) unsigned char smem[];
  bf16* Qh = reinterpret_cast<bf16*>(smem + L.q_hi);
  bf16* Ql = reinterpret_cast<bf16*>(smem + L.q_lo);
  bf16* Kh = reinterpret_cast<bf16*>(smem + L.k_hi);
  bf16* Kl = reinterpret_cast<bf16*>(smem + L.k_lo);
  bf16* Vh = reinterpret_cast<bf16*>(smem + L.v_hi);
  bf16* Vl = reinterpret_cast<bf16*>(smem + L.v_lo);

  const TileHead th = ReadTileHead(tiles, head_start, group, kv_head_start, meta);
  const int t0 = th.t0, n = th.n;
  const int64_t j = th.j, kvh = th.kvh, p0 = th.p0, last = th.last;
  const int32_t* table = th.table;
  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32;
  // This block's keys: [k_begin, k_end), whole key tiles (all of them
  // unless split). A range past `last` is empty.
  const int64_t k_begin = static_cast<int64_t>(blockIdx.z) * keys_per_split;
  const int64_t k_end = k_begin + keys_per_split < last + 1 ? k_begin + keys_per_split : last + 1;

  // The tile's queries, zero past its tokens and the head's width.
  for (int i = tid; i < kAttnTile * L.qdp; i += kThreads) {
    const int r = i / L.qdp, d = i % L.qdp;
    const float x = r < n && d < qd ? q[((static_cast<int64_t>(t0) + r) * q_heads + j) * qd + d] : 0.0f;
    Split<TERMS>(x, Qh + r * L.q_ld + d, Ql + r * L.q_ld + d);
  }

  // This warp's rows.
  const bf16* Qhw = Qh + warp * kRows * L.q_ld;
  const bf16* Qlw = Ql + warp * kRows * L.q_ld;
  float* Sw = reinterpret_cast<float*>(smem + L.s) + warp * kRows * L.s_ld;
  bf16* Phw = reinterpret_cast<bf16*>(smem + L.p_hi) + warp * kRows * L.p_ld;
  bf16* Plw = reinterpret_cast<bf16*>(smem + L.p_lo) + warp * kRows * L.p_ld;
  float* Ow = reinterpret_cast<float*>(smem + L.o) + warp * kRows * L.o_ld;
  for (int i = lane; i < kRows * L.o_ld; i += 32) Ow[i] = 0.0f;

  // The softmax row of this lane and its half of the row's keys; both lanes
  // of a row keep the same running maximum and sum. Rows past the tile's
  // tokens take its last row's mask and are never written. A row's maximum
  // stays -inf while all its keys so far are masked (a key range after its
  // position): the softmax then takes 0 for it, so no inf - inf arises.
  const int r = lane >> 1, half = lane & 1;
  const int row = warp * kRows + r;
  const int64_t row_pos = p0 + (row < n ? row : n - 1);
  float m = -INFINITY, l = 0.0f;

  for (int64_t k0 = k_begin; k0 < k_end; k0 += kKeys) {
    __syncthreads();  // the queries are in; every warp is done with the previous K and V
    LoadKv<TERMS, VEC4>(kv, table, layer, 0, kvh, k0, k_end, qd, L.qdp, L.q_ld, Kh, Kl, tid);
    LoadKv<TERMS, VEC4>(kv, table, layer, 1, kvh, k0, k_end, vd, L.vdp, L.v_ld, Vh, Vl, tid);
    __syncthreads();

    // Scores: 16 rows x kKeys keys. K is stored a key per row, so K^T is
    // the column-major B operand.
    for (int nt = 0; nt < kKeys / 16; ++nt) {
      FragC acc;
      wmma::fill_fragment(acc, 0.0f);
      for (int kk = 0; kk < L.qdp; kk += 16) {
        FragA a;
        FragBCol b;
        wmma::load_matrix_sync(a, Qhw + kk, L.q_ld);
        wmma::load_matrix_sync(b, Kh + nt * 16 * L.q_ld + kk, L.q_ld);
        wmma::mma_sync(acc, a, b, acc);
        if constexpr (TERMS > 1) {
          FragA al;
          FragBCol bl;
          wmma::load_matrix_sync(bl, Kl + nt * 16 * L.q_ld + kk, L.q_ld);
          wmma::mma_sync(acc, a, bl, acc);
          wmma::load_matrix_sync(al, Qlw + kk, L.q_ld);
          wmma::mma_sync(acc, al, b, acc);
        }
      }
      wmma::store_matrix_sync(Sw + nt * 16, acc, L.s_ld, wmma::mem_row_major);
    }
    __syncwarp();

    // The online softmax of row r over this tile's keys.
    {
      float* sr = Sw + r * L.s_ld + half * 32;
      float mx = -INFINITY;
      for (int c = 0; c < 32; ++c) {
        const int64_t p = k0 + half * 32 + c;
        const float v = p <= row_pos ? sr[c] * scale : -INFINITY;
        sr[c] = v;
        mx = fmaxf(mx, v);
      }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      const float m2 = fmaxf(m, mx);
      const float base = m2 == -INFINITY ? 0.0f : m2;  // all masked so far: every weight 0
      const float corr = expf(m - base);
      float sum = 0.0f;
      bf16* ph = Phw + r * L.p_ld + half * 32;
      bf16* pl = Plw + r * L.p_ld + half * 32;
      for (int c = 0; c < 32; ++c) {
        const float e = expf(sr[c] - base);  // a masked score gives 0
        sum += e;
        Split<TERMS>(e, ph + c, pl + c);
      }
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      l = l * corr + sum;
      m = m2;
      float* orow = Ow + r * L.o_ld + half * (L.vdp / 2);
      for (int c = 0; c < L.vdp / 2; ++c) orow[c] *= corr;
    }
    __syncwarp();

    // O += P V, 16 output columns at a time.
    for (int nt = 0; nt < L.vdp / 16; ++nt) {
      FragC acc;
      wmma::load_matrix_sync(acc, Ow + nt * 16, L.o_ld, wmma::mem_row_major);
      for (int kk = 0; kk < kKeys; kk += 16) {
        FragA a;
        FragBRow b;
        wmma::load_matrix_sync(a, Phw + kk, L.p_ld);
        wmma::load_matrix_sync(b, Vh + kk * L.v_ld + nt * 16, L.v_ld);
        wmma::mma_sync(acc, a, b, acc);
        if constexpr (TERMS > 1) {
          FragA al;
          FragBRow bl;
          wmma::load_matrix_sync(bl, Vl + kk * L.v_ld + nt * 16, L.v_ld);
          wmma::mma_sync(acc, a, bl, acc);
          wmma::load_matrix_sync(al, Plw + kk, L.p_ld);
          wmma::mma_sync(acc, al, b, acc);
        }
      }
      wmma::store_matrix_sync(Ow + nt * 16, acc, L.o_ld, wmma::mem_row_major);
    }
    __syncwarp();
  }

  // An empty key range ran no loop: its zeroed rows were written by other
  // lanes, so the warp syncs before each lane reads its row.
  __syncwarp();
  if (row >= n) return;
  const float* orow = Ow + r * L.o_ld;
  if (gridDim.z == 1) {
    float* o = out + ((static_cast<int64_t>(t0) + row) * q_heads + j) * vd;
    for (int64_t c = half; c < vd; c += 2) o[c] = orow[c] / l;
    return;
  }
  float* pb = part + ((static_cast<int64_t>(blockIdx.x) * q_heads + j) * gridDim.z + blockIdx.z) * PartFloats(L.vdp);
  for (int c = half; c < L.vdp; c += 2) pb[row * L.vdp + c] = orow[c];
  if (half == 0) {
    pb[kAttnTile * L.vdp + row] = m;
    pb[kAttnTile * L.vdp + kAttnTile + row] = l;
  }
#endif
}

// Merges the key ranges of each (tile, head): out = sum of each range's
// rows rescaled to the largest maximum, over the rescaled sums.
__global__ void TcMergeKernel(const float* part, const int32_t* tiles, int64_t q_heads, int64_t vd, int vdp, int splits,
                              float* out) {
  const int t0 = tiles[2 * blockIdx.x], n = tiles[2 * blockIdx.x + 1];
  const int64_t j = blockIdx.y;
  const int64_t stride = PartFloats(vdp);
  const float* base = part + (static_cast<int64_t>(blockIdx.x) * q_heads + j) * splits * stride;
  for (int64_t i = threadIdx.x; i < n * vd; i += blockDim.x) {
    const int r = static_cast<int>(i / vd);
    const int64_t c = i % vd;
    float mx = -INFINITY;
    for (int z = 0; z < splits; ++z) mx = fmaxf(mx, base[z * stride + kAttnTile * vdp + r]);
    float sum = 0.0f, acc = 0.0f;
    for (int z = 0; z < splits; ++z) {
      const float mz = base[z * stride + kAttnTile * vdp + r];
      if (mz == -INFINITY) continue;  // a range wholly after the row: nothing
      const float w = expf(mz - mx);
      sum += base[z * stride + kAttnTile * vdp + kAttnTile + r] * w;
      acc += base[z * stride + r * vdp + c] * w;
    }
    out[((static_cast<int64_t>(t0) + r) * q_heads + j) * vd + c] = acc / sum;
  }
}

}  // namespace

bool TcAttentionFits(int64_t q_dim, int64_t v_dim, int terms) {
  if (q_dim < 1 || v_dim < 1 || q_dim > kMaxHeadDim || v_dim > kMaxHeadDim || terms < 1 || terms > 2) return false;
  int device = 0, major = 0, limit = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess || major < 8) {
    return false;  // bfloat16 WMMA needs sm_80
  }
  if (cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess) return false;
  const uint32_t bytes = MakeLayout(q_dim, v_dim, terms).bytes;
  if (bytes > static_cast<uint32_t>(limit)) return false;
  // Above 48 KiB a kernel must opt in, per device: once here, at the rank's
  // start, not at every launch.
  const int want = static_cast<int>(bytes);
  auto opt_in = [want](const void* f) {
    return cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, want) == cudaSuccess;
  };
  return terms > 1 ? opt_in(reinterpret_cast<const void*>(TcAttentionKernel<2, true>)) &&
                         opt_in(reinterpret_cast<const void*>(TcAttentionKernel<2, false>))
                   : opt_in(reinterpret_cast<const void*>(TcAttentionKernel<1, true>)) &&
                         opt_in(reinterpret_cast<const void*>(TcAttentionKernel<1, false>));
}

int64_t TcAttentionScratchFloats(int64_t v_dim) { return kTcMaxPartials * PartFloats(Round16(v_dim)); }

void LaunchTcAttention(const float* q, const int32_t* tiles, int n_tiles, int64_t q_heads, int64_t head_start,
                       int64_t group, int64_t kv_head_start, int64_t q_dim, int64_t v_dim, float scale, int terms,
                       const TcSplit& split, float* scratch, const DevStepMeta& meta, const DevKvLayout& kv,
                       int64_t layer, float* out, Stream s) {
  if (n_tiles <= 0) return;
  auto* st = static_cast<cudaStream_t>(s);
  const TcLayout L = MakeLayout(q_dim, v_dim, terms);
  const int splits = split.splits > 1 && scratch ? split.splits : 1;
  const int64_t kps = splits > 1 ? split.keys_per_split : int64_t{1} << 40;
  const dim3 grid(static_cast<unsigned>(n_tiles), static_cast<unsigned>(q_heads), static_cast<unsigned>(splits));
  const bool vec4 = q_dim % 4 == 0 && v_dim % 4 == 0 && kv.head_dim % 4 == 0 &&
                    reinterpret_cast<uintptr_t>(kv.base) % 16 == 0;
  auto launch = [&](auto kernel) {
    kernel<<<grid, kThreads, L.bytes, st>>>(q, tiles, q_heads, head_start, group, kv_head_start, q_dim, v_dim, scale,
                                            meta, kv, layer, out, L, kps, scratch);
  };
  if (terms > 1) {
    vec4 ? launch(TcAttentionKernel<2, true>) : launch(TcAttentionKernel<2, false>);
  } else {
    vec4 ? launch(TcAttentionKernel<1, true>) : launch(TcAttentionKernel<1, false>);
  }
  if (splits > 1) {
    const dim3 merge(static_cast<unsigned>(n_tiles), static_cast<unsigned>(q_heads));
    TcMergeKernel<<<merge, 128, 0, st>>>(scratch, tiles, q_heads, v_dim, L.vdp, splits, out);
  }
}

}  // namespace wsup::engine::cuda
