// SilenceWatch (silence_watch.h): the front's `silent` report carried out.
#include "supervisor/silence_watch.h"

#include "common/log.h"
#include "supervisor/silence_check.h"

namespace wsup {

void SilenceWatch::OnSilent(const FrontMessage& m) {
  const std::optional<Engine> act = hooks_.active();
  const bool routed = act && !m.backend.empty() && m.backend == act->backend && m.backend == hooks_.routed();
  std::string report = "the front saw " + std::to_string(m.silent) + " of " + std::to_string(m.inflight) +
                       " requests on " + m.backend + " get no byte for " + std::to_string(m.after_ms) + " ms";
  char run = 0;
  if (routed && act->pid > 0) {
    // A process that cannot be read is judged as gone: its exit is on its way.
    Result<char> r = hooks_.run_state(act->pid);
    if (r.ok()) run = *r;
  }
  const SilenceVerdict v = JudgeSilence(routed, hooks_.standby_ready(), routed ? act->pid : 0, run);
  if (routed && m.last_byte_ms > 0) hooks_.last_byte(act->slot, m.last_byte_ms);
  switch (v.step) {
    case SilenceStep::kIgnore:
      spdlog::info("{}; not acted on: {}", report, v.why);
      hooks_.counted("ignored");
      return;
    case SilenceStep::kTrip:
      Trip(act->slot, report + "; " + v.why);
      return;
    case SilenceStep::kConfirm:
      break;
  }
  if (probe_ && probe_pid_ == act->pid) return;  // one check at a time
  spdlog::warn("{}; {}", report, v.why);
  // A probe still running for an earlier process of the slot is dropped
  // with its answer: that process is not the one the front reports.
  probe_pid_ = act->pid;
  probe_ = hooks_.make_probe(*act);
  if (!probe_) {  // the slot went between the two reads: nothing is left to check
    probe_pid_ = 0;
    return;
  }
  const std::string slot = act->slot;
  const pid_t pid = act->pid;
  probe_->Run([this, slot, pid, report](ProbeOutcome o) {
    // The probe runs this callback: free it after the callback returns.
    later_.After(0, [this, pid] {
      if (probe_pid_ == pid) {
        probe_.reset();
        probe_pid_ = 0;
      }
    });
    if (hooks_.stopping()) return;
    const std::optional<Engine> now = hooks_.active();
    if (!now || now->slot != slot || now->pid != pid) return;  // it has moved on: nothing to trip
    if (o.ok) {
      spdlog::info("{}; the probe made at once passed ({} ms): not tripped, it is busy, not hung", report,
                   o.latency_ms);
      hooks_.counted("dismissed");
      return;
    }
    Trip(slot, report + "; a probe made at once failed: " + o.reason);
  });
}

void SilenceWatch::Trip(const std::string& slot, const std::string& why) {
  hooks_.counted("tripped");
  spdlog::warn("engine {}: tripped: {}", slot, why);
  hooks_.trip(slot, why);
}

}  // namespace wsup
