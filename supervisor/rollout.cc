// `wsup reload`: the config file read again, what can change at once
// applied, and a changed engine version rolled through the standby first
// (supervisor/rollout_fsm.h for the steps, reload_plan.h for what may
// change).
#include <spdlog/spdlog.h>

#include <cstdlib>

#include "common/log.h"
#include "supervisor/supervisor_impl.h"

namespace wsup {

using nlohmann::json;

namespace {

// A step that takes longer than this (beyond the engine's own start budget)
// ends the roll: rolled back before the swap, failed after it.
constexpr int64_t kStepSlackMs = 60'000;
// A planned swap's drain budget (control.cc), and how long a failover may
// wait for its proof through the front (failover.cc).
constexpr int64_t kDrainMs = 30'000;
constexpr int64_t kProofMs = 120'000;

}  // namespace

void Supervisor::Impl::Reload(const std::shared_ptr<JsonConn>& c, const std::string& why,
                              const std::vector<std::string>& sets) {
  auto reply = [c](json j) {
    j["type"] = "reload";
    if (c && c->alive()) c->Send(j);
  };
  // Every refusal is logged: a SIGHUP's has no one else to be told to.
  auto refuse = [&](const std::string& error, const json& changes) {
    spdlog::warn("reload ({}) refused: {}", why, error);
    json j{{"ok", false}, {"outcome", "refused"}, {"error", error}};
    if (!changes.is_null()) j["changes"] = changes;
    reply(j);
  };
  if (stopping_) {
    refuse("the node is stopping", json());
    return;
  }
  if (roll_) {
    // Never two at once: the second is refused, and says how to follow the first.
    const int64_t secs = (clock_.WallMs() - roll_->rec.started_ms) / 1000;
    refuse("a rollout is in progress (step " + std::string(RollStateName(roll_->state)) + ", started " +
               std::to_string(secs) + " s ago); wait until `wsup status` shows it ended, then reload again",
           json());
    return;
  }
  // `wsup reload --set`: on top of the overrides the node was started (or
  // last reloaded) with, and kept for the next reload once applied.
  auto next = LoadConfig(cfg_.path, MergeOverrides(cfg_.overrides, sets));
  if (!next.ok()) {
    spdlog::error("reload ({}): {}; the node keeps running as it is", why, next.error().message());
    reply({{"ok", false}, {"outcome", "refused"}, {"error", next.error().message()}});
    return;
  }
  // What the live slots run, not only what the running config says.
  std::vector<SlotVersion> running;
  for (Slot* s : {&a_, &b_}) {
    if (s->pid > 0 && s->runs) running.push_back({s->name, *s->runs});
  }
  ReloadPlan plan = PlanReload(cfg_, *next, running);
  json changes = json::array();
  for (const auto& ch : plan.changes) {
    json cj{{"key", ch.key}, {"effect", ReloadEffectName(ch.effect)}, {"where", ch.where}};
    if (!ch.note.empty()) cj["note"] = ch.note;
    changes.push_back(cj);
  }
  if (!plan.refused.empty()) {
    std::string all;
    for (const auto& e : plan.refused) all += (all.empty() ? "" : "\n") + e.message();
    spdlog::error("reload ({}) refused; the node keeps running as it is:\n{}", why, all);
    RolloutRecord rec;
    rec.started_ms = clock_.WallMs();
    rec.ended_ms = rec.started_ms;
    rec.outcome = "refused";
    rec.reason = all;
    rec.command_before = EngineVersionText(cfg_);
    rec.command_after = EngineVersionText(*next);
    LedgerResult(ledger_->RecordRollout(rec), "rollout");
    reply({{"ok", false}, {"outcome", "refused"}, {"error", all}, {"changes", changes}});
    return;
  }
  if (plan.changes.empty()) {
    cfg_.overrides = next->overrides;
    reply({{"ok", true}, {"outcome", "unchanged"}, {"changes", changes}});
    return;
  }
  Slot* act = Active();
  Slot* stby = act ? Other(act) : nullptr;
  if (plan.roll()) {
    // All or nothing: a roll that cannot begin leaves every setting as it was.
    std::string refusal = !act                                   ? "no active engine serves"
                          : stby->state != SlotState::kStandby   ? "the standby (" + stby->name + ") is " +
                                                                     SlotStateName(stby->state) + ", not proven ready"
                          : pending_                             ? PendingText()
                                                                 : "";
    if (!refusal.empty()) {
      refuse(refusal + "; a rollout needs an active engine, a proven standby and no failover in progress: reload "
                       "again once `wsup status` shows both engines and failover.in_progress false",
             changes);
      return;
    }
  }
  ApplyAtOnce(*next, plan);
  cfg_.overrides = next->overrides;
  if (!plan.roll()) {
    spdlog::info("reload ({}): {} change(s) applied at once", why, plan.changes.size());
    reply({{"ok", true}, {"outcome", "applied"}, {"changes", changes}});
    return;
  }
  BeginRoll(stby->name, act->name, VersionOf(*next), RollEvent::kBegin, why, c);
}

void Supervisor::Impl::BeginRoll(const std::string& new_slot, const std::string& old_slot, const EngineVersion& to,
                                 RollEvent first, const std::string& why, const std::shared_ptr<JsonConn>& c) {
  roll_.emplace();
  Roll& r = *roll_;
  r.new_slot = new_slot;
  r.old_slot = old_slot;
  r.from = VersionOf(cfg_);
  r.to = to;
  if (!roll_budget_) roll_budget_ = timers_.Make();
  if (!roll_watch_) roll_watch_ = timers_.Make();
  if (c) r.waiters.push_back(c);
  r.rec.started_ms = clock_.WallMs();
  r.rec.outcome = "running";
  r.rec.command_before = VersionText(r.from);
  r.rec.command_after = VersionText(r.to);
  auto id = LedgerResult(ledger_->RecordRollout(r.rec), "rollout");
  r.rec.id = id ? *id : 0;
  notifier_.Reloading("rolling the engines to a new version");
  spdlog::info("rollout #{} ({}): engine {} (standby) first, then {}; from {} to {}", r.rec.id, why, r.new_slot,
               r.old_slot, r.rec.command_before, r.rec.command_after);
  RollFire(first, why);
}

std::string Supervisor::Impl::VersionText(const EngineVersion& v) const { return EngineVersionText(WithVersion(cfg_, v)); }

void Supervisor::Impl::ApplyAtOnce(const Config& next, const ReloadPlan& plan) {
  if (!plan.at_once()) return;
  // Everything but the engine version: that one goes slot by slot.
  Config::Engine engine = cfg_.engine;
  engine.ready_timeout_ms = next.engine.ready_timeout_ms;
  engine.stop_timeout_ms = next.engine.stop_timeout_ms;
  bool probe_changed = false;
  for (const auto& ch : plan.changes) probe_changed |= ch.key.rfind("probe.", 0) == 0;
  cfg_.probe = next.probe;
  cfg_.supervisor = next.supervisor;
  cfg_.front.queue_timeout_ms = next.front.queue_timeout_ms;
  cfg_.front.max_queued = next.front.max_queued;
  cfg_.front.hedge_after_ms = next.front.hedge_after_ms;
  cfg_.front.hedge_percent = next.front.hedge_percent;
  cfg_.front.hedge_burst = next.front.hedge_burst;
  cfg_.engine = engine;
  cfg_.where = next.where;
  if (!std::getenv("WSUP_LOG_LEVEL")) spdlog::set_level(spdlog::level::from_str(cfg_.supervisor.log_level));
  for (Slot* s : {&a_, &b_}) s->throttle.set_policy(EngineRestartPolicy(cfg_));
  holders_.SetRestartPolicy(HolderRestartPolicy(cfg_));
  front_.SetRestartPolicy(FrontRestartPolicy(cfg_));
  if (probe_changed) {
    // Probes of the new shape from now on; a monitor starts over, the
    // engine's role does not change.
    for (Slot* s : {&a_, &b_}) {
      if (s->monitor && IsLive(s->state) && s->state != SlotState::kStarting) {
        s->monitor->Stop();
        StartProbing(*s);
      }
    }
  }
  front_.PushLimits();
  for (const auto& ch : plan.changes) {
    if (ch.effect == ReloadEffect::kAtOnce) spdlog::info("reload: {} = {} (was {}), at once", ch.key, ch.after, ch.before);
  }
}

void Supervisor::Impl::RollOnSlotMoved(Slot& s, SlotState from, SlotState to, const std::string& cause) {
  if (from == to) return;
  if (!roll_) {
    // A slot a roll that ended was still stopping: back with the node's version.
    if (to == SlotState::kStopped && s.respawn_after_stop && !stopping_) {
      s.respawn_after_stop = false;
      RollSpawn(s, "rollout rolled back");
    }
    return;
  }
  // Each branch returns after RollFire: the roll may have ended in it.
  const RollState step = roll_->state;
  const bool is_new = s.name == roll_->new_slot;
  const bool is_old = s.name == roll_->old_slot;
  if (!is_new && !is_old) return;
  const std::string who = "engine " + s.name;
  if (to == SlotState::kStopped) {
    RollFire(RollEvent::kStopped, who + " stopped");
  } else if (to == SlotState::kFailed) {
    RollFire(is_new ? RollEvent::kNewFailed : RollEvent::kOldFailed, who + " failed: " + cause);
  } else if (to == SlotState::kStandby && (from == SlotState::kWarming || from == SlotState::kStarting)) {
    RollFire(is_new ? RollEvent::kNewProven : RollEvent::kOldProven, who + " proven: " + cause);
  } else if (to == SlotState::kStandby && from == SlotState::kDraining) {
    if (is_old && step == RollState::kSwapping) {
      RollFire(RollEvent::kSwapped, who + " drained; engine " + roll_->new_slot + " serves the new version");
    } else if (is_old && step == RollState::kRestoringOld) {
      RollFire(RollEvent::kOldProven, who + " drained: a standby on the old version");
    } else if (is_new && step == RollState::kRestoringNew) {
      RollFire(RollEvent::kNewDrained, who + " drained");
    }
  } else if (to == SlotState::kActive && is_old && step == RollState::kRestoringOld) {
    // A failover put the old version back in front.
    RollFire(RollEvent::kOldProven, who + " serves the old version again: " + cause);
  }
}

void Supervisor::Impl::RollSpawnFailed(Slot& s, const std::string& why) {
  spdlog::error("engine {}: the rollout's version cannot be started: {}", s.name, why);
  if (!roll_) return;
  RollFire(s.name == roll_->new_slot ? RollEvent::kNewFailed : RollEvent::kOldFailed,
           "engine " + s.name + " could not be started with the new version: " + why);
}

void Supervisor::Impl::RollMaybeWatchOver() {
  if (!roll_ || roll_->state != RollState::kWatching || !roll_->watch_elapsed) return;
  Slot* old = SlotByName(roll_->old_slot);
  if (old && old->state == SlotState::kStandby && !pending_) {
    RollFire(RollEvent::kWatchOver, "the new version served through the watch window");
  }
}

void Supervisor::Impl::RollOnFailoverEnded() {
  // A step that waits for no failover to be in progress goes on.
  if (!roll_) return;
  if (roll_->state == RollState::kWatching) {
    RollMaybeWatchOver();
  } else if (roll_->state == RollState::kSwappingBack && roll_->swap_back_waits) {
    RollSwapBack();
  }
}

void Supervisor::Impl::RollSpawn(Slot& s, const std::string& cause) {
  s.recovery_cause = cause;
  s.recovery_fault_ms = clock_.WallMs();
  s.recovery_failover_id.reset();
  // Off the exit's own handling (this may run inside it), and not before
  // the engines may start at all: a restarted supervisor waits for its
  // holders, and StartEngines() starts an idle slot then.
  std::string name = s.name;
  After(0, [this, name] {
    Slot* sp = SlotByName(name);
    if (sp && !stopping_ && engines_started_ && (sp->state == SlotState::kStopped || sp->state == SlotState::kIdle)) {
      SpawnEngine(*sp);
    }
  });
}

void Supervisor::Impl::RollRestoreOld() {
  Slot* old = SlotByName(roll_->old_slot);
  if (old->state == SlotState::kActive || old->state == SlotState::kStandby) {
    RollFire(RollEvent::kOldProven, "engine " + old->name + (old->state == SlotState::kActive ? " serves" : " is a standby") +
                                        " on the old version");
  } else if (old->state == SlotState::kStopped || old->state == SlotState::kIdle) {
    RollSpawn(*old, "rollout rolled back");
  } else if (old->state == SlotState::kFailed && old->pid == 0 && !old->restart_timer->active()) {
    ScheduleRestart(*old, -1);
  }
  // Otherwise its next move says: a failed one is restarted by its restart
  // policy (with the old version), a draining one becomes a standby.
}

void Supervisor::Impl::RollSwapBack() {
  Slot* nw = SlotByName(roll_->new_slot);
  Slot* old = SlotByName(roll_->old_slot);
  if (nw->state != SlotState::kActive) {
    RollFire(RollEvent::kSwapped, "engine " + nw->name + " does not serve: no traffic to move back");
    return;
  }
  if (pending_) {
    // The failover's own proof first (RollOnFailoverEnded).
    roll_->swap_back_waits = true;
    spdlog::info("rollout #{}: the traffic moves back to engine {} once the failover in progress ends", roll_->rec.id,
                 old->name);
    return;
  }
  roll_->swap_back_waits = false;
  const std::string refusal = SwapRefusal(nw, old);
  if (!refusal.empty()) {
    RollFire(RollEvent::kSwapRefused, refusal);
    return;
  }
  if (!PlannedSwap(*nw, *old, "rollout rolled back: the old version takes the traffic back", nullptr)) {
    // An unfit old engine failed (and moved the roll back to restoring_old).
    RollFire(RollEvent::kSwapRefused, "engine " + old->name + " could not be promoted");
    return;
  }
  RollFire(RollEvent::kSwapped, "engine " + old->name + " serves the old version again");
}

void Supervisor::Impl::RollRestoreNew() {
  Slot* nw = SlotByName(roll_->new_slot);
  // Unknown (a process an older wsup started): taken as the node's.
  const bool runs_old = !nw->runs || *nw->runs == VersionOf(cfg_);
  switch (nw->state) {
    case SlotState::kStandby:
      if (runs_old) {
        RollFire(RollEvent::kNewProven, "engine " + nw->name + " is a standby on the old version");
      } else {
        Fire(*nw, SlotEvent::kStop, "rollout rolled back: replacing the new version's engine");
      }
      break;
    case SlotState::kStarting:
    case SlotState::kWarming:
      // The old version's start is waited for; the new one's is replaced.
      if (!runs_old) Fire(*nw, SlotEvent::kStop, "rollout rolled back: replacing the new version's engine");
      break;
    case SlotState::kStopped:
    case SlotState::kIdle:
      RollSpawn(*nw, "rollout rolled back");
      break;
    case SlotState::kFailed:
      // Re-armed with the old version at once (ScheduleRestart), once its
      // exit is seen; one seen already and not scheduled is scheduled now.
      if (nw->pid == 0 && !nw->restart_timer->active()) ScheduleRestart(*nw, -1);
      break;
    case SlotState::kActive:    // a failover put it in front: the old slot's failure moves the roll back first
    case SlotState::kDraining:  // new_drained
    case SlotState::kStopping:  // stopped
      break;
  }
}

void Supervisor::Impl::RollStep(const std::string& step, const std::string& slot, const std::string& why) {
  Roll& r = *roll_;
  r.steps.push_back({{"step", step}, {"slot", slot}, {"at_ms", clock_.WallMs()}, {"why", why}});
  r.step_since_ms = clock_.WallMs();
  r.rec.steps_json = r.steps.dump(-1, ' ', false, json::error_handler_t::replace);
  if (r.rec.id) LedgerResult(ledger_->UpdateRollout(r.rec), "rollout step");
  notifier_.Status("rollout: " + step + (slot.empty() ? "" : " (engine " + slot + ")"));
}

void Supervisor::Impl::RollFire(RollEvent event, const std::string& why) {
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
  Slot* nw = SlotByName(r.new_slot);
  Slot* old = SlotByName(r.old_slot);
  const int64_t ready = cfg_.engine.ready_timeout_ms + kStepSlackMs;
  const int64_t stop = cfg_.engine.stop_timeout_ms + kStepSlackMs;
  auto arm_budget = [this](int64_t ms) {
    roll_budget_->Start(ms, [this] { RollFire(RollEvent::kTimeout, "the step's budget ran out"); });
  };
  const std::string step = RollStateName(r.state);
  // Every action ends with its own break: an event fired inside one (a
  // swap made at once, a slot proven already) may end the roll, and `r`
  // with it.
  switch (t->action) {
    case RollAction::kNone:
      break;
    case RollAction::kStopStandby:
      RollStep(step, nw->name, why);
      arm_budget(stop);
      Fire(*nw, SlotEvent::kStop, "rollout: replacing the standby with the new version");
      break;
    case RollAction::kSpawnNew:
    case RollAction::kSpawnOld: {
      Slot* s = t->action == RollAction::kSpawnNew ? nw : old;
      RollStep(step, s->name, why);
      arm_budget(ready);
      s->version = r.to;
      RollSpawn(*s, "rollout");
      break;
    }
    case RollAction::kSwap: {
      r.new_proven = true;
      RollStep(step, nw->name, why);
      // The swap lasts until the old engine has drained (control.cc's budget).
      arm_budget(kDrainMs + kStepSlackMs);
      const std::string refusal = SwapRefusal(old, nw);
      if (!refusal.empty()) {
        RollFire(RollEvent::kSwapRefused, refusal);
        break;
      }
      // Its drain's end (RollOnSlotMoved) fires swapped, inside this call
      // when there is nothing to drain.
      if (!PlannedSwap(*old, *nw, "rollout: the new version takes the traffic", nullptr)) {
        RollFire(RollEvent::kSwapRefused, "the new engine could not be promoted");
      }
      break;
    }
    case RollAction::kStartWatch:
      // Also a restarted supervisor's resume: the new version serves, proven.
      r.new_proven = true;
      RollStep(step, nw->name, why);
      r.watch_elapsed = false;
      roll_watch_->Start(cfg_.supervisor.rollout_watch_ms, [this] {
        if (!roll_) return;
        roll_->watch_elapsed = true;
        RollMaybeWatchOver();
      });
      // A failover's proof through the front may still be pending at its end.
      arm_budget(cfg_.supervisor.rollout_watch_ms + 30'000 + kStepSlackMs);
      break;
    case RollAction::kStopOld:
      RollStep(step, old->name, why);
      arm_budget(stop);
      Fire(*old, SlotEvent::kStop, "rollout: replacing the old version's engine");
      break;
    case RollAction::kFinish:
      RollEnd(why);
      break;
    case RollAction::kRollBack:
      // The old version is the one both slots end on: neither starts the
      // new one again, and the old slot is restored first.
      r.back = true;
      r.cause = why;
      for (Slot* s : {nw, old}) s->version.reset();
      [[fallthrough]];
    case RollAction::kRestoreOld:
      RollStep(step, old->name, why);
      // Its restart policy may back off before it starts again.
      arm_budget(cfg_.supervisor.restart_backoff_max_ms + ready);
      RollRestoreOld();
      break;
    case RollAction::kSwapBack:
      RollStep(step, old->name, why);
      // It may wait for a failover's proof through the front (failover.cc).
      arm_budget(kProofMs + kStepSlackMs);
      RollSwapBack();
      break;
    case RollAction::kRestoreNew:
      if (t->from != RollState::kRestoringNew) {
        RollStep(step, nw->name, why);
        arm_budget(kDrainMs + cfg_.engine.stop_timeout_ms + ready);
      }
      RollRestoreNew();
      break;
  }
  // The step as it is now (the roll may have ended meanwhile): a restarted
  // supervisor resumes from it.
  SaveState();
}

void Supervisor::Impl::RollEnd(const std::string& why) {
  if (!roll_) return;
  Roll r = std::move(*roll_);
  roll_.reset();
  roll_budget_->Stop();
  roll_watch_->Stop();
  const std::string outcome = r.state == RollState::kDone         ? "done"
                              : r.state == RollState::kRolledBack ? "rolled_back"
                              : r.state == RollState::kFailed     ? "failed"
                                                                  : "interrupted";
  // A rolled-back roll says why it was rolled back, not what ended the
  // rollback; a rollback that could not finish says both.
  const std::string reason = outcome == "done"          ? ""
                             : outcome == "rolled_back" ? r.cause
                             : outcome == "failed" && r.back ? "rolling back (" + r.cause + "): " + why
                                                             : why;
  const int64_t now = clock_.WallMs();
  r.steps.push_back({{"step", outcome}, {"slot", ""}, {"at_ms", now}, {"why", reason}});
  r.rec.steps_json = r.steps.dump(-1, ' ', false, json::error_handler_t::replace);
  r.rec.outcome = outcome;
  r.rec.reason = reason;
  r.rec.ended_ms = now;
  if (r.rec.id) LedgerResult(ledger_->UpdateRollout(r.rec), "rollout end");
  if (outcome == "done" || (outcome == "failed" && !r.back)) {
    // The new version is the node's now: later starts of either slot use it.
    cfg_.engine.command = r.to.command;
    cfg_.engine.env = r.to.env;
  }
  for (Slot* s : {&a_, &b_}) {
    s->version.reset();
    // A slot the roll left down (its budget ran out while it stopped) is
    // started again with the node's version.
    if (stopping_) continue;
    if (s->state == SlotState::kStopped) RollSpawn(*s, "rollout " + outcome);
    if (s->state == SlotState::kStopping) s->respawn_after_stop = true;
  }
  metrics_.rollouts[outcome]++;
  last_roll_ = {{"id", r.rec.id},       {"outcome", outcome},          {"reason", reason},
                {"started_ms", r.rec.started_ms}, {"ended_ms", now}, {"command_before", r.rec.command_before},
                {"command_after", r.rec.command_after}};
  if (outcome == "done") {
    spdlog::info("rollout #{} done in {} ms: both engines run {}", r.rec.id, now - r.rec.started_ms, r.rec.command_after);
  } else if (outcome == "rolled_back") {
    spdlog::warn("rollout #{} rolled back in {} ms: both engines run {} again; why: {}", r.rec.id,
                 now - r.rec.started_ms, r.rec.command_before, reason);
  } else {
    spdlog::error("rollout #{} {}: {}", r.rec.id, outcome, reason);
  }
  notifier_.Ready("rollout " + outcome);
  json reply{{"type", "reload"},
             {"ok", outcome == "done"},
             {"outcome", outcome},
             {"rollout_id", r.rec.id},
             {"reason", reason},
             {"ms", now - r.rec.started_ms},
             {"steps", r.steps}};
  ReplyWhenRecorded(ledger_->QueuedSeq(), std::move(r.waiters), std::move(reply), clock_.MonotonicMs());
  SaveState();
  UpdateStatusLine();
}

void Supervisor::Impl::ResumeRoll(const RuntimeState::Rollout& p) {
  Slot* nw = SlotByName(p.new_slot);
  Slot* old = SlotByName(p.old_slot);
  const int64_t now = clock_.WallMs();
  // Finished when the new version was proven and serves on its slot now
  // (adopted as the active engine); rolled back otherwise: its proof went
  // with its process, or the roll was being rolled back already.
  const bool finish = nw && old && nw != old && p.new_proven && !p.rolling_back &&
                      nw->state == SlotState::kActive && nw->runs && *nw->runs == p.to;
  // The node's version until a roll ends is the one it rolled from.
  cfg_.engine.command = p.from.command;
  cfg_.engine.env = p.from.env;
  bool adopted_new = false;  // an adopted engine runs another version than the old one
  for (Slot* s : {&a_, &b_}) adopted_new |= s->pid > 0 && s->runs && !(*s->runs == p.from);
  const bool back = !finish && adopted_new && nw && old && nw != old;
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
  rec.steps_json = steps.dump(-1, ' ', false, json::error_handler_t::replace);
  if (rec.id == 0 || !ledger_->UpdateRollout(rec).ok()) {
    // Its first write was lost (with the old supervisor, or before): the
    // row is written now, whole.
    rec.id = 0;
    auto id = LedgerResult(ledger_->RecordRollout(rec), "interrupted rollout");
    rec.id = id ? *id : 0;
  }
  metrics_.rollouts["interrupted"]++;
  last_roll_ = {{"id", rec.id},       {"outcome", "interrupted"},    {"reason", reason},
                {"started_ms", rec.started_ms}, {"ended_ms", now}, {"command_before", rec.command_before},
                {"command_after", rec.command_after}};
  spdlog::warn("rollout #{} interrupted: {}", rec.id, reason);
  const std::string why = "resuming rollout #" + std::to_string(rec.id) + " after a supervisor restart";
  if (finish) {
    // Replaced by the new version: adopted, after the watch window; not
    // adopted (it was being replaced), started with it.
    BeginRoll(nw->name, old->name, p.to,
              old->state == SlotState::kIdle ? RollEvent::kResumeOld : RollEvent::kResumeWatch, why, nullptr);
  } else if (back) {
    BeginRoll(nw->name, old->name, p.to, RollEvent::kResumeBack,
              why + ": rollout #" + std::to_string(rec.id) + " was interrupted " +
                  (p.rolling_back ? "while it was rolled back (" + p.cause + ")" : "before its new version was proven serving"),
              nullptr);
  }
  SaveState();
}

json Supervisor::Impl::RollStatusJson() const {
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
  if (!last_roll_.is_null()) j["last"] = last_roll_;
  return j;
}

}  // namespace wsup
