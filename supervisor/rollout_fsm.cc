#include "supervisor/rollout_fsm.h"

namespace wsup {
namespace {

using S = RollState;
using E = RollEvent;
using A = RollAction;

// The names, in the order of each enum's values (the logs' and tests' words).
constexpr EnumNames<S::kInterrupted> kStateNames{
    "idle",         "stopping_standby", "starting_new",  "swapping",      "watching",
    "stopping_old", "starting_old",     "restoring_old", "swapping_back", "restoring_new",
    "done",         "rolled_back",      "failed",        "interrupted"};
constexpr EnumNames<E::kResumeBack> kEventNames{"begin",        "stopped",    "new_proven",   "new_failed",
                                                "old_failed",   "swapped",    "swap_refused", "watch_over",
                                                "old_proven",   "timeout",    "abort",        "new_drained",
                                                "resume_watch", "resume_old", "resume_back"};
constexpr EnumNames<A::kRestoreNew> kActionNames{"none",        "stop_standby", "spawn_new", "swap",
                                                 "start_watch", "stop_old",     "spawn_old", "finish",
                                                 "roll_back",   "restore_old",  "swap_back", "restore_new"};

// One row per transition; each (from, event) pair at most once (tested).
constexpr RollTransition kTable[] = {
    {S::kIdle, E::kBegin, S::kStoppingStandby, A::kStopStandby},
    // A restarted supervisor resumes what it adopted (adopter.h).
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
    // the old version at once (engine_set.cc, EngineSet::ScheduleRestart).
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

const char* RollStateName(RollState s) { return kStateNames(s); }
const char* RollEventName(RollEvent e) { return kEventNames(e); }
const char* RollActionName(RollAction a) { return kActionNames(a); }

bool RollOver(RollState s) {
  return s == S::kDone || s == S::kRolledBack || s == S::kFailed || s == S::kInterrupted;
}

bool RollingBack(RollState s) {
  return s == S::kRestoringOld || s == S::kSwappingBack || s == S::kRestoringNew;
}

std::optional<RollTransition> NextRollTransition(RollState state, RollEvent event) {
  return FindRow(kTable, state, event);
}

const RollTransition* RollTable(size_t* count) { return AllRows(kTable, count); }

}  // namespace wsup
