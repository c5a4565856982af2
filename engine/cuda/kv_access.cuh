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

// What a tiled attention block (blockIdx.x a tile, blockIdx.y a query
// head) reads first: its tile's tokens, its KV head and its sequence's
// block table.
struct TileHead {
  int t0 = 0, n = 0;       // the tile's first step token and its count
  int64_t j = 0;           // the query head (local)
  int64_t kvh = 0;         // the KV head it reads (local)
  int64_t p0 = 0;          // the first token's position
  int64_t last = 0;        // the tile's last query position: the last key any row reads
  const int32_t* table = nullptr;
};

__device__ __forceinline__ TileHead ReadTileHead(const int32_t* tiles, int64_t head_start, int64_t group,
                                                 int64_t kv_head_start, const DevStepMeta& meta) {
  TileHead h;
  h.t0 = tiles[2 * blockIdx.x];
  h.n = tiles[2 * blockIdx.x + 1];
  h.j = blockIdx.y;
  h.kvh = (head_start + h.j) / group - kv_head_start;
  h.p0 = meta.positions[h.t0];
  h.last = h.p0 + h.n - 1;
  h.table = meta.block_table + static_cast<int64_t>(meta.seq[h.t0]) * meta.max_blocks;
  return h;
}

}  // namespace wsup::engine::cuda
