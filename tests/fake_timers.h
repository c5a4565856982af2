// Timers for in-process tests (the front's and the supervisor's logic): they
// fire when the test moves a FakeClock (common/clock.h) with Advance(), in
// deadline order, each at its own time, or when it calls FireDue() after
// moving the clock itself. Nothing sleeps; a test that forgets to advance
// sees nothing fire.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <set>

#include "common/clock.h"
#include "common/timer.h"

namespace wsup::testing {

class FakeTimers final : public TimerSource {
 public:
  explicit FakeTimers(FakeClock* clock) : clock_(clock) {}

  class T final : public Timer {
   public:
    explicit T(FakeTimers* src) : src_(src) { src_->all_.insert(this); }
    ~T() override { src_->all_.erase(this); }
    void Start(int64_t delay_ms, std::function<void()> cb, int64_t repeat_ms) override {
      due_ = src_->clock_->MonotonicMs() + std::max<int64_t>(0, delay_ms);
      repeat_ = repeat_ms;
      cb_ = std::move(cb);
      armed_ = true;
    }
    void Stop() override { armed_ = false; }
    bool active() const override { return armed_; }

    FakeTimers* src_;
    int64_t due_ = 0, repeat_ = 0;
    std::function<void()> cb_;
    bool armed_ = false;
  };

  std::unique_ptr<Timer> Make() override { return std::make_unique<T>(this); }

  // Moves the clock forward by `ms`, stopping at each deadline on the way
  // to fire the timers due then. Returns how many callbacks ran.
  int Advance(int64_t ms) {
    const int64_t end = clock_->MonotonicMs() + ms;
    int fired = 0;
    for (;;) {
      T* next = nullptr;
      for (T* t : all_) {
        if (t->armed_ && t->due_ <= end && (!next || t->due_ < next->due_)) next = t;
      }
      if (!next) break;
      if (next->due_ > clock_->MonotonicMs()) clock_->AdvanceMs(next->due_ - clock_->MonotonicMs());
      auto cb = next->cb_;
      if (next->repeat_ > 0) {
        next->due_ += next->repeat_;
      } else {
        next->armed_ = false;
      }
      cb();  // may destroy timers or arm others
      ++fired;
    }
    if (end > clock_->MonotonicMs()) clock_->AdvanceMs(end - clock_->MonotonicMs());
    return fired;
  }
  size_t armed() const {
    return static_cast<size_t>(std::count_if(all_.begin(), all_.end(), [](T* t) { return t->armed_; }));
  }

  // The earliest armed deadline, or -1.
  int64_t NextDue() const {
    int64_t best = -1;
    for (T* t : all_) {
      if (t->armed_ && (best < 0 || t->due_ < best)) best = t->due_;
    }
    return best;
  }
  // Fires the timers due by now (each may arm others).
  bool FireDue() {
    for (T* t : all_) {
      if (t->armed_ && t->due_ <= clock_->MonotonicMs()) {
        auto cb = t->cb_;
        if (t->repeat_ > 0) {
          t->due_ += t->repeat_;
        } else {
          t->armed_ = false;
        }
        cb();  // may destroy t and change all_: restart the scan
        return true;
      }
    }
    return false;
  }

 private:
  friend class T;
  FakeClock* clock_;
  std::set<T*> all_;
};

}  // namespace wsup::testing
