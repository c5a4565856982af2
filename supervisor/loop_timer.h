// Timers behind an interface, so that the supervisor's delays (restart
// back-off, status polls, drain polls, stop budgets, link retries) can be
// driven by a fake clock in tests instead of by the loop's real time.
//
// Timer: one-shot or repeating; a callback never runs after Stop() or
// destruction, and the owner may destroy a timer from inside its own
// callback. TimerSource makes them: LoopTimers on a libuv loop in
// production, timers that fire when a test advances its FakeClock in tests.
//
// LoopTimer: the uv_timer_t lives on the heap and is freed in its close
// callback, so the owner may be destroyed at any time (the destructor closes
// the timer). Loop thread only.
#pragma once

#include <uv.h>

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

class LoopTimer final : public Timer {
 public:
  explicit LoopTimer(uv_loop_t* loop);
  ~LoopTimer() override;
  LoopTimer(const LoopTimer&) = delete;
  LoopTimer& operator=(const LoopTimer&) = delete;

  void Start(int64_t delay_ms, std::function<void()> cb, int64_t repeat_ms = 0) override;
  void Stop() override;
  bool active() const override;

 private:
  struct Box {
    uv_timer_t handle;
    std::function<void()> cb;
  };
  Box* box_;
};

// LoopTimers on one loop.
class LoopTimerSource final : public TimerSource {
 public:
  explicit LoopTimerSource(uv_loop_t* loop) : loop_(loop) {}
  std::unique_ptr<Timer> Make() override { return std::make_unique<LoopTimer>(loop_); }

 private:
  uv_loop_t* loop_;
};

}  // namespace wsup
