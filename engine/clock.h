// EngineClock: the time the scheduler reads and waits on, behind an
// interface so that its timed decisions (the communicator keepalive, how
// long a resumed request waits for the pool, how long a dead engine's pages
// are kept, the shortest step) are tested with a fake clock instead of by
// sleeping.
//
// Times are on a monotonic clock. The real one is std::chrono's steady
// clock, so its readings compare with the engine's MonoMs() (GET
// /wsup/status subtracts the last keepalive's time from it).
//
// Waiting: the scheduler sleeps on its own condition variable (Submit and
// the pool's thread wake it), bounded by this clock's deadline; the fake
// clock wakes such a waiter when it is advanced past the deadline.
//
// Thread-safety: every member may be called from any thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

namespace wsup::engine {

class EngineClock {
 public:
  virtual ~EngineClock() = default;
  // Microseconds on a monotonic clock with an arbitrary origin.
  virtual int64_t NowUs() const = 0;
  int64_t NowMs() const { return NowUs() / 1000; }
  // Waits on cv (lk held, on cv's mutex) until a notify or until this
  // clock reads deadline_ms or later. May return early: callers check
  // their condition and the time again.
  virtual void WaitUntilMs(std::condition_variable& cv, std::unique_lock<std::mutex>& lk,
                           int64_t deadline_ms) const = 0;
};

// The steady clock. Stateless; one shared instance.
const EngineClock& SteadyEngineClock();

// A clock that moves only when a test advances it. A waiter whose deadline
// an AdvanceMs() reaches is woken by it (no real time passes in between);
// whoever waits on the clock must outlive an AdvanceMs() in flight.
class FakeEngineClock : public EngineClock {
 public:
  explicit FakeEngineClock(int64_t start_ms = 1'000'000) : now_us_(start_ms * 1000) {}
  int64_t NowUs() const override;
  void WaitUntilMs(std::condition_variable& cv, std::unique_lock<std::mutex>& lk, int64_t deadline_ms) const override;
  void AdvanceMs(int64_t ms);

 private:
  struct Waiter {
    std::condition_variable* cv;
    std::mutex* mu;
  };
  mutable std::mutex mu_;  // after a waiter's own mutex, never before
  int64_t now_us_;
  mutable std::vector<Waiter> waiters_;
};

}  // namespace wsup::engine
