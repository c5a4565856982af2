// LoopTimer: a one-shot or repeating libuv timer owned by one object.
//
// The uv_timer_t lives on the heap and is freed in its close callback, so
// the owner may be destroyed at any time (the destructor closes the timer);
// a callback never runs after Stop() or destruction. Loop thread only.
#pragma once

#include <uv.h>

#include <cstdint>
#include <functional>

namespace wsup {

class LoopTimer {
 public:
  explicit LoopTimer(uv_loop_t* loop);
  ~LoopTimer();
  LoopTimer(const LoopTimer&) = delete;
  LoopTimer& operator=(const LoopTimer&) = delete;

  // (Re)arms the timer: cb runs after delay_ms, then every repeat_ms if > 0.
  void Start(int64_t delay_ms, std::function<void()> cb, int64_t repeat_ms = 0);
  void Stop();
  bool active() const;

 private:
  struct Box {
    uv_timer_t handle;
    std::function<void()> cb;
  };
  Box* box_;
};

}  // namespace wsup
