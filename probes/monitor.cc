#include "probes/monitor.h"

namespace wsup {

struct HealthMonitor::TimerBox {
  uv_timer_t timer;
  HealthMonitor* owner;
  std::function<void()> done;
};

HealthMonitor::HealthMonitor(uv_loop_t* loop, std::unique_ptr<Probe> probe, const HysteresisOptions& options,
                             const Clock& clock, TransitionCallback on_transition, OutcomeCallback on_outcome)
    : probe_(std::move(probe)),
      tracker_(options, clock),
      on_transition_(std::move(on_transition)),
      on_outcome_(std::move(on_outcome)),
      timer_(new TimerBox{}) {
  uv_timer_init(loop, &timer_->timer);
  timer_->timer.data = timer_;
  timer_->owner = this;
}

HealthMonitor::~HealthMonitor() { Stop(); }

void HealthMonitor::Start() {
  if (running_ || closed_) return;
  running_ = true;
  uv_timer_start(&timer_->timer, &HealthMonitor::OnTimer, 0, 0);
}

void HealthMonitor::Stop(std::function<void()> done) {
  if (closed_) {
    if (done) done();
    return;
  }
  closed_ = true;
  running_ = false;
  if (in_flight_) probe_->Cancel();
  in_flight_ = false;
  timer_->owner = nullptr;
  timer_->done = std::move(done);
  uv_close(reinterpret_cast<uv_handle_t*>(&timer_->timer), [](uv_handle_t* h) {
    auto* box = static_cast<TimerBox*>(h->data);
    auto done = std::move(box->done);
    delete box;
    if (done) done();
  });
  timer_ = nullptr;
}

void HealthMonitor::Postpone(int64_t delay_ms) {
  if (!running_ || closed_ || in_flight_ || delay_ms <= 0) return;
  const uint64_t due = uv_timer_get_due_in(&timer_->timer);
  const uint64_t want = static_cast<uint64_t>(delay_ms);
  if (due >= want) return;
  uv_timer_start(&timer_->timer, &HealthMonitor::OnTimer, want, 0);
}

void HealthMonitor::OnTimer(uv_timer_t* t) {
  auto* box = static_cast<TimerBox*>(t->data);
  HealthMonitor* self = box->owner;
  if (!self || !self->running_ || self->in_flight_) return;
  self->in_flight_ = true;
  self->probe_->Run([self](ProbeOutcome outcome) { self->OnOutcome(std::move(outcome)); });
}

void HealthMonitor::OnOutcome(ProbeOutcome outcome) {
  in_flight_ = false;
  if (!running_) return;
  auto transition = tracker_.Record(outcome);
  // Schedule first: a callback may Stop() the monitor, which closes the timer.
  uv_timer_start(&timer_->timer, &HealthMonitor::OnTimer, static_cast<uint64_t>(tracker_.NextDelayMs()), 0);
  if (on_outcome_) on_outcome_(outcome);
  if (transition && running_ && on_transition_) on_transition_(*transition);
}

}  // namespace wsup
