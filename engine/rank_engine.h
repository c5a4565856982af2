// RankEngine: one tensor-parallel rank of the model on one device, with its
// KV cache and its communicator. The runner drives every rank the same way
// whatever computes it: the CPU reference kernels (RankModel over host
// weights) or the CUDA path (engine/cuda/), so the scheduler, the startup
// phases and the keepalive are shared.
//
// Threads: each rank is driven by one thread at a time (the runner's rank
// thread); nothing here is shared between ranks except the communicator
// group.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/unique_fd.h"
#include "engine/kv_memory.h"
#include "engine/model.h"

namespace wsup::engine {

class RankEngine {
 public:
  virtual ~RankEngine() = default;
  virtual const ModelDims& dims() const = 0;
  // "cpu" or "cuda:N".
  virtual std::string device_name() const = 0;

  // Bytes of one KV block of block_size positions on this rank.
  virtual uint64_t KvBlockBytes(int block_size) const = 0;
  // Allocates (and touches) the cache at the layout's block ids
  // (engine/kv_memory.h), and the step buffers for batches of up to
  // max_tokens tokens from up to max_seqs sequences.
  virtual Status AllocateKv(const KvLayout& layout, int max_tokens, int max_seqs) = 0;
  // Maps the node's KV pool (one fd per allocation of the layout's pool)
  // over the layout's pool span; the fds stay the caller's.
  virtual Status MapKvPool(const std::vector<UniqueFd>& fds) = 0;
  // Lets the pool go, once every step that used it has finished on the
  // device (this waits for that).
  virtual Status UnmapKvPool() = 0;
  // The cache's memory (null before AllocateKv()): for what may be done
  // to it off the rank's thread (KvMemory::PreparePool) and its timings.
  virtual KvMemory* kv_memory() = 0;

  // One forward step; logits gets logit_rows.size() x vocab floats.
  virtual Status Forward(const StepBatch& batch, std::vector<float>* logits) = 0;

  // Sums v[0..n) (host floats) over the ranks through this rank's
  // communicator; the keepalive's collective.
  virtual Status AllReduceHost(float* v, size_t n) = 0;

  // Prepares the replayable decode steps (CUDA graphs) for batches of up to
  // max_batch sequences; returns how many were captured (0 on the CPU).
  virtual Result<int> CaptureGraphs(int max_batch) { return 0; }
  // Steps run from a captured graph, and eagerly.
  virtual uint64_t graph_steps() const { return 0; }
  virtual uint64_t eager_steps() const { return 0; }
};

}  // namespace wsup::engine
