// The smallest real model runner the scheduler tests drive: llama-tiny-f32
// from the test data, one rank on one thread, weights read from disk; and
// what those tests collect from a scheduler's sink.
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

inline std::unique_ptr<ModelRunner> TinyRunner() {
  auto ckpt = Checkpoint::Open(test::TestData("llama-tiny-f32"));
  REQUIRE(ckpt.ok());
  std::vector<std::unique_ptr<WeightSource>> w;
  auto src = LoadWeightsFromDisk(*ckpt, ShardSpec{1, 0}, 2);
  REQUIRE(src.ok());
  w.push_back(std::move(*src));
  RunnerOptions o;
  o.threads_per_rank = 1;
  auto runner = ModelRunner::Create(ckpt->config(), std::move(w), o);
  REQUIRE(runner.ok());
  REQUIRE((*runner)->InitCommunicator().ok());
  return std::move(*runner);
}

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
