// LogLimiter: lets a message that can repeat at a timer's pace through at
// most once per interval, and counts what it held back, so that a log says
// "412 more since" instead of 412 lines (a front with hedge_after_ms = 5
// once wrote eleven thousand identical warnings in a minute).
//
// Pure: the caller passes the time (its loop's clock). One owner; not
// thread-safe.
#pragma once

#include <cstdint>

namespace wsup {

class LogLimiter {
 public:
  explicit LogLimiter(int64_t interval_ms) : interval_ms_(interval_ms) {}

  // True when the message may be logged at now_ms; *held_back then gets how
  // many were held back since the last one let through (0 otherwise).
  bool Allow(int64_t now_ms, uint64_t* held_back) {
    if (seen_ && now_ms - last_ms_ < interval_ms_) {
      ++held_;
      return false;
    }
    seen_ = true;
    last_ms_ = now_ms;
    if (held_back) *held_back = held_;
    held_ = 0;
    return true;
  }

 private:
  int64_t interval_ms_;
  int64_t last_ms_ = 0;
  bool seen_ = false;
  uint64_t held_ = 0;
};

}  // namespace wsup
