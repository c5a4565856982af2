// RolloutFsm: a rolling upgrade of the node's engines (`wsup reload` with a
// changed engine.command or engine.env), standby first, as a state table.
//
// Two slots take part: `new_slot`, the standby when the roll begins, which
// gets the new version first, and `old_slot`, the active one, which keeps
// serving the old version until the new one has taken the traffic and held
// it through a watch window.
//
//   idle --begin--> stopping_standby [stop_standby]
//   stopping_standby --stopped--> starting_new [spawn_new]      new_slot, new version
//   starting_new --new_proven--> swapping [swap]                 a planned drain onto it
//   swapping --swapped--> watching [start_watch]                 old_slot drains, stays old
//   watching --watch_over--> stopping_old [stop_old]             once old_slot is a standby again
//   stopping_old --stopped--> starting_old [spawn_old]           old_slot, new version
//   starting_old --old_proven--> done [finish]
//
// and the ways out:
//   stopping_standby | starting_new | swapping | watching
//       --new_failed | old_failed | swap_refused | timeout | abort--> rolled_back [roll_back]
//   starting_old --old_failed--> starting_old (its restart policy retries, with the new version)
//   stopping_old | starting_old --timeout | abort--> failed [finish]
//
// rolled_back: the old version serves (old_slot never stopped before the
// watch window ended; a new active that fails in the window fails over
// to it as any crash does, also while it still drains) and new_slot goes
// back to the old version.
// failed: the new version serves on new_slot; old_slot did not come up
// with it in time and is left to its restart policy.
//
// Pure: no processes or time; supervisor/rollout.cc carries the actions
// out and feeds the slots' moves back as events. Loop thread only.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

namespace wsup {

enum class RollState {
  kIdle,
  kStoppingStandby,
  kStartingNew,
  kSwapping,
  kWatching,
  kStoppingOld,
  kStartingOld,
  kDone,
  kRolledBack,
  kFailed,
};

enum class RollEvent {
  kBegin,
  kStopped,      // the slot being replaced exited after its stop
  kNewProven,    // new_slot passed its probes on the new version
  kNewFailed,    // new_slot failed (exit, probe trip, start timeout)
  kOldFailed,    // old_slot failed
  kSwapped,      // the planned swap made new_slot the active one
  kSwapRefused,  // the planned swap could not be made
  kWatchOver,    // the watch window ended with old_slot a standby again
  kOldProven,    // old_slot passed its probes on the new version
  kTimeout,      // the step's budget ran out
  kAbort,        // the node is stopping
};

enum class RollAction {
  kNone,
  kStopStandby,
  kSpawnNew,
  kSwap,
  kStartWatch,
  kStopOld,
  kSpawnOld,
  kFinish,
  kRollBack,
};

const char* RollStateName(RollState s);
const char* RollEventName(RollEvent e);
const char* RollActionName(RollAction a);
// done, rolled_back, failed: the roll is over.
bool RollOver(RollState s);

struct RollTransition {
  RollState from;
  RollEvent event;
  RollState to;
  RollAction action;
};

std::optional<RollTransition> NextRollTransition(RollState state, RollEvent event);
const RollTransition* RollTable(size_t* count);

}  // namespace wsup
