// ModelRunner: all tensor-parallel ranks of one engine and the threads that
// drive them. Rank 0 runs on the caller's thread (the scheduler); ranks
// 1..N-1 each have a thread that waits for the next job. A step runs the
// same StepBatch on every rank; rank 0's logits are returned.
//
// Startup is split into the phases the engine times and reports:
// Create() binds weights, InitCommunicator() builds the group and proves it
// with one all-reduce, AllocateKv() sizes and touches the KV cache,
// Warmup() runs one forward pass.
//
// Ownership: the runner owns the weight sources, models, KV storage,
// communicators and rank threads. Threads: one thread (the scheduler) calls
// every method after Create().
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "common/status.h"
#include "engine/communicator.h"
#include "engine/model.h"
#include "engine/weights.h"

namespace wsup::engine {

struct RunnerOptions {
  int threads_per_rank = 0;  // 0: hardware threads / ranks
  std::chrono::milliseconds comm_timeout{30'000};
};

class ModelRunner {
 public:
  // weights[r] is rank r's shard; weights.size() is the tensor-parallel size.
  static Result<std::unique_ptr<ModelRunner>> Create(const ModelConfig& cfg,
                                                     std::vector<std::unique_ptr<WeightSource>> weights,
                                                     const RunnerOptions& opts);
  ~ModelRunner();

  Status InitCommunicator();
  // Same with communicators made elsewhere (one per rank, in rank order):
  // another transport, or a fault-injecting one in tests.
  Status InitCommunicator(std::vector<std::unique_ptr<Communicator>> comms);
  // Sizes the cache from the bytes each rank may use; refuses a budget that
  // holds no block.
  Status AllocateKv(uint64_t bytes_per_rank, int block_size);
  // One forward pass over a short dummy sequence (blocks 0.. of the cache).
  Status Warmup();

  // Runs batch on every rank; logits: logit_rows.size() x vocab.
  Status Step(const StepBatch& batch, std::vector<float>* logits);
  // A small all-reduce on every rank whose result is checked: proves the
  // ranks and the communicator are alive.
  Status Keepalive();

  int tp() const { return static_cast<int>(models_.size()); }
  const ModelDims& dims() const { return models_[0]->dims(); }
  int num_blocks() const { return kv_.empty() ? 0 : kv_[0]->num_blocks(); }
  int block_size() const { return kv_.empty() ? 0 : kv_[0]->block_size(); }
  uint64_t kv_bytes_per_rank() const { return kv_bytes_; }
  const char* comm_kind() const { return comms_.empty() ? "none" : comms_[0]->kind(); }
  const WeightSource& weights(int rank) const { return *weights_[static_cast<size_t>(rank)]; }

 private:
  ModelRunner() = default;
  // Runs fn(rank) on every rank at once (rank 0 here); the first error wins.
  Status OnAllRanks(const std::function<Status(int)>& fn);
  void RankLoop(int rank);

  RunnerOptions opts_;
  std::vector<std::unique_ptr<WeightSource>> weights_;
  std::vector<std::unique_ptr<RankModel>> models_;
  std::vector<std::unique_ptr<Communicator>> comms_;
  std::vector<std::unique_ptr<KvStorage>> kv_;
  std::vector<std::vector<float>> rank_logits_;
  uint64_t kv_bytes_ = 0;

  // Rank threads (1..N-1) and their job hand-off.
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable job_cv_, done_cv_;
  const std::function<Status(int)>* job_ = nullptr;
  uint64_t job_gen_ = 0;
  int pending_ = 0;
  std::vector<Status> results_;
  bool stop_ = false;
};

}  // namespace wsup::engine
