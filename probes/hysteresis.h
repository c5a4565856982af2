// HealthTracker: turns a stream of probe outcomes into a health verdict with
// hysteresis, and draws the jittered delay before the next probe.
//
//   unknown   --success-->                      healthy
//   unknown   --`failures` failures in a row--> unhealthy
//   healthy   --`failures` failures in a row--> unhealthy
//   unhealthy --`successes` successes in a row--> healthy
//
// So one bad answer never flips a healthy engine (unless failures == 1), and
// one good answer never brings back an unhealthy one (unless successes == 1).
// A new engine starts `unknown`; its first good answer proves it healthy.
// Every transition carries its cause: the counts and the last failure.
//
// Delays are interval_ms plus a uniform draw from [0, jitter_ms], so probes
// of several engines (and nodes) spread out instead of arriving in step. The
// draw comes from a small generator seeded by the caller, so tests (and a
// replay of an incident) see the same delays every time.
//
// Pure logic: no I/O, no timers. Time comes from the injected Clock (only
// to stamp transitions). Not thread-safe: the owner's thread (the loop).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"

namespace wsup {

enum class Health { kUnknown, kHealthy, kUnhealthy };
const char* HealthName(Health h);  // "unknown", "healthy", "unhealthy"

// A semantic probe's answer: what the engine generated.
struct ProbeAnswer {
  std::vector<int64_t> token_ids;  // empty when the engine sent none
  std::string text;
  std::string finish_reason;       // "length", "stop", ...; "" when not sent
  bool operator==(const ProbeAnswer& o) const {
    return token_ids == o.token_ids && text == o.text && finish_reason == o.finish_reason;
  }
};

// The result of one probe.
struct ProbeOutcome {
  bool ok = false;
  std::string reason;      // why it failed ("" when ok)
  int64_t latency_ms = 0;  // from start to verdict
  // A well-formed completion that is not the expected one ("wrong
  // answer: ..."): what the engine answered. Absent for every other
  // outcome (a pass, no answer, an error, a malformed answer).
  std::optional<ProbeAnswer> wrong_answer;
};

struct HysteresisOptions {
  int failures = 3;          // consecutive failures that trip (>= 1)
  int successes = 2;         // consecutive successes that recover (>= 1)
  int64_t interval_ms = 1000;
  int64_t jitter_ms = 0;     // each delay adds a uniform draw from [0, jitter_ms]
  uint64_t seed = 1;         // for the jitter draws
  Health initial = Health::kUnknown;
};

struct HealthTransition {
  Health from = Health::kUnknown;
  Health to = Health::kUnknown;
  std::string cause;   // "3 consecutive probe failures; last: timeout after 800 ms"
  int64_t at_ms = 0;   // clock.WallMs() when it happened
};

class HealthTracker {
 public:
  HealthTracker(const HysteresisOptions& options, const Clock& clock);

  // Counts one outcome; returns the transition it caused, if any.
  std::optional<HealthTransition> Record(const ProbeOutcome& outcome);

  // The delay before the next probe: interval_ms + jitter.
  int64_t NextDelayMs();

  Health state() const { return state_; }
  int consecutive_failures() const { return failures_; }
  int consecutive_successes() const { return successes_; }
  int64_t probes() const { return probes_; }
  const ProbeOutcome& last() const { return last_; }
  const HysteresisOptions& options() const { return options_; }

 private:
  HealthTransition Flip(Health to, std::string cause);

  HysteresisOptions options_;
  const Clock& clock_;
  Health state_;
  int failures_ = 0;
  int successes_ = 0;
  int64_t probes_ = 0;
  uint64_t rng_;
  ProbeOutcome last_;
};

}  // namespace wsup
