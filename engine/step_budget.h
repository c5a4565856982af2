// StepBudget: how many prompt tokens the scheduler's next step may prefill
// so that the step stays within --max-step-ms.
//
// Why a time bound and not only a token bound: the token bound
// (max_step_tokens) says nothing about time. A chunk of 2,048 tokens is a
// few milliseconds of a small model on a GPU and a second of a large one
// on a CPU, and attention's cost grows with the chunk's position in its
// prompt. A step that runs long holds back every running stream's next
// token and the supervisor's probe with it; a probe that waits behind a
// long prompt makes a healthy engine look hung.
//
// The rule: the cost of a prompt token is learnt from the steps that ran.
// After a step with prefill, cost = the step's time / its prompt tokens. The
// whole step's time is charged to its prompt tokens, decode rows included,
// so the bound holds for the whole step, not only its prefill. The
// estimate:
//   - a cost higher than the previous step's goes on rising by as much
//     (the chunks of one long prompt sit ever further in it, and each
//     token's attention reads all before it: the next chunk is dearer);
//   - otherwise a cost above the estimate is taken at once, and one below
//     it halfway (one fast step is no promise).
// The next step then gets target / cost tokens, where the target is 90% of
// the bound (headroom for a step slower than the last), at least
// kMinChunk (a prompt always moves on) and at most max_tokens.
//
// Before any step has been measured the budget is kFirstChunk tokens: small
// enough to be cheap on any engine, and the first measurement then sizes
// the rest. With the bound off (0) the budget is max_tokens.
//
// Pure logic: the scheduler feeds it measured times (its EngineClock), so
// it is tested without a model or a clock.
#pragma once

#include <cstdint>

namespace wsup::engine {

class StepBudget {
 public:
  static constexpr int kMinChunk = 16;
  static constexpr int kFirstChunk = 64;

  // max_step_us 0: no time bound.
  StepBudget(int max_tokens, int64_t max_step_us);

  // Prompt tokens the next step may take (probes' first, then the others').
  int PrefillTokens() const;
  // A step that ran: how many prompt tokens it prefilled, and how long it
  // took (the forward pass alone, not a --min-step-ms wait).
  void Observe(int prefill_tokens, int64_t step_us);

  int64_t max_step_us() const { return max_step_us_; }
  // The learnt cost of one prompt token, microseconds (0 before any step).
  double us_per_token() const { return us_per_token_; }
  // Steps with prefill that took longer than the bound, and the longest
  // such step: a bound the engine cannot keep (even kMinChunk tokens take
  // longer) shows here.
  uint64_t over_bound() const { return over_bound_; }
  int64_t longest_prefill_step_us() const { return longest_us_; }

 private:
  int max_tokens_;
  int64_t max_step_us_;
  bool learnt_ = false;
  double us_per_token_ = 0;
  double last_cost_ = 0;  // the previous step's cost of a prompt token
  uint64_t over_bound_ = 0;
  int64_t longest_us_ = 0;
};

}  // namespace wsup::engine
