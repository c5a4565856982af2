// Timers behind an interface, so that delays (restart back-off, polls, queue
// timeouts, hedging scans) can be driven by a fake clock in tests instead of
// by a loop's real time.
//
// Timer: one-shot or repeating; a callback never runs after Stop() or
// destruction, and the owner may destroy a timer from inside its own
// callback. A TimerSource makes them: http/loop_timer.h on a libuv loop in
// production, timers that fire when a test advances its FakeClock in tests.
// Kept free of libuv so that pure logic can hold timers.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

namespace wsup {

class Timer {
 public:
  virtual ~Timer() = default;
  // (Re)arms the timer: cb runs after delay_ms, then every repeat_ms if > 0.
  virtual void Start(int64_t delay_ms, std::function<void()> cb, int64_t repeat_ms = 0) = 0;
  virtual void Stop() = 0;
  virtual bool active() const = 0;
};

class TimerSource {
 public:
  virtual ~TimerSource() = default;
  virtual std::unique_ptr<Timer> Make() = 0;
};

}  // namespace wsup
