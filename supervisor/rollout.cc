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

}  // namespace

void Supervisor::Impl::Reload(std::shared_ptr<JsonConn> c, const std::string& why) {
  auto reply = [c](json j) {
    j["type"] = "reload";
    if (c && c->alive()) c->Send(j);
  };
  if (stopping_) {
    reply({{"ok", false}, {"outcome", "refused"}, {"error", "the node is stopping"}});
    return;
  }
  if (roll_) {
    // Never two at once: the second is refused, and says how to follow the first.
    const int64_t secs = (clock_.WallMs() - roll_->rec.started_ms) / 1000;
    reply({{"ok", false},
           {"outcome", "refused"},
           {"error", "a rollout is in progress (step " + std::string(RollStateName(roll_->state)) + ", started " +
                         std::to_string(secs) + " s ago); wait until `wsup status` shows it ended, then reload again"}});
    return;
  }
  auto next = LoadConfig(cfg_.path, cfg_.overrides);
  if (!next.ok()) {
    spdlog::error("reload ({}): {}; the node keeps running as it is", why, next.error().message());
    reply({{"ok", false}, {"outcome", "refused"}, {"error", next.error().message()}});
    return;
  }
  ReloadPlan plan = PlanReload(cfg_, *next);
  json changes = json::array();
  for (const auto& ch : plan.changes) {
    changes.push_back({{"key", ch.key}, {"effect", ReloadEffectName(ch.effect)}, {"where", ch.where}});
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
    reply({{"ok", true}, {"outcome", "unchanged"}, {"changes", changes}});
    return;
  }
  Slot* act = Active();
  Slot* stby = act ? Other(act) : nullptr;
  if (plan.roll()) {
    // All or nothing: a roll that cannot begin leaves every setting as it was.
    std::string refuse = !act                                   ? "no active engine serves"
                         : stby->state != SlotState::kStandby   ? "the standby (" + stby->name + ") is " +
                                                                    SlotStateName(stby->state) + ", not proven ready"
                         : pending_                             ? PendingText()
                                                                : "";
    if (!refuse.empty()) {
      refuse += "; a rollout needs an active engine, a proven standby and no failover in progress: reload again once "
                "`wsup status` shows both engines and failover.in_progress false";
      reply({{"ok", false}, {"outcome", "refused"}, {"error", refuse}, {"changes", changes}});
      return;
    }
  }
  ApplyAtOnce(*next, plan);
  if (!plan.roll()) {
    spdlog::info("reload ({}): {} change(s) applied at once", why, plan.changes.size());
    reply({{"ok", true}, {"outcome", "applied"}, {"changes", changes}});
    return;
  }
  roll_.emplace();
  Roll& r = *roll_;
  r.new_slot = stby->name;
  r.old_slot = act->name;
  r.next = std::move(*next);
  if (!roll_budget_) roll_budget_ = timers_.Make();
  if (!roll_watch_) roll_watch_ = timers_.Make();
  if (c) r.waiters.push_back(c);
  r.rec.started_ms = clock_.WallMs();
  r.rec.outcome = "running";
  r.rec.command_before = EngineVersionText(cfg_);
  r.rec.command_after = EngineVersionText(r.next);
  auto id = LedgerResult(ledger_->RecordRollout(r.rec), "rollout");
  r.rec.id = id ? *id : 0;
  notifier_.Reloading("rolling the engines to a new version");
  spdlog::info("rollout #{} ({}): engine {} (standby) first, then {}; from {} to {}", r.rec.id, why, r.new_slot,
               r.old_slot, r.rec.command_before, r.rec.command_after);
  RollFire(RollEvent::kBegin, why);
}

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
  for (auto& h : holders_) h->throttle.set_policy(HolderRestartPolicy(cfg_));
  front_.throttle.set_policy(FrontRestartPolicy(cfg_));
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
  PushFrontLimits();
  for (const auto& ch : plan.changes) {
    if (ch.effect == ReloadEffect::kAtOnce) spdlog::info("reload: {} = {} (was {}), at once", ch.key, ch.after, ch.before);
  }
}

