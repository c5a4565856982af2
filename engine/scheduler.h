// Scheduler: continuous batching on one thread. Requests are queued by the
// HTTP loop (Submit, never blocking on model work); the scheduler thread
// admits them as KV blocks allow, and each step runs, in one forward pass,
// the prompt tokens of newly admitted sequences and the next token of every
// running one. New tokens leave through the Sink after each step, which the
// server hands back to its loop with uv_async.
//
// KV cache: paged, blocks of block_size positions. A sequence reserves all
// the blocks it can need (prompt + max_tokens) when admitted, so a running
// sequence never waits for memory; a request that could never fit is
// refused at Submit() with a message saying how much fits.
//
// Between steps (and while idle) the scheduler runs the communicator
// keepalive every keepalive_ms and records its outcome.
//
// Threads: Submit, Cancel and stats() from any thread; the Sink is called
// on the scheduler thread. The runner is used only by the scheduler thread
// once Start() has run.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "common/status.h"
#include "engine/runner.h"

namespace wsup::engine {

struct SchedulerOptions {
  int max_batch = 64;          // sequences in one step
  int max_step_tokens = 2048;  // prompt tokens per step; longer prompts are split over steps
  int max_waiting = 1024;      // queued requests beyond which Submit() refuses
  int64_t keepalive_ms = 1000;
};

struct GenRequest {
  uint64_t id = 0;
  std::vector<int32_t> prompt;
  int max_tokens = 16;
  double temperature = 0;  // 0: greedy
  uint64_t seed = 0;
  std::vector<int32_t> stop_tokens;  // end-of-sequence ids
};

struct GenEvent {
  uint64_t id = 0;
  std::vector<int32_t> tokens;  // new since the previous event
  bool done = false;
  std::string finish_reason;    // when done: "length" or "stop"
  std::optional<Error> error;   // when done by failure
};

struct SchedulerStats {
  bool running = false;
  int active = 0;
  int waiting = 0;
  int free_blocks = 0;
  int total_blocks = 0;
  uint64_t steps = 0;
  uint64_t generated_tokens = 0;
  uint64_t finished = 0;   // requests that ran to their end (length, stop or error)
  uint64_t cancelled = 0;  // requests dropped by Cancel() while waiting or running (their client left)
  // Communicator keepalive.
  bool comm_ok = true;
  std::string comm_error;
  uint64_t keepalives = 0;
  uint64_t keepalive_failures = 0;
  int64_t last_keepalive_mono_ms = 0;  // when the last one succeeded (steady clock)
  int64_t last_keepalive_us = 0;       // how long it took
};

class Scheduler {
 public:
  using Sink = std::function<void(std::vector<GenEvent>)>;

  Scheduler(ModelRunner* runner, SchedulerOptions opts, Sink sink);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  void Start();
  // Stops the thread; requests still queued or running get no more events.
  void Stop();

  // Queues a request. InvalidArgument when it can never fit (context or KV
  // cache), Unavailable when the queue is full or the communicator failed.
  Status Submit(GenRequest req);
  // Drops a request (its client went away); its blocks are freed at once.
  void Cancel(uint64_t id);

  SchedulerStats stats() const;
  // Positions one sequence may use: the model's context, bounded by the KV cache.
  int64_t max_sequence_tokens() const;

 private:
  struct Seq {
    GenRequest req;
    std::vector<int32_t> blocks;
    size_t prefilled = 0;              // prompt tokens already in the cache
    std::vector<int32_t> generated;
    std::mt19937_64 rng;
  };

  void Loop();
  void RunKeepalive();
  void Admit();
  void StepOnce();
  void Finish(Seq& s, std::vector<GenEvent>* events, std::string reason, std::optional<Error> error = {});
  int32_t Sample(Seq& s, const float* logits);
  int BlocksFor(int64_t tokens) const;

  ModelRunner* runner_;
  SchedulerOptions opts_;
  Sink sink_;
  std::thread thread_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::deque<GenRequest> incoming_;
  std::unordered_set<uint64_t> cancels_;
  SchedulerStats stats_;

  // Scheduler thread only.
  std::deque<Seq> waiting_;
  std::vector<Seq> active_;
  std::vector<int32_t> free_blocks_;
  int64_t next_keepalive_ms_ = 0;
  uint64_t finished_ = 0;
  uint64_t cancelled_ = 0;
  std::vector<float> logits_;
};

}  // namespace wsup::engine
