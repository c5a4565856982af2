// OneShots: "run this once, after ms" on a TimerSource, for owners that
// schedule many small follow-ups (a reply polled until its rows are on
// disk, work moved off a callback) and should not keep a Timer member for
// each. Every pending one is stopped when the OneShots is destroyed, so a
// callback never runs on an owner that is gone.
//
// Threads: the TimerSource's (the loop thread in the supervisor).
#pragma once

#include <cstdint>
#include <functional>
#include <iterator>
#include <list>
#include <memory>
#include <utility>

#include "common/timer.h"

namespace wsup {

class OneShots {
 public:
  explicit OneShots(TimerSource& timers) : timers_(timers) {}
  OneShots(const OneShots&) = delete;
  OneShots& operator=(const OneShots&) = delete;

  // Runs cb once after ms. cb may call After() again.
  void After(int64_t ms, std::function<void()> cb) {
    pending_.push_back(timers_.Make());
    auto it = std::prev(pending_.end());
    (*it)->Start(ms, [this, it, cb = std::move(cb)] {
      auto keep = cb;  // the lambda holding cb is freed with its timer below
      pending_.erase(it);
      keep();
    });
  }

  // How many have not run yet.
  size_t pending() const { return pending_.size(); }

 private:
  TimerSource& timers_;
  std::list<std::unique_ptr<Timer>> pending_;
};

}  // namespace wsup
