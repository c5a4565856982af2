// Rollout (rollout.h): a rolling upgrade's steps carried out, standby
// first, through the hooks the node gave it.
#include "supervisor/rollout.h"

#include <spdlog/spdlog.h>

#include <utility>

#include "supervisor/reload_plan.h"

namespace wsup {

using nlohmann::json;

namespace {

// A step that takes longer than this (beyond the engine's own start budget)
// ends the roll: rolled back before the swap, failed after it.
constexpr int64_t kStepSlackMs = 60'000;
// A planned swap's drain budget (a failover's, failover.h), and how long a failover may
// wait for its proof through the front (failover.cc).
constexpr int64_t kDrainMs = 30'000;
constexpr int64_t kProofMs = 120'000;
// The node's two engine slots.
constexpr const char* kSlots[] = {"a", "b"};

std::string DumpSteps(const json& steps) { return steps.dump(-1, ' ', false, json::error_handler_t::replace); }

}  // namespace

Rollout::Rollout(TimerSource& timers, const Clock& clock, const Config& cfg, Hooks hooks)
    : timers_(timers), clock_(clock), cfg_(cfg), hooks_(std::move(hooks)), budget_(timers_.Make()),
      watch_(timers_.Make()) {}

std::string Rollout::VersionText(const EngineVersion& v) const { return EngineVersionText(WithVersion(cfg_, v)); }

Rollout::SlotView Rollout::View(const std::string& slot) const {
  auto v = hooks_.slot ? hooks_.slot(slot) : std::nullopt;
  return v ? *v : SlotView{};
}

int64_t Rollout::RecordRow(const RolloutRecord& rec, const char* what) {
  if (!hooks_.record_row) return 0;
  auto id = hooks_.record_row(rec);
  if (!id.ok()) {
    LedgerError(Status(id.error()), what);
    return 0;
  }
  return *id;
}

std::string Rollout::StepName() const { return roll_ ? RollStateName(roll_->state) : ""; }

void Rollout::Begin(const std::string& new_slot, const std::string& old_slot, const EngineVersion& to,
                    const std::string& why, const std::shared_ptr<JsonConn>& c) {
  BeginRoll(new_slot, old_slot, to, RollEvent::kBegin, why, c);
}

void Rollout::BeginRoll(const std::string& new_slot, const std::string& old_slot, const EngineVersion& to,
                        RollEvent first, const std::string& why, const std::shared_ptr<JsonConn>& c) {
  roll_.emplace();
  Roll& r = *roll_;
  r.new_slot = new_slot;
  r.old_slot = old_slot;
  r.from = VersionOf(cfg_);
  r.to = to;
  if (c) r.waiters.push_back(c);
  r.rec.started_ms = clock_.WallMs();
  r.rec.outcome = "running";
  r.rec.command_before = VersionText(r.from);
  r.rec.command_after = VersionText(r.to);
  r.rec.id = RecordRow(r.rec, "rollout");
  Notify(Notice::kReloading, "rolling the engines to a new version");
  spdlog::info("rollout #{} ({}): engine {} (standby) first, then {}; from {} to {}", r.rec.id, why, r.new_slot,
               r.old_slot, r.rec.command_before, r.rec.command_after);
  Fire(first, why);
}

void Rollout::Abort(const std::string& why) { Fire(RollEvent::kAbort, why); }

void Rollout::OnEngineEvent(const EngineEvent& e) { OnSlotMoved(e.slot, e.row.from, e.row.to, e.cause); }

void Rollout::OnSlotMoved(const std::string& slot, SlotState from, SlotState to, const std::string& cause) {
  if (from == to) return;
  if (!roll_) {
    // A slot a roll that ended was still stopping: back with the node's version.
    if (to == SlotState::kStopped && respawn_after_stop_.count(slot) && !Stopping()) {
      respawn_after_stop_.erase(slot);
      hooks_.spawn(slot, "rollout rolled back");
    }
    return;
  }
  // Each branch returns after Fire: the roll may have ended in it.
  const RollState step = roll_->state;
  const bool is_new = slot == roll_->new_slot;
  const bool is_old = slot == roll_->old_slot;
  if (!is_new && !is_old) return;
  const std::string who = "engine " + slot;
  if (to == SlotState::kStopped) {
    Fire(RollEvent::kStopped, who + " stopped");
  } else if (to == SlotState::kFailed) {
    Fire(is_new ? RollEvent::kNewFailed : RollEvent::kOldFailed, who + " failed: " + cause);
  } else if (to == SlotState::kStandby && (from == SlotState::kWarming || from == SlotState::kStarting)) {
    Fire(is_new ? RollEvent::kNewProven : RollEvent::kOldProven, who + " proven: " + cause);
  } else if (to == SlotState::kStandby && from == SlotState::kDraining) {
    if (is_old && step == RollState::kSwapping) {
      Fire(RollEvent::kSwapped, who + " drained; engine " + roll_->new_slot + " serves the new version");
    } else if (is_old && step == RollState::kRestoringOld) {
      Fire(RollEvent::kOldProven, who + " drained: a standby on the old version");
    } else if (is_new && step == RollState::kRestoringNew) {
      Fire(RollEvent::kNewDrained, who + " drained");
    }
  } else if (to == SlotState::kActive && is_old && step == RollState::kRestoringOld) {
    // A failover put the old version back in front.
    Fire(RollEvent::kOldProven, who + " serves the old version again: " + cause);
  }
}

void Rollout::OnSpawnFailed(const std::string& slot, const std::string& why) {
  spdlog::error("engine {}: the rollout's version cannot be started: {}", slot, why);
  if (!roll_) return;
  Fire(slot == roll_->new_slot ? RollEvent::kNewFailed : RollEvent::kOldFailed,
       "engine " + slot + " could not be started with the new version: " + why);
}

void Rollout::MaybeWatchOver() {
  if (!roll_ || roll_->state != RollState::kWatching || !roll_->watch_elapsed) return;
  if (View(roll_->old_slot).state == SlotState::kStandby && !hooks_.failover_pending()) {
    Fire(RollEvent::kWatchOver, "the new version served through the watch window");
  }
}

void Rollout::OnFailoverEnded() {
  // A step that waits for no failover to be in progress goes on.
  if (!roll_) return;
  if (roll_->state == RollState::kWatching) {
    MaybeWatchOver();
  } else if (roll_->state == RollState::kSwappingBack && roll_->swap_back_waits) {
    SwapBack();
  }
}

void Rollout::RestoreOld() {
  const std::string old = roll_->old_slot;
  const SlotView v = View(old);
  if (v.state == SlotState::kActive || v.state == SlotState::kStandby) {
    Fire(RollEvent::kOldProven,
         "engine " + old + (v.state == SlotState::kActive ? " serves" : " is a standby") + " on the old version");
  } else if (v.state == SlotState::kStopped || v.state == SlotState::kIdle) {
    hooks_.spawn(old, "rollout rolled back");
  } else if (v.state == SlotState::kFailed && !v.has_process && !v.restart_armed) {
    hooks_.restart(old);
  }
  // Otherwise its next move says: a failed one is restarted by its restart
  // policy (with the old version), a draining one becomes a standby.
}

void Rollout::SwapBack() {
  const std::string nw = roll_->new_slot;
  const std::string old = roll_->old_slot;
  if (View(nw).state != SlotState::kActive) {
    Fire(RollEvent::kSwapped, "engine " + nw + " does not serve: no traffic to move back");
    return;
  }
  if (hooks_.failover_pending()) {
    // The failover's own proof first (OnFailoverEnded).
    roll_->swap_back_waits = true;
    spdlog::info("rollout #{}: the traffic moves back to engine {} once the failover in progress ends", roll_->rec.id,
                 old);
    return;
  }
  roll_->swap_back_waits = false;
  const std::string refusal = hooks_.swap_refusal(nw, old);
  if (!refusal.empty()) {
    Fire(RollEvent::kSwapRefused, refusal);
    return;
  }
  if (!hooks_.swap(nw, old, "rollout rolled back: the old version takes the traffic back")) {
    // An unfit old engine failed (and moved the roll back to restoring_old).
    Fire(RollEvent::kSwapRefused, "engine " + old + " could not be promoted");
    return;
  }
  Fire(RollEvent::kSwapped, "engine " + old + " serves the old version again");
}

void Rollout::RestoreNew() {
  const std::string nw = roll_->new_slot;
  const SlotView v = View(nw);
  // Unknown (a process an older wsup started): taken as the node's.
  const bool runs_old = !v.runs || *v.runs == VersionOf(cfg_);
  switch (v.state) {
    case SlotState::kStandby:
      if (runs_old) {
        Fire(RollEvent::kNewProven, "engine " + nw + " is a standby on the old version");
      } else {
        hooks_.stop(nw, "rollout rolled back: replacing the new version's engine");
      }
      break;
    case SlotState::kStarting:
    case SlotState::kWarming:
      // The old version's start is waited for; the new one's is replaced.
      if (!runs_old) hooks_.stop(nw, "rollout rolled back: replacing the new version's engine");
      break;
    case SlotState::kStopped:
    case SlotState::kIdle:
      hooks_.spawn(nw, "rollout rolled back");
      break;
    case SlotState::kFailed:
      // Re-armed with the old version at once (its restart), once its exit
      // is seen; one seen already and not scheduled is scheduled now.
      if (!v.has_process && !v.restart_armed) hooks_.restart(nw);
      break;
    case SlotState::kActive:    // a failover put it in front: the old slot's failure moves the roll back first
    case SlotState::kDraining:  // new_drained
    case SlotState::kStopping:  // stopped
      break;
  }
}

void Rollout::Step(const std::string& step, const std::string& slot, const std::string& why) {
  Roll& r = *roll_;
  r.steps.push_back({{"step", step}, {"slot", slot}, {"at_ms", clock_.WallMs()}, {"why", why}});
  r.step_since_ms = clock_.WallMs();
  r.rec.steps_json = DumpSteps(r.steps);
  if (r.rec.id && hooks_.update_row) LedgerError(hooks_.update_row(r.rec), "rollout step");
  Notify(Notice::kStatus, "rollout: " + step + (slot.empty() ? "" : " (engine " + slot + ")"));
}

void Rollout::Fire(RollEvent event, const std::string& why) {
  if (!roll_) return;
  auto t = NextRollTransition(roll_->state, event);
  if (!t) {
    spdlog::debug("rollout: event {} ignored in step {} ({})", RollEventName(event), RollStateName(roll_->state), why);
    return;
  }
  Roll& r = *roll_;
  spdlog::info("rollout #{}: {} --{}--> {} [{}] {}", r.rec.id, RollStateName(t->from), RollEventName(event),
               RollStateName(t->to), RollActionName(t->action), why);
  r.state = t->to;
  // Copies: `r` goes with the roll, which may end inside an action.
  const std::string nw = r.new_slot;
  const std::string old = r.old_slot;
  const int64_t ready = cfg_.engine.ready_timeout_ms + kStepSlackMs;
  const int64_t stop = cfg_.engine.stop_timeout_ms + kStepSlackMs;
  auto arm_budget = [this](int64_t ms) {
    budget_->Start(ms, [this] { Fire(RollEvent::kTimeout, "the step's budget ran out"); });
  };
  const std::string step = RollStateName(r.state);
  // Every action ends with its own break: an event fired inside one (a
  // swap made at once, a slot proven already) may end the roll, and `r`
  // with it.
  switch (t->action) {
    case RollAction::kNone:
      break;
    case RollAction::kStopStandby:
      Step(step, nw, why);
      arm_budget(stop);
      hooks_.stop(nw, "rollout: replacing the standby with the new version");
      break;
    case RollAction::kSpawnNew:
    case RollAction::kSpawnOld: {
      const std::string s = t->action == RollAction::kSpawnNew ? nw : old;
      Step(step, s, why);
      arm_budget(ready);
      hooks_.set_version(s, r.to);
      hooks_.spawn(s, "rollout");
      break;
    }
    case RollAction::kSwap: {
      r.new_proven = true;
      Step(step, nw, why);
      // The swap lasts until the old engine has drained (failover.h's drain budget).
      arm_budget(kDrainMs + kStepSlackMs);
      const std::string refusal = hooks_.swap_refusal(old, nw);
      if (!refusal.empty()) {
        Fire(RollEvent::kSwapRefused, refusal);
        break;
      }
      // Its drain's end (OnSlotMoved) fires swapped, inside this call when
      // there is nothing to drain.
      if (!hooks_.swap(old, nw, "rollout: the new version takes the traffic")) {
        Fire(RollEvent::kSwapRefused, "the new engine could not be promoted");
      }
      break;
    }
    case RollAction::kStartWatch:
      // Also a restarted supervisor's resume: the new version serves, proven.
      r.new_proven = true;
      Step(step, nw, why);
      r.watch_elapsed = false;
      watch_->Start(cfg_.supervisor.rollout_watch_ms, [this] {
        if (!roll_) return;
        roll_->watch_elapsed = true;
        MaybeWatchOver();
      });
      // A failover's proof through the front may still be pending at its end.
      arm_budget(cfg_.supervisor.rollout_watch_ms + 30'000 + kStepSlackMs);
      break;
    case RollAction::kStopOld:
      Step(step, old, why);
      arm_budget(stop);
      hooks_.stop(old, "rollout: replacing the old version's engine");
      break;
    case RollAction::kFinish:
      End(why);
      break;
    case RollAction::kRollBack:
      // The old version is the one both slots end on: neither starts the
      // new one again, and the old slot is restored first.
      r.back = true;
      r.cause = why;
      for (const std::string& s : {nw, old}) hooks_.set_version(s, std::nullopt);
      [[fallthrough]];
    case RollAction::kRestoreOld:
      Step(step, old, why);
      // Its restart policy may back off before it starts again.
      arm_budget(cfg_.supervisor.restart_backoff_max_ms + ready);
      RestoreOld();
      break;
    case RollAction::kSwapBack:
      Step(step, old, why);
      // It may wait for a failover's proof through the front (failover.cc).
      arm_budget(kProofMs + kStepSlackMs);
      SwapBack();
      break;
    case RollAction::kRestoreNew:
      if (t->from != RollState::kRestoringNew) {
        Step(step, nw, why);
        arm_budget(kDrainMs + cfg_.engine.stop_timeout_ms + ready);
      }
      RestoreNew();
      break;
  }
  // The step as it is now (the roll may have ended meanwhile): a restarted
  // supervisor resumes from it.
  SaveState();
}

void Rollout::End(const std::string& why) {
  if (!roll_) return;
  Roll r = std::move(*roll_);
  roll_.reset();
  budget_->Stop();
  watch_->Stop();
  const std::string outcome = r.state == RollState::kDone         ? "done"
                              : r.state == RollState::kRolledBack ? "rolled_back"
                              : r.state == RollState::kFailed     ? "failed"
                                                                  : "interrupted";
  // A rolled-back roll says why it was rolled back, not what ended the
  // rollback; a rollback that could not finish says both.
  const std::string reason = outcome == "done"                   ? ""
                             : outcome == "rolled_back"          ? r.cause
                             : outcome == "failed" && r.back     ? "rolling back (" + r.cause + "): " + why
                                                                 : why;
  const int64_t now = clock_.WallMs();
  r.steps.push_back({{"step", outcome}, {"slot", ""}, {"at_ms", now}, {"why", reason}});
  r.rec.steps_json = DumpSteps(r.steps);
  r.rec.outcome = outcome;
  r.rec.reason = reason;
  r.rec.ended_ms = now;
  if (r.rec.id && hooks_.update_row) LedgerError(hooks_.update_row(r.rec), "rollout end");
  if (outcome == "done" || (outcome == "failed" && !r.back)) {
    // The new version is the node's now: later starts of either slot use it.
    hooks_.set_node_version(r.to);
  }
  for (const char* name : kSlots) {
    hooks_.set_version(name, std::nullopt);
    // A slot the roll left down (its budget ran out while it stopped) is
    // started again with the node's version.
    if (Stopping()) continue;
    const SlotState st = View(name).state;
    if (st == SlotState::kStopped) hooks_.spawn(name, "rollout " + outcome);
    if (st == SlotState::kStopping) respawn_after_stop_.insert(name);
  }
  if (hooks_.counted) hooks_.counted(outcome);
  last_ = {{"id", r.rec.id},
           {"outcome", outcome},
           {"reason", reason},
           {"started_ms", r.rec.started_ms},
           {"ended_ms", now},
           {"command_before", r.rec.command_before},
           {"command_after", r.rec.command_after}};
  if (outcome == "done") {
    spdlog::info("rollout #{} done in {} ms: both engines run {}", r.rec.id, now - r.rec.started_ms, r.rec.command_after);
  } else if (outcome == "rolled_back") {
    spdlog::warn("rollout #{} rolled back in {} ms: both engines run {} again; why: {}", r.rec.id,
                 now - r.rec.started_ms, r.rec.command_before, reason);
  } else {
    spdlog::error("rollout #{} {}: {}", r.rec.id, outcome, reason);
  }
  Notify(Notice::kReady, "rollout " + outcome);
  json reply{{"type", "reload"},
             {"ok", outcome == "done"},
             {"outcome", outcome},
             {"rollout_id", r.rec.id},
             {"reason", reason},
             {"ms", now - r.rec.started_ms},
             {"steps", r.steps}};
  if (hooks_.answer) hooks_.answer(std::move(r.waiters), std::move(reply));
  SaveState();
  if (hooks_.status_line) hooks_.status_line();
}

void Rollout::Resume(const RuntimeState::Rollout& p) {
  // The slots as the restarted supervisor adopted them; none for a name
  // that is no slot (the file is read, not trusted).
  const auto nw = hooks_.slot(p.new_slot);
  const auto old = hooks_.slot(p.old_slot);
  const bool two = nw && old && p.new_slot != p.old_slot;
  const int64_t now = clock_.WallMs();
  // Finished when the new version was proven and serves on its slot now
  // (adopted as the active engine); rolled back otherwise: its proof went
  // with its process, or the roll was being rolled back already.
  const bool finish =
      two && p.new_proven && !p.rolling_back && nw->state == SlotState::kActive && nw->runs && *nw->runs == p.to;
  // The node's version until a roll ends is the one it rolled from.
  hooks_.set_node_version(p.from);
  bool adopted_new = false;  // an adopted engine runs another version than the old one
  for (const char* name : kSlots) {
    const SlotView v = View(name);
    adopted_new |= v.has_process && v.runs && !(*v.runs == p.from);
  }
  const bool back = !finish && adopted_new && two;
  std::string reason = "the supervisor restarted during step " + p.step + "; ";
  if (finish) {
    reason += "the new version serves on engine " + p.new_slot + ", proven: the roll is finished";
  } else if (back) {
    reason += "the roll is rolled back" + std::string(p.rolling_back ? " (it was being rolled back: " + p.cause + ")"
                                                                     : ": its new version was not proven serving");
  } else {
    reason += "rolled back: every engine left runs the old version, and the others start with it";
  }
  // The row ends here, with its steps so far.
  RolloutRecord rec;
  rec.id = p.id;
  rec.started_ms = p.started_ms;
  rec.ended_ms = now;
  rec.outcome = "interrupted";
  rec.reason = reason;
  rec.command_before = p.command_before;
  rec.command_after = p.command_after;
  json steps = json::parse(p.steps_json, nullptr, /*allow_exceptions=*/false);
  if (!steps.is_array()) steps = json::array();
  steps.push_back({{"step", "interrupted"}, {"slot", ""}, {"at_ms", now}, {"why", reason}});
  rec.steps_json = DumpSteps(steps);
  if (rec.id == 0 || !hooks_.update_row || !hooks_.update_row(rec).ok()) {
    // Its first write was lost (with the old supervisor, or before): the
    // row is written now, whole.
    rec.id = 0;
    rec.id = RecordRow(rec, "interrupted rollout");
  }
  if (hooks_.counted) hooks_.counted("interrupted");
  last_ = {{"id", rec.id},
           {"outcome", "interrupted"},
           {"reason", reason},
           {"started_ms", rec.started_ms},
           {"ended_ms", now},
           {"command_before", rec.command_before},
           {"command_after", rec.command_after}};
  spdlog::warn("rollout #{} interrupted: {}", rec.id, reason);
  const std::string why = "resuming rollout #" + std::to_string(rec.id) + " after a supervisor restart";
  if (finish) {
    // Replaced by the new version: adopted, after the watch window; not
    // adopted (it was being replaced), started with it.
    BeginRoll(p.new_slot, p.old_slot, p.to,
              old->state == SlotState::kIdle ? RollEvent::kResumeOld : RollEvent::kResumeWatch, why, nullptr);
  } else if (back) {
    BeginRoll(p.new_slot, p.old_slot, p.to, RollEvent::kResumeBack,
              why + ": rollout #" + std::to_string(rec.id) + " was interrupted " +
                  (p.rolling_back ? "while it was rolled back (" + p.cause + ")"
                                  : "before its new version was proven serving"),
              nullptr);
  }
  SaveState();
}

std::optional<RuntimeState::Rollout> Rollout::Record() const {
  if (!roll_) return std::nullopt;
  RuntimeState::Rollout ro;
  ro.id = roll_->rec.id;
  ro.step = RollStateName(roll_->state);
  ro.new_slot = roll_->new_slot;
  ro.old_slot = roll_->old_slot;
  ro.started_ms = roll_->rec.started_ms;
  ro.from = roll_->from;
  ro.to = roll_->to;
  ro.new_proven = roll_->new_proven;
  ro.rolling_back = RollingBack(roll_->state);
  ro.cause = roll_->cause;
  ro.command_before = roll_->rec.command_before;
  ro.command_after = roll_->rec.command_after;
  ro.steps_json = DumpSteps(roll_->steps);
  return ro;
}

json Rollout::StatusJson() const {
  json j = json::object();
  if (roll_) {
    j["in_progress"] = true;
    j["id"] = roll_->rec.id;
    j["step"] = RollStateName(roll_->state);
    j["new_slot"] = roll_->new_slot;
    j["old_slot"] = roll_->old_slot;
    j["started_ms"] = roll_->rec.started_ms;
    j["step_since_ms"] = roll_->step_since_ms;
    j["command_before"] = roll_->rec.command_before;
    j["command_after"] = roll_->rec.command_after;
    j["rolling_back"] = RollingBack(roll_->state);
  } else {
    j["in_progress"] = false;
  }
  if (!last_.is_null()) j["last"] = last_;
  return j;
}

}  // namespace wsup
