// Rollout: a rolling upgrade of the engines (`wsup reload` with a changed
// engine command or env) as one owner. It alone holds the roll in progress
// (its step, its two slots, the versions, its ledger row and steps, the
// `wsup reload` callers waiting for its end), the step's budget and the
// watch window's timer, and the last roll's outcome for `wsup status`.
//
// The steps are rollout_fsm.h's table: every event goes through Fire(),
// which looks the row up, logs it with its cause and carries out its
// action. The new version goes on the standby slot first; once proven it
// takes the traffic by a planned swap, is watched, and then replaces the
// old slot. A failure before the end rolls both slots back to the old
// version. What it learns of the engines comes as engine events (it
// subscribes to engine_events.h's list as an EngineEvents) and through
// OnSpawnFailed()/OnFailoverEnded(); what it does to them (stop or start a
// slot, give a slot a version for its next starts, swap the traffic) and
// what it tells the node (its ledger row, state.json, the status line, the
// service manager, the callers' answer) goes through Hooks, given once at
// construction, so tests drive it on fake engines and a fake clock
// (tests/supervisor_core/rollout_test.cc).
//
// A supervisor that restarts mid-roll reads the roll from state.json
// (RuntimeState::Rollout) and, once it has adopted the engines, calls
// Resume(): that roll's row ends as interrupted, and a roll of its own
// finishes it or rolls back what remains.
//
// Threads: the loop thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/clock.h"
#include "common/status.h"
#include "common/timer.h"
#include "state/records.h"
#include "supervisor/config.h"
#include "supervisor/engine_events.h"
#include "supervisor/engine_fsm.h"
#include "supervisor/engine_version.h"
#include "supervisor/rollout_fsm.h"
#include "supervisor/runtime_state.h"
#include "wire/json_socket.h"

namespace wsup {

// One roll in progress (Rollout's own state). At namespace scope, not
// nested in Rollout: a nested class's member initializers are not usable
// until the enclosing class is complete, so std::optional of it would not
// be default-constructible inside Rollout for every compiler.
struct RolloutRun {
  RollState state = RollState::kIdle;
  std::string new_slot, old_slot;
  // The node's version as the roll began (the config's until it ends)
  // and the one it rolls to.
  EngineVersion from, to;
  RolloutRecord rec;  // its ledger row, rewritten at each step
  nlohmann::json steps = nlohmann::json::array();
  std::vector<std::shared_ptr<JsonConn>> waiters;  // `wsup reload` callers
  bool watch_elapsed = false;
  int64_t step_since_ms = 0;
  bool new_proven = false;       // the new version passed its probe on new_slot
  bool back = false;             // being rolled back
  std::string cause;             // why it is rolled back
  bool swap_back_waits = false;  // the swap back waits for a failover in progress to end
};

class Rollout final : public EngineEvents {
 public:
  // What the roll needs to know of one engine slot.
  struct SlotView {
    SlotState state = SlotState::kIdle;
    bool has_process = false;  // a process runs (or was seen) for it: its pid is known
    bool restart_armed = false;  // its restart (backoff) timer is running
    // What its process was started with; none for one an older wsup started.
    std::optional<EngineVersion> runs;
  };
  // What the service manager is told (notify.h).
  enum class Notice { kReloading, kStatus, kReady };

  struct Hooks {
    // The slot named so ("a", "b"); none for a name that is no slot (a
    // state.json from elsewhere).
    std::function<std::optional<SlotView>(const std::string& slot)> slot;
    // The version the slot's next starts use; none: the node's.
    std::function<void(const std::string& slot, const std::optional<EngineVersion>& v)> set_version;
    // Starts the slot (off the current call, once engines may start) as a
    // recovery of `cause`.
    std::function<void(const std::string& slot, const std::string& cause)> spawn;
    // Moves the slot by its table's stop event.
    std::function<void(const std::string& slot, const std::string& why)> stop;
    // Arms the slot's restart by its restart policy (a failed slot whose
    // exit was seen).
    std::function<void(const std::string& slot)> restart;
    // Why `from`'s traffic cannot move to `to` now ("" when it can).
    std::function<std::string(const std::string& from, const std::string& to)> swap_refusal;
    // A planned swap: `to` takes new traffic, `from` drains and becomes the
    // standby. False when `to` could not be promoted.
    std::function<bool(const std::string& from, const std::string& to, const std::string& why)> swap;
    // A failover is in progress (its proof through the front is pending).
    std::function<bool()> failover_pending;
    // The node is stopping: no slot is started again.
    std::function<bool()> stopping;
    // The node's version is `v` from now on (its config's engine command
    // and env): a roll that ended on it, or the one a resumed roll began from.
    std::function<void(const EngineVersion& v)> set_node_version;
    // The ledger's rollouts row: written (its id), rewritten, and a write
    // that failed (logged and counted by the node).
    std::function<Result<int64_t>(const RolloutRecord& rec)> record_row;
    std::function<Status(const RolloutRecord& rec)> update_row;
    std::function<void(const Status& st, const char* what)> ledger_error;
    // The roll ended: its `wsup reload` callers get `reply` once the ledger
    // has handled the row's last write.
    std::function<void(std::vector<std::shared_ptr<JsonConn>> waiters, nlohmann::json reply)> answer;
    // A roll ended with this outcome (the rollouts metric).
    std::function<void(const std::string& outcome)> counted;
    std::function<void()> save_state;
    std::function<void()> status_line;
    std::function<void(Notice kind, const std::string& text)> notify;
  };

