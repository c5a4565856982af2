#include "engine/kernels.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

namespace wsup::engine {

namespace {

std::array<float, 256> MakeE4M3Table() {
  std::array<float, 256> t{};
  for (int v = 0; v < 256; ++v) {
    const int sign = v >> 7;
    const int exp = (v >> 3) & 0xf;
    const int man = v & 0x7;
    float f;
    if (exp == 0xf && man == 0x7) {
      f = std::nanf("");
    } else if (exp == 0) {
      f = std::ldexp(static_cast<float>(man) / 8.0f, -6);  // subnormal
    } else {
      f = std::ldexp(1.0f + static_cast<float>(man) / 8.0f, exp - 7);
    }
    t[v] = sign ? -f : f;
  }
  return t;
}

const std::array<float, 256> kE4M3 = MakeE4M3Table();

// Rows per parallel task: enough to amortize the hand-off, few enough to
// spread a 256-row matrix over a handful of threads.
constexpr int64_t kRowsPerTask = 16;

}  // namespace

float Bf16ToFloat(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

float F16ToFloat(uint16_t v) {
  const uint32_t sign = static_cast<uint32_t>(v & 0x8000) << 16;
  const uint32_t exp = (v >> 10) & 0x1f;
  const uint32_t man = v & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {
      // Subnormal: value = man * 2^-24, exactly representable in float.
      float f = std::ldexp(static_cast<float>(man), -24);
      return sign ? -f : f;
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);  // inf or NaN
  } else {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

float Fp8E4M3ToFloat(uint8_t v) { return kE4M3[v]; }
const float* Fp8E4M3Table() { return kE4M3.data(); }

bool KernelSupports(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kBF16 || dtype == DType::kF16 || dtype == DType::kF8E4M3;
}

void LoadRow(const MatrixRef& m, int64_t r, float* dst) {
  const int64_t n = m.cols;
  switch (m.dtype) {
    case DType::kF32:
      std::memcpy(dst, static_cast<const float*>(m.data) + r * n, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::kBF16: {
      const uint16_t* src = static_cast<const uint16_t*>(m.data) + r * n;
      for (int64_t i = 0; i < n; ++i) {
        uint32_t bits = static_cast<uint32_t>(src[i]) << 16;
        std::memcpy(&dst[i], &bits, sizeof(float));
      }
      return;
    }
    case DType::kF16: {
      const uint16_t* src = static_cast<const uint16_t*>(m.data) + r * n;
      for (int64_t i = 0; i < n; ++i) dst[i] = F16ToFloat(src[i]);
      return;
    }
    case DType::kF8E4M3: {
      const uint8_t* src = static_cast<const uint8_t*>(m.data) + r * n;
      const float* table = kE4M3.data();
      if (!m.block_scale) {
        for (int64_t i = 0; i < n; ++i) dst[i] = table[src[i]];
        return;
      }
      const int64_t scale_cols = (n + m.block_cols - 1) / m.block_cols;
      const float* scales = m.block_scale + (r / m.block_rows) * scale_cols;
      for (int64_t b = 0; b < scale_cols; ++b) {
        const float s = scales[b];
        const int64_t end = std::min(n, (b + 1) * m.block_cols);
        for (int64_t i = b * m.block_cols; i < end; ++i) dst[i] = table[src[i]] * s;
      }
      return;
    }
    default:
      // Refused when the model binds its weights (KernelSupports); never reached.
      std::fill(dst, dst + n, 0.0f);
      return;
  }
}

namespace {

// Eight float lanes as one value. The compiler lowers the arithmetic to
// the vector width of the target (two SSE registers on the x86-64 baseline, one
// AVX register in the avx2 clones below); each lane is its own running sum,
// so the order of every addition, and so every result, is the same on any
// target. No clone enables FMA: a fused multiply-add would round
// differently from the baseline.
typedef float V8 __attribute__((vector_size(32)));

// An AVX2 clone beside the baseline one, picked at load time by the CPU
// (an ifunc); other architectures get their compiler's baseline.
#if defined(__x86_64__) && defined(__GNUC__)
#define WSUP_KERNEL_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define WSUP_KERNEL_CLONES
#endif

// By reference: a vector passed by value would change the ABI between the
// clones.
inline void Load8(const float* p, V8& v) { std::memcpy(&v, p, sizeof v); }

// The lanes summed pairwise, in the order every Dot result has used.
inline float Sum8(const V8& s, float tail) {
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7])) + tail;
}

}  // namespace

WSUP_KERNEL_CLONES float Dot(const float* a, const float* b, int64_t n) {
  // Eight independent sums (one per lane) keep the vector unit busy.
  V8 s = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    V8 av, bv;
    Load8(a + i, av);
    Load8(b + i, bv);
    s += av * bv;
  }
  float tail = 0;
  for (; i < n; ++i) tail += a[i] * b[i];
  return Sum8(s, tail);
}

