#include "engine/clock.h"

#include <algorithm>
#include <chrono>

namespace wsup::engine {

namespace {

class SteadyClock : public EngineClock {
 public:
  int64_t NowUs() const override {
    return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  void WaitUntilMs(std::condition_variable& cv, std::unique_lock<std::mutex>& lk,
                   int64_t deadline_ms) const override {
    cv.wait_until(lk, std::chrono::steady_clock::time_point(std::chrono::milliseconds(deadline_ms)));
  }
};

}  // namespace

const EngineClock& SteadyEngineClock() {
  static const SteadyClock clock;
  return clock;
}

int64_t FakeEngineClock::NowUs() const {
  std::lock_guard<std::mutex> g(mu_);
  return now_us_;
}

void FakeEngineClock::WaitUntilMs(std::condition_variable& cv, std::unique_lock<std::mutex>& lk,
                                  int64_t deadline_ms) const {
  // The time is read after the waiter is listed, under mu_: an AdvanceMs()
  // either sees it listed (and takes its mutex before notifying, so the
  // notify cannot fall between this check and the wait), or ran before
  // the read, which then sees the new time.
  {
    std::lock_guard<std::mutex> g(mu_);
    if (now_us_ / 1000 >= deadline_ms) return;
    waiters_.push_back(Waiter{&cv, lk.mutex()});
  }
  cv.wait(lk);
  std::lock_guard<std::mutex> g(mu_);
  auto it = std::find_if(waiters_.begin(), waiters_.end(),
                         [&](const Waiter& w) { return w.cv == &cv && w.mu == lk.mutex(); });
  if (it != waiters_.end()) waiters_.erase(it);
}

void FakeEngineClock::AdvanceMs(int64_t ms) {
  std::vector<Waiter> wake;
  {
    std::lock_guard<std::mutex> g(mu_);
    now_us_ += ms * 1000;
    wake = waiters_;
  }
  // Each waiter's mutex is held across its notify (see WaitUntilMs), and
  // mu_ is not: a waiter takes mu_ while it holds its own.
  for (const Waiter& w : wake) {
    std::lock_guard<std::mutex> g(*w.mu);
    w.cv->notify_all();
  }
}

}  // namespace wsup::engine
