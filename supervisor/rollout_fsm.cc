#include "supervisor/rollout_fsm.h"

namespace wsup {
namespace {

using S = RollState;
using E = RollEvent;
using A = RollAction;

// One row per transition; each (from, event) pair at most once (tested).
constexpr RollTransition kTable[] = {
    {S::kIdle, E::kBegin, S::kStoppingStandby, A::kStopStandby},

    {S::kStoppingStandby, E::kStopped, S::kStartingNew, A::kSpawnNew},
    {S::kStoppingStandby, E::kOldFailed, S::kRolledBack, A::kRollBack},
    {S::kStoppingStandby, E::kTimeout, S::kRolledBack, A::kRollBack},
    {S::kStoppingStandby, E::kAbort, S::kRolledBack, A::kRollBack},

    {S::kStartingNew, E::kNewProven, S::kSwapping, A::kSwap},
    {S::kStartingNew, E::kNewFailed, S::kRolledBack, A::kRollBack},
    {S::kStartingNew, E::kOldFailed, S::kRolledBack, A::kRollBack},
    {S::kStartingNew, E::kTimeout, S::kRolledBack, A::kRollBack},
    {S::kStartingNew, E::kAbort, S::kRolledBack, A::kRollBack},

    {S::kSwapping, E::kSwapped, S::kWatching, A::kStartWatch},
    {S::kSwapping, E::kSwapRefused, S::kRolledBack, A::kRollBack},
    {S::kSwapping, E::kNewFailed, S::kRolledBack, A::kRollBack},
    {S::kSwapping, E::kOldFailed, S::kRolledBack, A::kRollBack},
    {S::kSwapping, E::kTimeout, S::kRolledBack, A::kRollBack},
    {S::kSwapping, E::kAbort, S::kRolledBack, A::kRollBack},

    // A new active that fails in the window fails over to the old version.
    {S::kWatching, E::kNewFailed, S::kRolledBack, A::kRollBack},
    {S::kWatching, E::kOldFailed, S::kRolledBack, A::kRollBack},
    {S::kWatching, E::kWatchOver, S::kStoppingOld, A::kStopOld},
    {S::kWatching, E::kTimeout, S::kRolledBack, A::kRollBack},
    {S::kWatching, E::kAbort, S::kRolledBack, A::kRollBack},

    {S::kStoppingOld, E::kStopped, S::kStartingOld, A::kSpawnOld},
    {S::kStoppingOld, E::kTimeout, S::kFailed, A::kFinish},
    {S::kStoppingOld, E::kAbort, S::kFailed, A::kFinish},

    {S::kStartingOld, E::kOldProven, S::kDone, A::kFinish},
    // Restarted by its policy, on the new version: the budget decides.
    {S::kStartingOld, E::kOldFailed, S::kStartingOld, A::kNone},
    {S::kStartingOld, E::kTimeout, S::kFailed, A::kFinish},
    {S::kStartingOld, E::kAbort, S::kFailed, A::kFinish},
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
    case S::kDone: return "done";
    case S::kRolledBack: return "rolled_back";
    case S::kFailed: return "failed";
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
  }
  return "?";
}

bool RollOver(RollState s) { return s == S::kDone || s == S::kRolledBack || s == S::kFailed; }

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