  // cfg is read at each use (a reload changes it in place) and must outlive
  // this, as must timers and clock.
  Rollout(TimerSource& timers, const Clock& clock, const Config& cfg, Hooks hooks);
  Rollout(const Rollout&) = delete;
  Rollout& operator=(const Rollout&) = delete;

  // Begins a roll from the node's version to `to`, new_slot (the standby)
  // first; `c` (may be null) is answered when it ends. The caller checked
  // that none is in progress and that the slots can take it.
  void Begin(const std::string& new_slot, const std::string& old_slot, const EngineVersion& to,
             const std::string& why, const std::shared_ptr<JsonConn>& c);
  // A restarted supervisor, after adopting the engines: the roll its
  // predecessor ran (from state.json) ends as interrupted, and the slots
  // are left on one version (a roll of its own finishes or rolls back
  // what remains).
  void Resume(const RuntimeState::Rollout& prev);
  // The node is stopping: a roll in progress ends.
  void Abort(const std::string& why);
  // The rollout's version could not even be started on this slot.
  void OnSpawnFailed(const std::string& slot, const std::string& why);
  // A failover ended (proven or not): a step that waited for it goes on.
  void OnFailoverEnded();
  // An engine slot moved (engine_events.h).
  void OnEngineEvent(const EngineEvent& e) override;

  bool InProgress() const { return roll_.has_value(); }
  // The step of the roll in progress (RollStateName); "" when none.
  std::string StepName() const;
  // Wall ms when the roll in progress began; 0 when none.
  int64_t StartedMs() const { return roll_ ? roll_->rec.started_ms : 0; }
  // Its entry in state.json; none when no roll is in progress.
  std::optional<RuntimeState::Rollout> Record() const;
  // `rollout` of `wsup status`: the roll in progress and the last one.
  nlohmann::json StatusJson() const;

 private:
  using Roll = RolloutRun;

  // A roll entered by `first` (begin, or a restarted supervisor's resume).
  void BeginRoll(const std::string& new_slot, const std::string& old_slot, const EngineVersion& to, RollEvent first,
                 const std::string& why, const std::shared_ptr<JsonConn>& c);
  void OnSlotMoved(const std::string& slot, SlotState from, SlotState to, const std::string& cause);
  void Fire(RollEvent event, const std::string& why);
  void Step(const std::string& step, const std::string& slot, const std::string& why);
  // The roll is over (its state says how); `why` is what ended it.
  void End(const std::string& why);
  void MaybeWatchOver();
  // The rollback's steps (rollout_fsm.h).
  void RestoreOld();
  void SwapBack();
  void RestoreNew();
  // The slot, as the hooks see it now (an idle one for a name that is none).
  SlotView View(const std::string& slot) const;
  // A version as EngineVersionText shows it.
  std::string VersionText(const EngineVersion& v) const;
  bool Stopping() const { return hooks_.stopping && hooks_.stopping(); }
  void SaveState() {
    if (hooks_.save_state) hooks_.save_state();
  }
  void Notify(Notice kind, const std::string& text) {
    if (hooks_.notify) hooks_.notify(kind, text);
  }
  void LedgerError(const Status& st, const char* what) {
    if (!st.ok() && hooks_.ledger_error) hooks_.ledger_error(st, what);
  }
  // The row written whole; its id, or 0 when it was not.
  int64_t RecordRow(const RolloutRecord& rec, const char* what);

  TimerSource& timers_;
  const Clock& clock_;
  const Config& cfg_;
  Hooks hooks_;
  std::optional<Roll> roll_;
  // Made once (a roll may end inside one's callback): the step's budget,
  // and the watch window after the swap.
  std::unique_ptr<Timer> budget_, watch_;
  nlohmann::json last_;  // the last roll's outcome, for `wsup status`
  // Slots a roll that ended left stopping: started again, with the node's
  // version, once they have stopped.
  std::set<std::string> respawn_after_stop_;
};

}  // namespace wsup