void Supervisor::Impl::RollOnSlotMoved(Slot& s, SlotState from, SlotState to, const std::string& cause) {
  if (from == to) return;
  if (!roll_) {
    // A slot a rolled-back roll was still stopping: back with the old version.
    if (to == SlotState::kStopped && s.respawn_after_stop && !stopping_) {
      s.respawn_after_stop = false;
      std::string name = s.name;
      After(0, [this, name] {
        Slot* sp = SlotByName(name);
        if (sp && !stopping_ && sp->state == SlotState::kStopped) SpawnEngine(*sp);
      });
    }
    return;
  }
  const Roll& r = *roll_;
  const bool is_new = s.name == r.new_slot;
  const bool is_old = s.name == r.old_slot;
  if (!is_new && !is_old) return;
  if (to == SlotState::kStopped) {
    RollFire(RollEvent::kStopped, "engine " + s.name + " stopped");
  } else if (to == SlotState::kFailed) {
    RollFire(is_new ? RollEvent::kNewFailed : RollEvent::kOldFailed, "engine " + s.name + " failed: " + cause);
  } else if (to == SlotState::kStandby && (from == SlotState::kWarming || from == SlotState::kStarting)) {
    RollFire(is_new ? RollEvent::kNewProven : RollEvent::kOldProven, "engine " + s.name + " proven: " + cause);
  } else if (to == SlotState::kStandby && from == SlotState::kDraining && is_old) {
    RollMaybeWatchOver();
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

void Supervisor::Impl::RollStep(const std::string& step, const std::string& slot, const std::string& why) {
  Roll& r = *roll_;
  r.steps.push_back({{"step", step}, {"slot", slot}, {"at_ms", clock_.WallMs()}, {"why", why}});
  r.step_since_ms = clock_.WallMs();
  r.rec.steps_json = r.steps.dump();
  if (r.rec.id) LedgerResult(ledger_->UpdateRollout(r.rec), "rollout step");
  notifier_.Status("rollout: " + step + (slot.empty() ? "" : " (engine " + slot + ")"));
}

void Supervisor::Impl::RollFire(RollEvent event, const std::string& why) {
  if (!roll_) return;
  Roll& r = *roll_;
  auto t = NextRollTransition(r.state, event);
  if (!t) {
    spdlog::debug("rollout: event {} ignored in step {} ({})", RollEventName(event), RollStateName(r.state), why);
    return;
  }
  spdlog::info("rollout #{}: {} --{}--> {} [{}] {}", r.rec.id, RollStateName(t->from), RollEventName(event),
               RollStateName(t->to), RollActionName(t->action), why);
  r.state = t->to;
  Slot* nw = SlotByName(r.new_slot);
  Slot* old = SlotByName(r.old_slot);
  const int64_t budget = cfg_.engine.ready_timeout_ms + kStepSlackMs;
  auto arm_budget = [this](int64_t ms) {
    roll_budget_->Start(ms, [this] { RollFire(RollEvent::kTimeout, "the step's budget ran out"); });
  };
  Config::Engine version = r.next.engine;
  switch (t->action) {
    case RollAction::kNone:
      break;
    case RollAction::kStopStandby:
      RollStep(RollStateName(r.state), nw->name, why);
      arm_budget(cfg_.engine.stop_timeout_ms + kStepSlackMs);
      Fire(*nw, SlotEvent::kStop, "rollout: replacing the standby with the new version");
      break;
    case RollAction::kSpawnNew:
    case RollAction::kSpawnOld: {
      Slot* s = t->action == RollAction::kSpawnNew ? nw : old;
      RollStep(RollStateName(r.state), s->name, why);
      arm_budget(budget);
      s->version = version;
      s->recovery_cause = "rollout";
      s->recovery_fault_ms = clock_.WallMs();
      // Off the exit's own handling (this runs inside it).
      std::string name = s->name;
      After(0, [this, name] {
        Slot* sp = SlotByName(name);
        if (sp && roll_ && (sp->state == SlotState::kStopped || sp->state == SlotState::kIdle)) SpawnEngine(*sp);
      });
      break;
    }
    case RollAction::kSwap: {
      RollStep(RollStateName(r.state), nw->name, why);
      roll_budget_->Stop();
      std::string refuse = SwapRefusal(old, nw);
      if (!refuse.empty()) {
        RollFire(RollEvent::kSwapRefused, refuse);
        break;
      }
      if (!PlannedSwap(*old, *nw, "rollout: the new version takes the traffic", nullptr)) {
        RollFire(RollEvent::kSwapRefused, "the new engine could not be promoted");
        break;
      }
      RollFire(RollEvent::kSwapped, "engine " + nw->name + " serves the new version");
      break;
    }
    case RollAction::kStartWatch:
      RollStep(RollStateName(r.state), nw->name, why);
      r.watch_elapsed = false;
      roll_watch_->Start(cfg_.supervisor.rollout_watch_ms, [this] {
        if (!roll_) return;
        roll_->watch_elapsed = true;
        RollMaybeWatchOver();
      });
      // The drain may take longer than the window; it ends the window then.
      arm_budget(cfg_.supervisor.rollout_watch_ms + 30'000 + kStepSlackMs);
      break;
    case RollAction::kStopOld:
      RollStep(RollStateName(r.state), old->name, why);
      arm_budget(cfg_.engine.stop_timeout_ms + kStepSlackMs);
      Fire(*old, SlotEvent::kStop, "rollout: replacing the old version's engine");
      break;
    case RollAction::kFinish:
      RollEnd(r.state == RollState::kDone ? "done" : "failed", r.state == RollState::kDone ? "" : why);
      break;
    case RollAction::kRollBack: {
      // The old version serves: the slots drop the new one, and a slot left
      // down by the roll (stopped) is started again with the old version.
      const std::string reason = why;
      for (Slot* s : {nw, old}) {
        s->version.reset();
        if (s->state == SlotState::kStopped || s->state == SlotState::kStopping) {
          s->recovery_cause = "rollout rolled back";
          s->recovery_fault_ms = clock_.WallMs();
          std::string name = s->name;
          if (s->state == SlotState::kStopping) {
            s->respawn_after_stop = true;  // started again once its exit comes
            continue;
          }
          After(0, [this, name] {
            Slot* sp = SlotByName(name);
            if (sp && !stopping_ && sp->state == SlotState::kStopped) SpawnEngine(*sp);
          });
        }
      }
      RollEnd("rolled_back", reason);
      break;
    }
  }
}

void Supervisor::Impl::RollEnd(const std::string& outcome, const std::string& reason) {
  if (!roll_) return;
  Roll r = std::move(*roll_);
  roll_.reset();
  roll_budget_->Stop();
  roll_watch_->Stop();
  const int64_t now = clock_.WallMs();
  r.steps.push_back({{"step", outcome}, {"slot", ""}, {"at_ms", now}, {"why", reason}});
  r.rec.steps_json = r.steps.dump();
  r.rec.outcome = outcome;
  r.rec.reason = reason;
  r.rec.ended_ms = now;
  if (r.rec.id) LedgerResult(ledger_->UpdateRollout(r.rec), "rollout end");
  if (outcome == "done" || outcome == "failed") {
    // The new version is the node's now: later starts of either slot use it.
    cfg_.engine.command = r.next.engine.command;
    cfg_.engine.env = r.next.engine.env;
    for (Slot* s : {&a_, &b_}) s->version.reset();
  }
  metrics_.rollouts[outcome]++;
  last_roll_ = {{"id", r.rec.id},       {"outcome", outcome},          {"reason", reason},
                {"started_ms", r.rec.started_ms}, {"ended_ms", now}, {"command_before", r.rec.command_before},
                {"command_after", r.rec.command_after}};
  if (outcome == "done") {
    spdlog::info("rollout #{} done in {} ms: both engines run {}", r.rec.id, now - r.rec.started_ms, r.rec.command_after);
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
  } else {
    j["in_progress"] = false;
  }
  if (!last_roll_.is_null()) j["last"] = last_roll_;
  return j;
}

}  // namespace wsup
