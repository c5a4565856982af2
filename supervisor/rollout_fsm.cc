#include "supervisor/rollout_fsm.h"

namespace wsup {
namespace {

using S = RollState;
using E = RollEvent;
using A = RollAction;

// One row per transition; each (from, event) pair at most once (tested).
constexpr RollTransition kTable[] = {
    {S::kIdle, E::kBegin, S::kStoppingStandby, A::kStopStandby},
    // A restarted supervisor resumes what it adopted (adoption.cc).
    {S::kIdle, E::kResumeWatch, S::kWatching, A::kStartWatch},
    {S::kIdle, E::kResumeOld, S::kStartingOld, A::kSpawnOld},
    {S::kIdle, E::kResumeBack, S::kRestoringOld, A::kRollBack},

    {S::kStoppingStandby, E::kStopped, S::kStartingNew, A::kSpawnNew},
    {S::kStoppingStandby, E::kOldFailed, S::kRestoringOld, A::kRollBack},
    {S::kStoppingStandby, E::kTimeout, S::kRestoringOld, A::kRollBack},
    {S::kStoppingStandby, E::kAbort, S::kInterrupted, A::kFinish},

    {S::kStartingNew, E::kNewProven, S::kSwapping, A::kSwap},
    {S::kStartingNew, E::kNewFailed, S::kRestoringOld, A::kRollBack},
    {S::kStartingNew, E::kOldFailed, S::kRestoringOld, A::kRollBack},
    {S::kStartingNew, E::kTimeout, S::kRestoringOld, A::kRollBack},
    {S::kStartingNew, E::kAbort, S::kInterrupted, A::kFinish},

    // The swap lasts until the old version's engine has drained.
    {S::kSwapping, E::kSwapped, S::kWatching, A::kStartWatch},
    {S::kSwapping, E::kSwapRefused, S::kRestoringOld, A::kRollBack},
    {S::kSwapping, E::kNewFailed, S::kRestoringOld, A::kRollBack},
    {S::kSwapping, E::kOldFailed, S::kRestoringOld, A::kRollBack},
    {S::kSwapping, E::kTimeout, S::kRestoringOld, A::kRollBack},
    {S::kSwapping, E::kAbort, S::kInterrupted, A::kFinish},

    // A new active that fails in the window fails over to the old version.
    {S::kWatching, E::kNewFailed, S::kRestoringOld, A::kRollBack},
    {S::kWatching, E::kOldFailed, S::kRestoringOld, A::kRollBack},
    {S::kWatching, E::kWatchOver, S::kStoppingOld, A::kStopOld},
    {S::kWatching, E::kTimeout, S::kRestoringOld, A::kRollBack},
    {S::kWatching, E::kAbort, S::kInterrupted, A::kFinish},

    {S::kStoppingOld, E::kStopped, S::kStartingOld, A::kSpawnOld},
    {S::kStoppingOld, E::kTimeout, S::kFailed, A::kFinish},
    {S::kStoppingOld, E::kAbort, S::kInterrupted, A::kFinish},

    {S::kStartingOld, E::kOldProven, S::kDone, A::kFinish},
    // Restarted by its policy, on the new version: the budget decides.
    {S::kStartingOld, E::kOldFailed, S::kStartingOld, A::kNone},
    {S::kStartingOld, E::kTimeout, S::kFailed, A::kFinish},
    {S::kStartingOld, E::kAbort, S::kInterrupted, A::kFinish},

    // Rolling back: the old slot first. It runs the old version; a failure
    // of it is its restart policy's, one of the new slot is re-armed with
    // the old version at once (engines.cc, ScheduleRestart).
    {S::kRestoringOld, E::kOldProven, S::kSwappingBack, A::kSwapBack},
    {S::kRestoringOld, E::kOldFailed, S::kRestoringOld, A::kNone},
    {S::kRestoringOld, E::kNewFailed, S::kRestoringOld, A::kNone},
    {S::kRestoringOld, E::kTimeout, S::kFailed, A::kFinish},
    {S::kRestoringOld, E::kAbort, S::kInterrupted, A::kFinish},

    {S::kSwappingBack, E::kSwapped, S::kRestoringNew, A::kRestoreNew},
    {S::kSwappingBack, E::kSwapRefused, S::kFailed, A::kFinish},
    // Found unfit as it was to take the traffic back: it comes back first.
    {S::kSwappingBack, E::kOldFailed, S::kRestoringOld, A::kRestoreOld},
    {S::kSwappingBack, E::kNewFailed, S::kRestoringNew, A::kRestoreNew},
    {S::kSwappingBack, E::kTimeout, S::kFailed, A::kFinish},
    {S::kSwappingBack, E::kAbort, S::kInterrupted, A::kFinish},

    {S::kRestoringNew, E::kNewProven, S::kRolledBack, A::kFinish},
    {S::kRestoringNew, E::kNewDrained, S::kRestoringNew, A::kRestoreNew},
    {S::kRestoringNew, E::kStopped, S::kRestoringNew, A::kRestoreNew},
    {S::kRestoringNew, E::kNewFailed, S::kRestoringNew, A::kRestoreNew},
    // The old version's engine failed again, and a failover may have put
    // the new version back in front: the old slot first, again.
    {S::kRestoringNew, E::kOldFailed, S::kRestoringOld, A::kRestoreOld},
    {S::kRestoringNew, E::kTimeout, S::kFailed, A::kFinish},
    {S::kRestoringNew, E::kAbort, S::kInterrupted, A::kFinish},
};

}  // namespace

const char* RollStateName(RollState s) {
  switch (s) {
    case S::kIdle: return "idle";
    case S::kStoppingStandby: return "stopping_standby";
    case S::kStartingNew: return "starting_new";
    case S::kSwapping: return "swapping";
    case S::kWatching: return "watching";
    case S::kStoppingOld: return "stopping_old";
    case S::kStartingOld: return "starting_old";
    case S::kRestoringOld: return "restoring_old";
    case S::kSwappingBack: return "swapping_back";
    case S::kRestoringNew: return "restoring_new";
    case S::kDone: return "done";
    case S::kRolledBack: return "rolled_back";
    case S::kFailed: return "failed";
    case S::kInterrupted: return "interrupted";
  }
  return "?";
}

const char* RollEventName(RollEvent e) {
  switch (e) {
    case E::kBegin: return "begin";
    case E::kStopped: return "stopped";
    case E::kNewProven: return "new_proven";
    case E::kNewFailed: return "new_failed";
    case E::kOldFailed: return "old_failed";
    case E::kSwapped: return "swapped";
    case E::kSwapRefused: return "swap_refused";
    case E::kWatchOver: return "watch_over";
    case E::kOldProven: return "old_proven";
    case E::kTimeout: return "timeout";
    case E::kAbort: return "abort";
    case E::kNewDrained: return "new_drained";
    case E::kResumeWatch: return "resume_watch";
    case E::kResumeOld: return "resume_old";
    case E::kResumeBack: return "resume_back";
  }
  return "?";
}

const char* RollActionName(RollAction a) {
  switch (a) {
    case A::kNone: return "none";
    case A::kStopStandby: return "stop_standby";
    case A::kSpawnNew: return "spawn_new";
    case A::kSwap: return "swap";
    case A::kStartWatch: return "start_watch";
    case A::kStopOld: return "stop_old";
    case A::kSpawnOld: return "spawn_old";
    case A::kFinish: return "finish";
    case A::kRollBack: return "roll_back";
    case A::kRestoreOld: return "restore_old";
    case A::kSwapBack: return "swap_back";
    case A::kRestoreNew: return "restore_new";
  }
  return "?";
}

bool RollOver(RollState s) {
  return s == S::kDone || s == S::kRolledBack || s == S::kFailed || s == S::kInterrupted;
}

bool RollingBack(RollState s) { return s == S::kRestoringOld || s == S::kSwappingBack || s == S::kRestoringNew; }

std::optional<RollTransition> NextRollTransition(RollState state, RollEvent event) {
  for (const auto& t : kTable) {
    if (t.from == state && t.event == event) return t;
  }
  return std::nullopt;
}

const RollTransition* RollTable(size_t* count) {
  *count = sizeof(kTable) / sizeof(kTable[0]);
  return kTable;
}

}  // namespace wsup
