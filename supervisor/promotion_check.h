// Whether a standby may take the traffic: the check every promotion makes
// first (EngineSet::Promote, engine_set.h). Pure, so its rules are tested directly.
//
// Only facts about the process make a standby unfit: it has none, it is
// gone, stopped (SIGSTOP, a debugger) or exiting. Those are read from
// /proc at once and cannot be wrong. A standby whose last good probe is old
// but whose process runs is promoted all the same, with a note: at a crash
// the active is already dead, so failing the only running engine would turn
// a slow probe (a loaded machine, a long GC pause in a Python engine) into
// an outage of every client, while promoting it costs nothing its probes
// cannot undo: they keep running and fail it by the usual hysteresis if it
// does not answer.
#pragma once

#include <cstdint>
#include <string>

namespace wsup {

struct PromotionCheck {
  std::string unfit;  // non-empty: not promoted, and why
  std::string note;   // non-empty: promoted, with this caveat for the log and the ledger
};

// run_state: /proc's state letter, or 0 when the process is gone. last_ok_age_ms:
// how old the last good probe answer is, or -1 when it was never probed in
// this supervisor's life (an adopted engine). stale_after_ms: the age past
// which the answer is called old (two probe intervals plus jitter and a timeout).
inline PromotionCheck CheckPromotion(int pid, char run_state, int64_t last_ok_age_ms, int64_t stale_after_ms) {
  PromotionCheck c;
  if (pid <= 0) {
    c.unfit = "it has no process";
  } else if (run_state == 0) {
    c.unfit = "its process " + std::to_string(pid) + " is gone";
  } else if (run_state == 'T' || run_state == 't') {
    c.unfit = "its process " + std::to_string(pid) + " is stopped (SIGSTOP or a debugger)";
  } else if (run_state == 'Z' || run_state == 'X' || run_state == 'x') {
    c.unfit = "its process " + std::to_string(pid) + " is exiting";
  } else if (last_ok_age_ms > stale_after_ms) {
    c.note = "its last good probe answer is " + std::to_string(last_ok_age_ms) + " ms old (more than " +
             std::to_string(stale_after_ms) + " ms) but its process runs: promoted, its probes decide";
  }
  return c;
}

}  // namespace wsup
