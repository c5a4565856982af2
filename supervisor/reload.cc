// `wsup reload`: the config file read again, what can change at once
// applied, and a changed engine version handed to the rollout (rollout.h)
// to roll through the standby first (reload_plan.h says what may change);
// and the hooks through which the rollout reaches the engines.
#include <spdlog/spdlog.h>

#include <cstdlib>

#include "common/log.h"
#include "supervisor/supervisor_impl.h"

namespace wsup {

using nlohmann::json;

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
  if (rollout_.InProgress()) {
    // Never two at once: the second is refused, and says how to follow the first.
    const int64_t secs = (clock_.WallMs() - rollout_.StartedMs()) / 1000;
    refuse("a rollout is in progress (step " + rollout_.StepName() + ", started " +
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
  for (Slot* s : engines_.slots()) {
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
    ledger_.Check(ledger_.ledger().RecordRollout(rec), "rollout");
    reply({{"ok", false}, {"outcome", "refused"}, {"error", all}, {"changes", changes}});
    return;
  }
  if (plan.changes.empty()) {
    cfg_.overrides = next->overrides;
    reply({{"ok", true}, {"outcome", "unchanged"}, {"changes", changes}});
    return;
  }
  Slot* act = engines_.Active();
  Slot* stby = act ? engines_.Other(act) : nullptr;
  if (plan.roll()) {
    // All or nothing: a roll that cannot begin leaves every setting as it was.
    std::string refusal = !act                                   ? "no active engine serves"
                          : stby->state != SlotState::kStandby   ? "the standby (" + stby->name + ") is " +
                                                                     SlotStateName(stby->state) + ", not proven ready"
                          : failover_.InProgress()               ? failover_.PendingText()
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
  rollout_.Begin(stby->name, act->name, VersionOf(*next), why, c);
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
  engines_.Reconfigured(probe_changed);
  holders_.SetRestartPolicy(HolderRestartPolicy(cfg_));
  front_.SetRestartPolicy(FrontRestartPolicy(cfg_));
  front_.PushLimits();
  for (const auto& ch : plan.changes) {
    if (ch.effect == ReloadEffect::kAtOnce) spdlog::info("reload: {} = {} (was {}), at once", ch.key, ch.after, ch.before);
  }
}

Rollout::Hooks Supervisor::Impl::RolloutHooks() {
  Rollout::Hooks h;
  h.slot = [this](const std::string& name) -> std::optional<Rollout::SlotView> {
    Slot* s = engines_.ByName(name);
    if (!s) return std::nullopt;
    return Rollout::SlotView{s->state, s->pid > 0, s->restart_timer->active(), s->runs};
  };
  h.set_version = [this](const std::string& name, const std::optional<EngineVersion>& v) {
    if (Slot* s = engines_.ByName(name)) s->version = v;
  };
  h.spawn = [this](const std::string& name, const std::string& cause) {
    if (Slot* s = engines_.ByName(name)) RollSpawn(*s, cause);
  };
  h.stop = [this](const std::string& name, const std::string& why) {
    if (Slot* s = engines_.ByName(name)) engines_.Fire(*s, SlotEvent::kStop, why);
  };
  h.restart = [this](const std::string& name) {
    if (Slot* s = engines_.ByName(name)) engines_.ScheduleRestart(*s, -1);
  };
  h.swap_refusal = [this](const std::string& from, const std::string& to) {
    return failover_.SwapRefusal(from, to);
  };
  h.swap = [this](const std::string& from, const std::string& to, const std::string& why) {
    return engines_.ByName(from) && engines_.ByName(to) && failover_.PlannedSwap(from, to, why, nullptr);
  };
  h.failover_pending = [this] { return failover_.InProgress(); };
  h.stopping = [this] { return stopping_; };
  h.set_node_version = [this](const EngineVersion& v) {
    cfg_.engine.command = v.command;
    cfg_.engine.env = v.env;
  };
  h.record_row = [this](const RolloutRecord& rec) { return ledger_.ledger().RecordRollout(rec); };
  h.update_row = [this](const RolloutRecord& rec) { return ledger_.ledger().UpdateRollout(rec); };
  h.ledger_error = [this](const Status& st, const char* what) { ledger_.Check(st, what); };
  h.answer = [this](std::vector<std::shared_ptr<JsonConn>> waiters, json reply) {
    ledger_.ReplyWhenRecorded(std::move(waiters), std::move(reply));
  };
  h.counted = [this](const std::string& outcome) { metrics_.rollouts[outcome]++; };
  h.save_state = [this] { SaveState(); };
  h.status_line = [this] { UpdateStatusLine(); };
  h.notify = [this](Rollout::Notice kind, const std::string& text) {
    switch (kind) {
      case Rollout::Notice::kReloading:
        notifier_.Reloading(text);
        break;
      case Rollout::Notice::kStatus:
        notifier_.Status(text);
        break;
      case Rollout::Notice::kReady:
        notifier_.Ready(text);
        break;
    }
  };
  return h;
}

void Supervisor::Impl::RollSpawn(Slot& s, const std::string& cause) {
  s.recovery_cause = cause;
  s.recovery_fault_ms = clock_.WallMs();
  s.recovery_failover_id.reset();
  // Off the exit's own handling (this may run inside it), and not before
  // the engines may start at all: a restarted supervisor waits for its
  // holders, and engines_.Start() starts an idle slot then.
  std::string name = s.name;
  After(0, [this, name] {
    Slot* sp = engines_.ByName(name);
    if (sp && !stopping_ && engines_.started() && (sp->state == SlotState::kStopped || sp->state == SlotState::kIdle)) {
      engines_.Spawn(*sp);
    }
  });
}

}  // namespace wsup
