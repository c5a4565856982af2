// HealthMonitor: runs one Probe against one engine on a libuv loop, again
// and again, feeds the outcomes to a HealthTracker, and reports each
// transition (healthy <-> unhealthy) with its cause.
//
// Probes never overlap: the next starts a jittered interval after the
// previous one's verdict. The first starts at once on Start().
//
// Ownership: the monitor owns its Probe and one timer handle (heap-held, so
// it outlives the monitor until its close callback). Stop() cancels the
// probe in flight (its outcome is dropped) and closes the timer; `done` runs
// from the timer's close callback. The destructor stops a running monitor;
// the loop must run afterwards for the close callback to free the timer.
// Callbacks may call Stop(), but must not destroy the monitor (do that from
// Stop()'s `done`, or later). Threads: the loop thread only.
#pragma once

#include <uv.h>

#include <functional>
#include <memory>

#include "probes/hysteresis.h"
#include "probes/probe.h"

namespace wsup {

class HealthMonitor {
 public:
  using TransitionCallback = std::function<void(const HealthTransition&)>;
  using OutcomeCallback = std::function<void(const ProbeOutcome&)>;

  HealthMonitor(uv_loop_t* loop, std::unique_ptr<Probe> probe, const HysteresisOptions& options, const Clock& clock,
                TransitionCallback on_transition, OutcomeCallback on_outcome = {});
  ~HealthMonitor();
  HealthMonitor(const HealthMonitor&) = delete;
  HealthMonitor& operator=(const HealthMonitor&) = delete;

  void Start();
  void Stop(std::function<void()> done = {});
  // Another check of the same engine starts now (the supervisor's proof of
  // a promoted engine, sent through the front): the next probe waits at
  // least `delay_ms` from now, so that the two do not share the engine and
  // slow each other (a request that comes mid-generation adds its prompt's
  // step to the other's). A probe in flight is left alone; its successor is
  // scheduled as usual.
  void Postpone(int64_t delay_ms);

  const HealthTracker& tracker() const { return tracker_; }
  Health state() const { return tracker_.state(); }
  bool running() const { return running_; }

 private:
  static void OnTimer(uv_timer_t* t);
  void OnOutcome(ProbeOutcome outcome);

  std::unique_ptr<Probe> probe_;
  HealthTracker tracker_;
  TransitionCallback on_transition_;
  OutcomeCallback on_outcome_;
  struct TimerBox;
  TimerBox* timer_;  // freed in the timer's close callback
  bool running_ = false;
  bool closed_ = false;
  bool in_flight_ = false;
};

}  // namespace wsup
