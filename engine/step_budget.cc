#include "engine/step_budget.h"

#include <algorithm>
#include <cmath>

namespace wsup::engine {

StepBudget::StepBudget(int max_tokens, int64_t max_step_us)
    : max_tokens_(std::max(1, max_tokens)), max_step_us_(std::max<int64_t>(0, max_step_us)) {}

int StepBudget::PrefillTokens() const {
  if (max_step_us_ == 0) return max_tokens_;
  const int floor = std::min(kMinChunk, max_tokens_);
  if (!learnt_) return std::min(kFirstChunk, max_tokens_);
  if (us_per_token_ <= 0) return max_tokens_;
  const double fit = 0.9 * static_cast<double>(max_step_us_) / us_per_token_;
  if (fit >= max_tokens_) return max_tokens_;
  return std::max(floor, static_cast<int>(std::floor(fit)));
}

void StepBudget::Observe(int prefill_tokens, int64_t step_us) {
  if (prefill_tokens <= 0 || step_us < 0) return;
  if (step_us > max_step_us_ && max_step_us_ > 0) ++over_bound_;
  longest_us_ = std::max(longest_us_, step_us);
  const double cost = static_cast<double>(step_us) / prefill_tokens;
  // See the header: a rising cost goes on rising, a higher one is taken at
  // once, a lower one halfway.
  if (!learnt_) {
    us_per_token_ = cost;
  } else if (cost >= last_cost_) {
    us_per_token_ = cost + (cost - last_cost_);
  } else {
    us_per_token_ = cost >= us_per_token_ ? cost : (us_per_token_ + cost) / 2;
  }
  last_cost_ = cost;
  learnt_ = true;
}

}  // namespace wsup::engine
