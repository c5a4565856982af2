// Communicator: the collectives a tensor-parallel rank needs: a sum over
// ranks (after the row-split projections o_proj and down_proj, and for the
// vocab-split embedding) and a gather (vocab-split logits).
//
// Implementations: in-process, where ranks are threads of one engine
// (--device cpu --tp N), through shared memory; NCCL for CUDA devices later.
// One communicator per rank, created at startup even with one rank and kept
// warm by the scheduler's keepalive.
//
// Every rank must call the same collectives in the same order. A rank that
// does not arrive within the group's timeout breaks the group: every later
// call fails fast with the same error, which the engine reports in status
// and /health.
//
// Threads: each Communicator is used by its rank's thread only.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <vector>

#include "common/status.h"

namespace wsup::engine {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* kind() const = 0;  // "threads", "nccl"

  // data[0..n) becomes the element-wise sum over ranks; every rank gets
  // bit-identical results.
  virtual Status AllReduceSum(float* data, size_t n) = 0;
  // out[r * n .. r * n + n) = rank r's in[0..n), for every r; out holds size() * n.
  virtual Status AllGather(const float* in, size_t n, float* out) = 0;
};

// `size` communicators over one shared group, one per rank (index = rank).
std::vector<std::unique_ptr<Communicator>> MakeInProcessGroup(int size, std::chrono::milliseconds timeout);

}  // namespace wsup::engine
