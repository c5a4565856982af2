#include "http/loop_timer.h"

namespace wsup {

LoopTimer::LoopTimer(uv_loop_t* loop) : box_(new Box) {
  uv_timer_init(loop, &box_->handle);
  box_->handle.data = box_;
}

LoopTimer::~LoopTimer() {
  uv_timer_stop(&box_->handle);
  box_->cb = nullptr;
  uv_close(reinterpret_cast<uv_handle_t*>(&box_->handle),
           [](uv_handle_t* h) { delete static_cast<Box*>(h->data); });
}

void LoopTimer::Start(int64_t delay_ms, std::function<void()> cb, int64_t repeat_ms) {
  box_->cb = std::move(cb);
  uv_timer_start(
      &box_->handle,
      [](uv_timer_t* t) {
        auto* b = static_cast<Box*>(t->data);
        // Copy: the callback may re-arm the timer and replace b->cb.
        auto cb = b->cb;
        if (cb) cb();
      },
      static_cast<uint64_t>(delay_ms < 0 ? 0 : delay_ms), static_cast<uint64_t>(repeat_ms < 0 ? 0 : repeat_ms));
}

void LoopTimer::Stop() { uv_timer_stop(&box_->handle); }

bool LoopTimer::active() const { return uv_is_active(reinterpret_cast<const uv_handle_t*>(&box_->handle)); }

}  // namespace wsup
