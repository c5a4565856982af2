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
//   swapping --swapped--> watching [start_watch]                 old_slot drained, a standby on the old version
//   watching --watch_over--> stopping_old [stop_old]             the new version served through the window
//   stopping_old --stopped--> starting_old [spawn_old]           old_slot, new version
//   starting_old --old_proven--> done [finish]
//
// A rollback, from any failure before the old slot is replaced, leaves
// both slots on the old version, old slot first:
//   stopping_standby | starting_new | swapping | watching
//       --new_failed | old_failed | swap_refused | timeout--> restoring_old [roll_back]
//   restoring_old --old_proven--> swapping_back [swap_back]      old_slot proven (or serving) on the old version
//   swapping_back --swapped--> restoring_new [restore_new]       the traffic back on old_slot (if it had left)
//   restoring_new --new_proven--> rolled_back [finish]           new_slot proven on the old version
//   swapping_back | restoring_new --old_failed--> restoring_old [restore_old]  (old slot first, again)
// restore_new stops new_slot if it runs the new version and starts it with
// the old one (it re-runs at new_drained, stopped and new_failed). A slot
// that failed on the new version is restarted with the old one at once,
// outside its restart policy: the failure was the new version's.
//
// The other ways out:
//   starting_old --old_failed--> starting_old (its restart policy retries, with the new version)
//   stopping_old | starting_old --timeout--> failed [finish]
//   restoring_old | swapping_back | restoring_new --timeout | swap_refused--> failed [finish]
//   any step --abort--> interrupted [finish]                     the node is stopping
//
// A supervisor restarted during a roll closes its row as interrupted and
// resumes from what it adopts (supervisor/adopter.h), with a roll of its
// own that starts from idle:
//   idle --resume_watch--> watching [start_watch]    the new version serves, proven; old_slot adopted
//   idle --resume_old--> starting_old [spawn_old]    the new version serves, proven; old_slot was being replaced
//   idle --resume_back--> restoring_old [roll_back]  anything else: back to the old version
//
// done: both slots run the new version. rolled_back: both slots run the old
// version (the old active was never stopped; a new active that failed in
// the window failed over to it as any crash does, also while it drained).
// failed: the new version serves on new_slot; old_slot did not come up with
// it in time and is left to its restart policy (or, when rolling back, the
// old version could not be brought back in time: both are left to their
// restart policies, which start the old version). interrupted: the node
// stopped during the roll.
//
// Pure: no processes or time; supervisor/rollout.cc carries the actions
// out and feeds the slots' moves back as events. Loop thread only.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

#include "common/state_table.h"

namespace wsup {

enum class RollState {
  kIdle,
  kStoppingStandby,
  kStartingNew,
  kSwapping,
  kWatching,
  kStoppingOld,
  kStartingOld,
  kRestoringOld,
  kSwappingBack,
  kRestoringNew,
  kDone,
  kRolledBack,
  kFailed,
  kInterrupted,
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
  kNewDrained,   // new_slot, drained after the traffic went back, is a standby again
  kResumeWatch,  // a restarted supervisor: the new version serves on new_slot, proven; old_slot adopted
  kResumeOld,    // ... and old_slot was being replaced with the new version
  kResumeBack,   // ... otherwise: the roll goes back to the old version
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
  kRollBack,     // the roll is rolled back: slots drop the new version, then restore_old
  kRestoreOld,   // old_slot back on the old version: proven at once if it serves, else waited for
  kSwapBack,     // the traffic back onto old_slot, if new_slot has it
  kRestoreNew,   // new_slot off the new version: stopped if it runs it, started with the old one
};

const char* RollStateName(RollState s);
const char* RollEventName(RollEvent e);
const char* RollActionName(RollAction a);
// The steps of a rollback: restoring_old, swapping_back, restoring_new.
bool RollingBack(RollState s);
// done, rolled_back, failed, interrupted: the roll is over.
bool RollOver(RollState s);

inline constexpr TableNames<RollState, RollEvent, RollAction> kRollNames{RollStateName, RollEventName,
                                                                         RollActionName};

using RollTransition = TableRow<RollState, RollEvent, RollAction>;

std::optional<RollTransition> NextRollTransition(RollState state, RollEvent event);
const RollTransition* RollTable(size_t* count);

}  // namespace wsup
