// What the supervisor does when the front reports that the active engine
// has sent no byte for a while with requests waiting on it (front/proxy.h,
// the `silent` event). Pure, so its rules are tested directly.
//
// The front's report alone never fails an engine: a non-streamed request
// sends nothing until it is complete, so a busy engine with long answers is
// as silent as a hung one. It only makes the supervisor look at once
// instead of waiting for its probes' hysteresis. A stopped process (SIGSTOP,
// a debugger) is a fact read from /proc and trips the engine at once; a
// running one is asked one probe now, and trips only if that fails.
// Nothing is tripped without a proven standby to take the traffic: the
// probes then decide as usual, as failing the only engine helps nobody.
#pragma once

#include <string>

namespace wsup {

enum class SilenceStep {
  kIgnore,   // not acted on (why says so)
  kTrip,     // fail the active engine now
  kConfirm,  // probe it once now; trip if that fails
};

struct SilenceVerdict {
  SilenceStep step = SilenceStep::kIgnore;
  std::string why;
};

// routed_active: the report names the engine the front is steered to now.
// standby_ready: a proven standby exists. run_state: /proc's state letter
// of the active engine's process, 0 when it is gone.
inline SilenceVerdict JudgeSilence(bool routed_active, bool standby_ready, int pid, char run_state) {
  if (!routed_active) return {SilenceStep::kIgnore, "it is not the active engine any more"};
  if (!standby_ready) return {SilenceStep::kIgnore, "there is no proven standby to take the traffic; its probes decide"};
  if (pid <= 0 || run_state == 0) return {SilenceStep::kIgnore, "its process is gone; its exit is handled as a crash"};
  if (run_state == 'Z' || run_state == 'X' || run_state == 'x') {
    return {SilenceStep::kIgnore, "its process " + std::to_string(pid) + " is exiting; its exit is handled as a crash"};
  }
  if (run_state == 'T' || run_state == 't') {
    return {SilenceStep::kTrip, "its process " + std::to_string(pid) + " is stopped (SIGSTOP or a debugger)"};
  }
  return {SilenceStep::kConfirm, "its process " + std::to_string(pid) + " runs; probing it now"};
}

}  // namespace wsup
