// RestartThrottle: when to restart a child that exited, and when to stop
// trying. One policy for every kind of child the supervisor runs (engines,
// holders, the front), so a crash loop looks and behaves the same whatever
// crashed.
//
//   - A child that exits with one of the policy's permanent-failure codes
//     is not restarted: the same command would fail the same way (s6's
//     "do not restart me" exit, systemd's RestartPreventExitStatus).
//   - The first restart after a quiet period is immediate: that is the
//     re-arm of a standby, or a holder coming back from its kept fds.
//   - Restarts within window_ms of each other back off, doubling from
//     backoff_ms up to backoff_max_ms.
//   - max_restarts restarts within window_ms means a crash loop. With
//     give_up the throttle says so and the child stays down (the node is
//     degraded); without it (the front: nothing serves without it) the
//     child keeps being restarted at backoff_max_ms and the loop is reported.
//
// Pure logic over monotonic milliseconds passed in by the caller: tests
// drive it with any clock. Loop thread only.
#pragma once

#include <cstdint>
#include <deque>
#include <initializer_list>
#include <string>
#include <vector>

namespace wsup {

struct RestartPolicy {
  int64_t backoff_ms = 1000;
  int64_t backoff_max_ms = 30'000;
  int max_restarts = 5;
  int64_t window_ms = 600'000;
  bool give_up = true;
  std::vector<int> permanent_exit_codes;
};

struct RestartDecision {
  enum class Kind {
    kRestart,    // restart after delay_ms
    kGiveUp,     // a crash loop: leave the child down
    kPermanent,  // it exited with a permanent-failure code: leave it down
  };
  Kind kind = Kind::kRestart;
  int64_t delay_ms = 0;
  int recent = 0;             // restarts within the window, this one included
  bool crash_looping = false; // recent reached max_restarts (kRestart without give_up, or kGiveUp)
  std::string Describe() const;
};

class RestartThrottle {
 public:
  explicit RestartThrottle(RestartPolicy policy = {});

  // The child exited at now_ms (monotonic). `exit_code` is its code when it
  // exited normally and the code is known, else -1. Records the restart it
  // allows.
  RestartDecision OnExit(int64_t now_ms, int exit_code);

  // Restarts within the window ending at now_ms.
  int Recent(int64_t now_ms);
  // Every restart this throttle allowed.
  uint64_t total() const { return total_; }
  bool crash_looping() const { return crash_looping_; }
  const RestartPolicy& policy() const { return policy_; }
  // A new policy (a reload) for what comes next; the restarts seen so far
  // still count.
  void set_policy(RestartPolicy policy) { policy_ = std::move(policy); }
  bool IsPermanent(int exit_code) const;

 private:
  void Prune(int64_t now_ms);

  RestartPolicy policy_;
  std::deque<int64_t> restarts_;  // monotonic ms of the restarts within the window
  int64_t backoff_ms_ = 0;
  uint64_t total_ = 0;
  bool crash_looping_ = false;
};

}  // namespace wsup
