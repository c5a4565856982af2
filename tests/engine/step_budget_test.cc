// The step bound's arithmetic (engine/step_budget.h): the first chunk, the
// learnt cost of a prompt token and how it moves, the floor and the
// ceiling; then a simulated engine whose prompt tokens grow dearer along a
// long prompt, as attention makes them, prefilled within the bound.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>

#include "engine/step_budget.h"

using wsup::engine::StepBudget;

TEST_CASE("step budget: 64 tokens first, then 90% of the bound over the learnt cost, within 16 and the token bound") {
  StepBudget b(2048, 50'000);
  CHECK(b.PrefillTokens() == 64);
  CHECK(b.us_per_token() == 0);
  b.Observe(64, 6'400);  // 100 us a token: 45 ms / 100 us
  CHECK(b.PrefillTokens() == 450);
  CHECK(b.over_bound() == 0);
  // Dearer than the step before: the rise goes on (200 + 100).
  b.Observe(450, 90'000);
  CHECK(b.us_per_token() == 300);
  CHECK(b.PrefillTokens() == 150);
  CHECK(b.over_bound() == 1);
  CHECK(b.longest_prefill_step_us() == 90'000);
  // Cheaper: halfway down (300 -> 200), then again (200 -> 125).
  b.Observe(150, 15'000);
  CHECK(b.PrefillTokens() == 225);
  b.Observe(225, 11'250);
  CHECK(b.us_per_token() == 125);
  CHECK(b.PrefillTokens() == 360);
  // A step with no prefill teaches nothing.
  b.Observe(0, 1'000'000);
  CHECK(b.PrefillTokens() == 360);
  CHECK(b.over_bound() == 1);
  // An engine too slow for the bound still moves a prompt on.
  b.Observe(16, 1'600'000);
  CHECK(b.PrefillTokens() == StepBudget::kMinChunk);
  CHECK(b.over_bound() == 2);

  // A fast engine gets the token bound.
  StepBudget fast(2048, 50'000);
  fast.Observe(64, 64);
  CHECK(fast.PrefillTokens() == 2048);
  // A token bound under the first chunk.
  StepBudget small(8, 50'000);
  CHECK(small.PrefillTokens() == 8);
  // The bound off: the token bound, and nothing is over it.
  StepBudget off(2048, 0);
  off.Observe(2048, 1'000'000'000);
  CHECK(off.PrefillTokens() == 2048);
  CHECK(off.over_bound() == 0);
}

namespace {

// A simulated engine: a fixed cost per step, and each prompt token's cost
// growing with its position. Prefills one prompt of `tokens` under a
// budget; returns the steps it took, the longest, and how many went over.
struct Prefill {
  int steps = 0;
  int64_t longest_us = 0;
  uint64_t over = 0;
};
Prefill Simulate(StepBudget& b, int tokens, double fixed_us, double us_per_token, double us_per_position) {
  Prefill p;
  for (int pos = 0; pos < tokens;) {
    const int k = std::min(b.PrefillTokens(), tokens - pos);
    double us = fixed_us;
    for (int j = 0; j < k; ++j) us += us_per_token + us_per_position * (pos + j);
    b.Observe(k, static_cast<int64_t>(us));
    p.longest_us = std::max(p.longest_us, static_cast<int64_t>(us));
    pos += k;
    ++p.steps;
  }
  p.over = b.over_bound();
  return p;
}

}  // namespace

TEST_CASE("step budget: a 32k prompt whose tokens grow dearer along it is prefilled within the bound") {
  // 2 ms a step, 5 us a token at its start, 70 us at 32k.
  StepBudget b(2048, 50'000);
  Prefill p = Simulate(b, 32'768, 2'000, 5, 0.002);
  INFO("steps " << p.steps << ", longest " << p.longest_us << " us");
  CHECK(p.over == 0);
  CHECK(p.longest_us <= 50'000);
  // And not by crawling: 1.24 s of token work is 25 steps of 50 ms; within
  // 1.6x of that.
  CHECK(p.steps <= 40);
  // A second prompt on the same engine starts from what was learnt (dearer
  // than its start): still within the bound.
  Prefill q = Simulate(b, 8'192, 2'000, 5, 0.002);
  CHECK(q.over == 0);

  // An engine that turns twice as slow (another process took its cores):
  // at most one step over, then back within.
  StepBudget c(2048, 100'000);
  Simulate(c, 4'096, 1'000, 40, 0);
  Prefill slower = Simulate(c, 8'192, 2'000, 80, 0);
  CHECK(slower.over <= 1);
  CHECK(slower.longest_us <= 200'000);
}
