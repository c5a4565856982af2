#include "probes/hysteresis.h"

#include <algorithm>

#include "common/enum_names.h"

namespace wsup {

const char* HealthName(Health h) {
  static constexpr EnumNames<Health::kUnhealthy> kNames{"unknown", "healthy", "unhealthy"};
  return kNames(h);
}

HealthTracker::HealthTracker(const HysteresisOptions& options, const Clock& clock)
    : options_(options), clock_(clock), state_(options.initial), rng_(options.seed) {
  options_.failures = std::max(1, options_.failures);
  options_.successes = std::max(1, options_.successes);
  options_.interval_ms = std::max<int64_t>(0, options_.interval_ms);
  options_.jitter_ms = std::max<int64_t>(0, options_.jitter_ms);
}

HealthTransition HealthTracker::Flip(Health to, std::string cause) {
  HealthTransition t{state_, to, std::move(cause), clock_.WallMs()};
  state_ = to;
  return t;
}

std::optional<HealthTransition> HealthTracker::Record(const ProbeOutcome& outcome) {
  ++probes_;
  last_ = outcome;
  if (outcome.ok) {
    ++successes_;
    failures_ = 0;
    if (state_ == Health::kUnknown) return Flip(Health::kHealthy, "first probe passed");
    if (state_ == Health::kUnhealthy && successes_ >= options_.successes)
      return Flip(Health::kHealthy, std::to_string(successes_) + " consecutive probe successes");
    return std::nullopt;
  }
  ++failures_;
  successes_ = 0;
  if (state_ != Health::kUnhealthy && failures_ >= options_.failures) {
    std::string what = failures_ == 1 ? "1 probe failure" : std::to_string(failures_) + " consecutive probe failures";
    return Flip(Health::kUnhealthy, what + "; last: " + outcome.reason);
  }
  return std::nullopt;
}

int64_t HealthTracker::NextDelayMs() {
  if (options_.jitter_ms == 0) return options_.interval_ms;
  // splitmix64: tiny, fast, and the same on every platform (unlike the
  // standard distributions), so a seed always gives the same delays.
  rng_ += 0x9E3779B97F4A7C15ull;
  uint64_t z = rng_;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return options_.interval_ms + static_cast<int64_t>(z % static_cast<uint64_t>(options_.jitter_ms + 1));
}

}  // namespace wsup