namespace {

// Four weight rows against kB (1 or 2) rows of x in one pass over the
// weights: 4 x nb dot products. Each sum runs in exactly Dot()'s order, so a
// result does not depend on whether it was computed alone or in a group.
template <int kB>
inline void Dot4xB(const float* const w[4], const float* const x[kB], int64_t n, float* const out[kB]) {
  V8 s[kB][4] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    V8 xv[kB];
    for (int b = 0; b < kB; ++b) Load8(x[b] + i, xv[b]);
    for (int r = 0; r < 4; ++r) {
      V8 wv;
      Load8(w[r] + i, wv);
      for (int b = 0; b < kB; ++b) s[b][r] += wv * xv[b];
    }
  }
  for (int b = 0; b < kB; ++b) {
    for (int r = 0; r < 4; ++r) {
      float tail = 0;
      for (int64_t j = i; j < n; ++j) tail += w[r][j] * x[b][j];
      out[b][r] = Sum8(s[b][r], tail);
    }
  }
}

// A group of up to four weight rows against every row of the batch.
WSUP_KERNEL_CLONES void RowsTimesBatch(const float* const w[4], int64_t g, const float* x, int64_t batch,
                                       int64_t cols, float* y, int64_t rows, int64_t o) {
  int64_t b = 0;
  if (g == 4) {
    for (; b + 2 <= batch; b += 2) {
      const float* xs[2] = {x + b * cols, x + (b + 1) * cols};
      float* ys[2] = {y + b * rows + o, y + (b + 1) * rows + o};
      Dot4xB<2>(w, xs, cols, ys);
    }
    for (; b < batch; ++b) {
      const float* xs[1] = {x + b * cols};
      float* ys[1] = {y + b * rows + o};
      Dot4xB<1>(w, xs, cols, ys);
    }
    return;
  }
  for (; b < batch; ++b) {
    for (int64_t k = 0; k < g; ++k) y[b * rows + o + k] = Dot(w[k], x + b * cols, cols);
  }
}

}  // namespace

void MatMulT(const MatrixRef& m, const float* x, int64_t batch, float* y, ThreadPool& pool) {
  const int64_t rows = m.rows, cols = m.cols;
  const int64_t tasks = (rows + kRowsPerTask - 1) / kRowsPerTask;
  pool.ParallelFor(tasks, [&](int64_t task) {
    // Converted rows of this group; each is read from the weights once per
    // call and then used against every row of the batch.
    thread_local std::vector<float> buf;
    if (m.dtype != DType::kF32 && static_cast<int64_t>(buf.size()) < 4 * cols) buf.resize(static_cast<size_t>(4 * cols));
    const int64_t begin = task * kRowsPerTask;
    const int64_t end = std::min(rows, begin + kRowsPerTask);
    for (int64_t o = begin; o < end; o += 4) {
      const int64_t g = std::min<int64_t>(4, end - o);
      const float* w[4];
      for (int64_t k = 0; k < g; ++k) {
        if (m.dtype == DType::kF32) {
          w[k] = static_cast<const float*>(m.data) + (o + k) * cols;
        } else {
          LoadRow(m, o + k, buf.data() + k * cols);
          w[k] = buf.data() + k * cols;
        }
      }
      RowsTimesBatch(w, g, x, batch, cols, y, rows, o);
    }
  });
}

void RmsNorm(const float* x, const float* weight, int64_t n, float eps, float* out) {
  float ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const float inv = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = weight[i] * (x[i] * inv);
}

void ApplyRope(float* head, int64_t head_dim, int64_t pos, const float* inv_freq) {
  const int64_t half = head_dim / 2;
  for (int64_t j = 0; j < half; ++j) {
    const float angle = static_cast<float>(pos) * inv_freq[j];
    const float c = std::cos(angle), s = std::sin(angle);
    const float a = head[j], b = head[j + half];
    head[j] = a * c - b * s;
    head[j + half] = b * c + a * s;
  }
}

std::vector<float> RopeInvFreq(int64_t head_dim, double theta) {
  std::vector<float> f(static_cast<size_t>(head_dim / 2));
  const float base = static_cast<float>(theta);
  for (int64_t i = 0; i < head_dim / 2; ++i) {
    const float e = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    f[static_cast<size_t>(i)] = 1.0f / std::pow(base, e);
  }
  return f;
}

float Silu(float x) { return x / (1.0f + std::exp(-x)); }

}  // namespace wsup::engine
