// Model runners on the CPU from the test data (the smallest, llama-tiny-f32,
// is what the scheduler tests drive), and what those tests collect from a
// scheduler's sink.
#pragma once

#include <catch2/catch.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "engine/runner.h"
#include "engine/scheduler.h"
#include "engine/weights.h"
#include "testkit/test_util.h"

namespace wsup::engine::testing {

// How CpuRunner makes a runner; zeros keep RunnerOptions' defaults.
struct CpuRunnerOptions {
  int tp = 1;                // ranks, each with its shard of the weights
  int threads = 1;           // per rank
  int max_batch = 0;         // RunnerOptions::max_batch
  int max_step_tokens = 0;   // RunnerOptions::max_step_tokens
  uint64_t kv_bytes = 0;     // per rank; 0: no KV cache allocated
  int block_size = 16;       // of the KV cache
};

// A CPU runner of a test-data model, weights read from disk: the float32
// reference the other backends' tests compare against.
inline std::unique_ptr<ModelRunner> CpuRunner(const std::string& model, const CpuRunnerOptions& c = {}) {
  auto ckpt = Checkpoint::Open(test::TestData(model));
  REQUIRE(ckpt.ok());
  std::vector<std::unique_ptr<WeightSource>> w;
  for (int r = 0; r < c.tp; ++r) {
    auto src = LoadWeightsFromDisk(*ckpt, ShardSpec{c.tp, r}, 2);
    if (!src.ok()) FAIL(src.error().ToString());
    w.push_back(std::move(*src));
  }
  RunnerOptions o;
  o.threads_per_rank = c.threads;
  if (c.max_batch > 0) o.max_batch = c.max_batch;
  if (c.max_step_tokens > 0) o.max_step_tokens = c.max_step_tokens;
  auto runner = ModelRunner::Create(ckpt->config(), std::move(w), o);
  if (!runner.ok()) FAIL(runner.error().ToString());
  REQUIRE((*runner)->InitCommunicator().ok());
  if (c.kv_bytes > 0) REQUIRE((*runner)->AllocateKv(c.kv_bytes, c.block_size).ok());
  return std::move(*runner);
}

// The smallest: llama-tiny-f32, one rank on one thread, no KV cache.
inline std::unique_ptr<ModelRunner> TinyRunner() { return CpuRunner("llama-tiny-f32"); }

// Collects what a scheduler's sink says, per request, for the test thread.
struct SchedulerEvents {
  std::mutex mu;
  std::map<uint64_t, std::vector<int32_t>> tokens;
  std::map<uint64_t, std::string> finished;  // the finish reason of every request done
  std::map<uint64_t, std::string> errors;    // the error of every request that ended in one
  Scheduler::Sink Sink() {
    return [this](std::vector<GenEvent> events) {
      std::lock_guard<std::mutex> lk(mu);
      for (auto& e : events) {
        auto& t = tokens[e.id];
        t.insert(t.end(), e.tokens.begin(), e.tokens.end());
        if (e.done) finished[e.id] = e.finish_reason;
        if (e.error) errors[e.id] = e.error->message();
      }
    };
  }
  // How many requests are done.
  size_t done() {
    std::lock_guard<std::mutex> lk(mu);
    return finished.size();
  }
  bool Done(uint64_t id) {
    std::lock_guard<std::mutex> lk(mu);
    return finished.count(id) > 0;
  }
  std::vector<int32_t> Tokens(uint64_t id) {
    std::lock_guard<std::mutex> lk(mu);
    return tokens[id];
  }
};

}  // namespace wsup::engine::testing
