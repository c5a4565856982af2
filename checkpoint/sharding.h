// Tensor- and expert-parallel sharding rules: which slice of each checkpoint
// tensor a rank holds.
//
// The rules for an architecture are its descriptor's tensors
// (checkpoint/architecture/: name pattern -> split), so another architecture
// is one more descriptor. Llama family:
//   q/k/v/gate/up projections: split on the output dimension (dim 0, rows);
//   o/down projections: split on the input dimension (dim 1, columns);
//   embed_tokens and lm_head: split on the vocabulary dimension (dim 0);
//   norms: replicated.
// Block-FP8 scales (`*.weight_scale_inv`, one per 128x128 block) are split
// with their weights; a split that would cut through a block is refused.
// When tp exceeds the number of KV heads, k/v are replicated so that each
// rank holds whole heads (rank r holds head r * kv_heads / tp).
//
// Mixture of experts (Qwen3-MoE, DeepSeek-V3): attention as above (DeepSeek's
// multi-head latent attention: q_a/kv_a projections and their norms
// replicated, q_b/kv_b split by heads on their rows, o_proj by heads on its
// columns); the router (mlp.gate) and its e_score_correction_bias
// replicated; shared experts and dense layers like a Llama MLP. Routed
// experts (mlp.experts.E.*) either follow tensor parallelism (each expert's
// intermediate dimension split like a dense MLP) or, with ep_size > 1, are
// partitioned whole: rank r holds experts [r*E/ep, (r+1)*E/ep) unsplit and
// none of the others (their tensors are absent from its plan). ep_size is
// either 1 or tp_size, with ep_rank = tp_rank (attention stays split by
// tp). A MoE checkpoint is checked against its config.json before planning:
// every sparse layer has a router [num_experts, hidden], every expert's
// three matrices of the expected shape and (DeepSeek-V3) a score
// correction bias [num_experts].
//
// At tp_size 1 every tensor is planned kReplicate (held whole), whatever the
// architecture. A refusal says which tensor, which dimension, why, and the tp
// sizes the checkpoint can use instead.
//
// Pure functions over a Checkpoint; ReadShard only preads, so many threads
// may read shards of one Checkpoint at once. Row slices are one pread; column
// slices a few large preads through a bounded bounce buffer (or one per row
// when each row's part is large).
#pragma once

#include <string>
#include <vector>

#include "checkpoint/architecture/architecture.h"
#include "checkpoint/checkpoint.h"
#include "common/status.h"

namespace wsup {

struct ShardSpec {
  int tp_size = 1;
  int tp_rank = 0;
  int ep_size = 1;  // 1, or tp_size: routed experts partitioned whole across the ranks
  int ep_rank = 0;  // tp_rank when ep_size > 1
};

// One tensor as a rank holds it: a rectangular slice of a source tensor.
struct ShardedTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;  // the rank's local shape
  size_t source;               // index into Checkpoint::tensors()
  Split split;
  int64_t start = 0;           // first row (kRows) or column (kCols) taken from the source
  uint64_t nbytes = 0;
};

// Plans the rank's slice of every tensor it holds (under expert parallelism
// the other ranks' experts are left out), in checkpoint order, or refuses with an Error naming the
// tensor and why (for example a split through an FP8 block).
Result<std::vector<ShardedTensor>> PlanShards(const Checkpoint& ckpt, const ShardSpec& spec);

// Reads the rank's slice of `t` from the checkpoint into dst (t.nbytes bytes).
Status ReadShard(const Checkpoint& ckpt, const ShardedTensor& t, void* dst);

}  // namespace wsup
