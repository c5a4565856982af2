// Time behind an interface, so that probes, backoff and timeouts can be
// driven by a fake clock in tests instead of by sleeping.
//
// Monotonic time is for intervals and deadlines; wall time only for what is
// shown to people or stored in the ledger.
#pragma once

#include <cstdint>

namespace wsup {

class Clock {
 public:
  virtual ~Clock() = default;
  // Milliseconds on a monotonic clock with an arbitrary origin.
  virtual int64_t MonotonicMs() const = 0;
  // Microseconds on a monotonic clock, for latency measurements.
  virtual int64_t MonotonicUs() const = 0;
  // Milliseconds since the Unix epoch.
  virtual int64_t WallMs() const = 0;
};

// The real clock (CLOCK_MONOTONIC, CLOCK_REALTIME). Stateless; one shared instance.
Clock& RealClock();

// A clock that moves only when told to. Not thread-safe: drive it from the test thread.
class FakeClock : public Clock {
 public:
  explicit FakeClock(int64_t start_ms = 1'000'000) : mono_us_(start_ms * 1000), wall_ms_(start_ms) {}
  int64_t MonotonicMs() const override { return mono_us_ / 1000; }
  int64_t MonotonicUs() const override { return mono_us_; }
  int64_t WallMs() const override { return wall_ms_; }
  void AdvanceMs(int64_t ms) {
    mono_us_ += ms * 1000;
    wall_ms_ += ms;
  }

 private:
  int64_t mono_us_;
  int64_t wall_ms_;
};

}  // namespace wsup
