// ModelRunner: all tensor-parallel ranks of one engine and the threads that
// drive them. Rank 0 runs on the caller's thread (the scheduler); ranks
// 1..N-1 each have a thread that waits for the next job. A step runs the
// same StepBatch on every rank; rank 0's logits are returned.
//
// Ranks compute on the CPU (RankModel, an in-process communicator) or on
// GPUs, one per rank (engine/cuda/, NCCL); RunnerOptions::devices decides.
//
// Startup is split into the phases the engine times and reports:
// Create() binds weights, InitCommunicator() builds the group and proves it
// with one all-reduce, AllocateKv() sizes and touches the KV cache,
// CaptureGraphs() records the decode steps (CUDA), Warmup() runs one
// forward pass.
//
// Ownership: the runner owns the weight sources, ranks, communicators and
// rank threads. Threads: one thread (the scheduler) calls every method after
// Create().
#pragma once

#include <atomic>
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
#include "engine/rank_engine.h"
#include "engine/weights.h"

namespace wsup::engine {

struct RunnerOptions {
  int threads_per_rank = 0;  // 0: usable CPUs (affinity) / ranks (CPU)
  std::chrono::milliseconds comm_timeout{30'000};
  // Cuda ordinal of each rank; empty: every rank on the CPU.
  std::vector<int> devices;
  // Expert parallelism: 1, or the tp size (each rank's weights then hold
  // whole experts, the holder's --ep-size partition).
  int ep = 1;
  // The largest step the scheduler makes: GPU step buffers are sized for
  // max_step_tokens + max_batch tokens of up to max_batch sequences.
  int max_step_tokens = 2048;
  int max_batch = 64;
  // GPU ranks: the float32 scratch for products over narrower weights
  // (engine/cuda/cuda_engine.h MakeCudaRank).
  uint64_t dequant_scratch_bytes = 32ull << 20;
  // GPU ranks: wide products over bfloat16 weights take the activations
  // in one bfloat16 term instead of two (CudaRankOptions).
  bool bf16_activations = false;
  // CudaRankOptions::float32_attention.
  bool float32_attention = false;
  // GPU ranks: the channels each NCCL communicator sets up (each has its
  // buffers); 0: one for a single rank (it only carries the keepalive),
  // NCCL's choice otherwise.
  int nccl_max_ctas = 0;
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
  // another transport, or a fault-injecting one in tests (CPU ranks only).
  Status InitCommunicator(std::vector<std::unique_ptr<Communicator>> comms);
  // A private cache of the bytes each rank may use; refuses a budget that
  // holds no block.
  Status AllocateKv(uint64_t bytes_per_rank, int block_size);
  // A cache over the node's KV pool (engine/kv_memory.h): each rank's
  // pool allocation sizes (the same on every rank) and the scratch each
  // rank keeps of its own. Nothing of the pool is mapped yet.
  Status AllocatePooledKv(const std::vector<std::vector<uint64_t>>& pool_allocations, uint64_t scratch_bytes_per_rank,
                          int block_size);
  // Maps the pool on every rank (fds[r]: rank r's, one per allocation), or
  // on none. From any one thread, also while a step runs, as long as no
  // block of the pool is in that step (the scheduler hands them out only
  // once this returned).
  Status MapKvPool(const std::vector<std::vector<UniqueFd>>& fds);
  // Lets the pool go on every rank, after the device work that used it.
  // Between steps only, and only once no sequence holds a pool block.
  Status UnmapKvPool();
  // Imports every rank's pool without mapping it (KvMemory::PreparePool),
  // so that a MapKvPool() of the same fds only maps; on any thread, beside
  // steps. On an error nothing stays prepared.
  Status PrepareKvPool(const std::vector<std::vector<UniqueFd>>& fds);
  void DropPreparedKvPool();
  // Bytes of rank 0's mapped pool (the KV journal, wire/kv_journal.h: block
  // ids are the same on every rank, so one journal describes them all).
  // The scheduler's thread, between steps.
  Status WriteKvPool(uint64_t offset, const void* data, size_t n);
  Status ReadKvPool(uint64_t offset, void* out, size_t n);
  // The last MapKvPool()'s parts, summed over the ranks (mapped one after
  // another); prepared only if every rank's import was.
  KvMemory::MapTimes last_kv_map_times();
  // Captures the decode steps as CUDA graphs; returns how many (0 on the CPU).
  Result<int> CaptureGraphs();
  // One forward pass over a short dummy sequence (blocks 0.. of the cache).
  Status Warmup();

  // Runs batch on every rank; logits: logit_rows.size() x vocab.
  Status Step(const StepBatch& batch, std::vector<float>* logits);
  // A small all-reduce on every rank whose result is checked: proves the
  // ranks and the communicator are alive.
  Status Keepalive();

  int tp() const { return static_cast<int>(ranks_.size()); }
  bool on_gpu() const { return !opts_.devices.empty(); }
  const ModelDims& dims() const { return ranks_[0]->dims(); }
  // Block ids the scheduler may hand out are below num_blocks(); which of
  // them are usable now is the layout's and the pool's business.
  int num_blocks() const { return layout_.id_count(); }
  int block_size() const { return layout_.block_size; }
  const KvLayout& kv_layout() const { return layout_; }
  bool kv_pool_mapped() const { return pool_mapped_.load(); }
  const char* comm_kind() const;
  // Rank 0's step counts: replayed from a graph, and eager.
  uint64_t graph_steps() const { return ranks_[0]->graph_steps(); }
  uint64_t eager_steps() const { return ranks_[0]->eager_steps(); }
  // Wall time spent inside Step() (all ranks, until the logits are on the
  // host), and the number of steps: the rest of a request's time is the
  // scheduler's and the HTTP server's.
  double step_ms_total() const { return step_ms_total_.load(); }
  uint64_t steps() const { return steps_.load(); }
  const WeightSource& weights(int rank) const { return *weights_[static_cast<size_t>(rank)]; }

 private:
  ModelRunner() = default;
  // Runs fn(rank) on every rank at once (rank 0 here); the first error wins.
  Status OnAllRanks(const std::function<Status(int)>& fn);
  void RankLoop(int rank);

  RunnerOptions opts_;
  std::vector<std::unique_ptr<WeightSource>> weights_;
  std::vector<std::unique_ptr<RankEngine>> ranks_;
  bool comm_ready_ = false;
  std::vector<std::vector<float>> rank_logits_;
  Status AllocateKv(const KvLayout& layout);
  KvLayout layout_;
  std::atomic<bool> pool_mapped_{false};
  std::atomic<double> step_ms_total_{0};
  std::atomic<uint64_t> steps_{0};

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
