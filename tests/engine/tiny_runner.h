// The smallest real model runner the scheduler tests drive: llama-tiny-f32
// from the test data, one rank on one thread, weights read from disk.
#pragma once

#include <catch2/catch.hpp>

#include <memory>
#include <utility>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "engine/runner.h"
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

}  // namespace wsup::engine::testing
