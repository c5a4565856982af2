// Device-side access to the KV cache layout of engine/cuda/kernels.h,
// shared by the kernels that write it (kernels.cu) and read it
// (kernels.cu, attention.cu). CUDA only: included from .cu files.
#pragma once

#include <cstdint>

#include "engine/cuda/kernels.h"

namespace wsup::engine::cuda {

// Row `off` (a position within the block) of head `head`'s k (which 0) or
// v (which 1) slots in `block`, for `layer`: kv.head_dim floats.
__device__ __forceinline__ float* KvAt(const DevKvLayout& kv, int32_t block, int64_t layer, int which, int64_t head,
                                       int64_t off) {
  return kv.base + ((((static_cast<int64_t>(block) * kv.layers + layer) * 2 + which) * kv.kv_heads + head) *
                        kv.block_size +
                    off) *
                       kv.head_dim;
}

}  // namespace wsup::engine::cuda
