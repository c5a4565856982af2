#include "supervisor/restart_throttle.h"

#include <algorithm>

namespace wsup {

std::string RestartDecision::Describe() const {
  switch (kind) {
    case Kind::kRestart:
      return "restart in " + std::to_string(delay_ms) + " ms (" + std::to_string(recent) + " in the window" +
             (crash_looping ? ", crash-looping" : "") + ")";
    case Kind::kGiveUp:
      return "not restarted: " + std::to_string(recent) + " restarts in the window";
    case Kind::kPermanent:
      return "not restarted: it exited with a permanent-failure code";
  }
  return "?";
}

RestartThrottle::RestartThrottle(RestartPolicy policy) : policy_(std::move(policy)) {
  policy_.max_restarts = std::max(1, policy_.max_restarts);
  policy_.backoff_ms = std::max<int64_t>(0, policy_.backoff_ms);
  policy_.backoff_max_ms = std::max(policy_.backoff_ms, policy_.backoff_max_ms);
  policy_.window_ms = std::max<int64_t>(0, policy_.window_ms);
}

bool RestartThrottle::IsPermanent(int exit_code) const {
  if (exit_code < 0) return false;
  return std::find(policy_.permanent_exit_codes.begin(), policy_.permanent_exit_codes.end(), exit_code) !=
         policy_.permanent_exit_codes.end();
}

void RestartThrottle::Prune(int64_t now_ms) {
  while (!restarts_.empty() && now_ms - restarts_.front() > policy_.window_ms) restarts_.pop_front();
  if (restarts_.empty()) {
    backoff_ms_ = 0;
    crash_looping_ = false;
  }
}

int RestartThrottle::Recent(int64_t now_ms) {
  Prune(now_ms);
  return static_cast<int>(restarts_.size());
}

RestartDecision RestartThrottle::OnExit(int64_t now_ms, int exit_code) {
  RestartDecision d;
  Prune(now_ms);
  if (IsPermanent(exit_code)) {
    d.kind = RestartDecision::Kind::kPermanent;
    d.recent = static_cast<int>(restarts_.size());
    return d;
  }
  if (static_cast<int>(restarts_.size()) >= policy_.max_restarts) {
    crash_looping_ = true;
    d.crash_looping = true;
    if (policy_.give_up) {
      d.kind = RestartDecision::Kind::kGiveUp;
      d.recent = static_cast<int>(restarts_.size());
      return d;
    }
  }
  // Quiet before this exit: restart at once. Otherwise double the delay.
  backoff_ms_ = restarts_.empty() ? 0
                                  : std::min(std::max(policy_.backoff_ms, backoff_ms_ * 2), policy_.backoff_max_ms);
  if (d.crash_looping) backoff_ms_ = policy_.backoff_max_ms;
  restarts_.push_back(now_ms);
  ++total_;
  d.kind = RestartDecision::Kind::kRestart;
  d.delay_ms = backoff_ms_;
  d.recent = static_cast<int>(restarts_.size());
  return d;
}

}  // namespace wsup
