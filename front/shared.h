// FrontShared: what the front's worker loops must agree on, kept in one
// place that every loop reads and writes without a lock on its hot path.
//
// The front runs several loops (front/worker.h), each with its own client
// connections, calls and engine connections. Two things are not per loop:
//   - the silence of an engine: "the active engine sent no byte on any
//     request for hedge_after_ms while at least two requests waited" is a
//     statement about all requests, not one loop's share of them;
//   - the hedge budget: hedge_percent and hedge_burst bound the front's
//     hedges, not each loop's.
// So each engine has one SharedBackend record (made on first use, never
// freed while the front lives; engines are named by routes, a handful), and
// the budget is one atomic bucket.
//
// Threads: every member is safe from any thread. Records are looked up under
// a mutex once per route change; after that, only atomics.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

namespace wsup::front {

struct SharedBackend {
  std::atomic<int64_t> last_byte_ms{0};       // wall time of its latest byte on any loop (0: none seen)
  std::atomic<int64_t> last_byte_loop_ms{0};  // the same in loop time (every loop reads one monotonic clock)
  std::atomic<int64_t> hedge_win_ms{0};       // wall time of its first hedge win since the active last spoke
  std::atomic<bool> silent_reported{false};   // a `silent` event went out and it has not spoken since
  // The loops' latest counts of requests waiting on it as active, and of
  // those silent for hedge_after_ms: each loop adds the change since its
  // last hedge tick, so the sums are over all loops.
  std::atomic<int> waiting{0};
  std::atomic<int> silent{0};

  // A byte arrived from this engine. Stores only what changed: every loop
  // calls this for every chunk, and a store to a shared line costs more
  // than a load.
  void Spoke(int64_t wall_ms, int64_t loop_ms) {
    if (last_byte_ms.load(std::memory_order_relaxed) < wall_ms)
      last_byte_ms.store(wall_ms, std::memory_order_relaxed);
    if (last_byte_loop_ms.load(std::memory_order_relaxed) < loop_ms) {
      last_byte_loop_ms.store(loop_ms, std::memory_order_relaxed);
    }
    if (silent_reported.load(std::memory_order_relaxed))
      silent_reported.store(false, std::memory_order_relaxed);
  }
};

class FrontShared {
 public:
  // The record for an engine "HOST:PORT"; the same pointer for the same name.
  SharedBackend* Backend(const std::string& name) {
    std::lock_guard<std::mutex> lock(mu_);
    auto& slot = backends_[name];
    if (!slot) slot = std::make_unique<SharedBackend>();
    return slot.get();
  }

  // The hedge bucket, in hundredths of a hedge so that one request earns
  // hedge_percent of them exactly.
  void EarnHedge(int percent, int burst) {
    const int64_t cap = int64_t{burst} * 100;
    int64_t cur = hedge_hundredths_.load(std::memory_order_relaxed);
    while (cur < cap && !hedge_hundredths_.compare_exchange_weak(cur, std::min(cap, cur + percent),
                                                                 std::memory_order_relaxed)) {
    }
  }
  bool TakeHedge() {
    int64_t cur = hedge_hundredths_.load(std::memory_order_relaxed);
    while (cur >= 100) {
      if (hedge_hundredths_.compare_exchange_weak(cur, cur - 100, std::memory_order_relaxed)) return true;
    }
    return false;
  }
  // Hedging turned on: the bucket starts full. Settings changed: it holds at most the new burst.
  void FillHedges(int burst) { hedge_hundredths_.store(int64_t{burst} * 100, std::memory_order_relaxed); }
  void CapHedges(int burst) {
    const int64_t cap = int64_t{burst} * 100;
    int64_t cur = hedge_hundredths_.load(std::memory_order_relaxed);
    while (cur > cap && !hedge_hundredths_.compare_exchange_weak(cur, cap, std::memory_order_relaxed)) {
    }
  }
  double hedge_budget() const { return static_cast<double>(hedge_hundredths_.load(std::memory_order_relaxed)) / 100.0; }

 private:
  std::mutex mu_;
  std::map<std::string, std::unique_ptr<SharedBackend>> backends_;
  std::atomic<int64_t> hedge_hundredths_{0};
};

}  // namespace wsup::front
