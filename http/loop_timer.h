// Timers on a libuv loop (common/timer.h's interface): what the supervisor
// and the front use in production.
//
// LoopTimer: the uv_timer_t lives on the heap and is freed in its close
// callback, so the owner may be destroyed at any time (the destructor closes
// the timer). Loop thread only.
#pragma once

#include <uv.h>

#include <cstdint>
#include <functional>
#include <memory>

#include "common/timer.h"

namespace wsup {

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
