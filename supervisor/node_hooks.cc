// The node's wiring of its holders (holder_set.h), rollout (rollout.h),
// reloader (reload.h), control surfaces (control_surface.h) and health
// (node_health.h): the hooks through which they reach the engines, the
// failover, the ledger and systemd.
#include <filesystem>

#include "common/log.h"
#include "supervisor/node.h"

namespace wsup {

using nlohmann::json;

Reloader::Hooks Node::ReloaderHooks() {
  Reloader::Hooks h;
  h.stopping = [this] { return stop_.stopping(); };
  h.rollout_busy = [this]() -> std::string {
    if (!rollout_.InProgress()) return "";
    const int64_t secs = (clock_.WallMs() - rollout_.StartedMs()) / 1000;
    return "a rollout is in progress (step " + rollout_.StepName() + ", started " + std::to_string(secs) + " s ago)";
  };
  h.failover_busy = [this] { return failover_.InProgress() ? failover_.PendingText() : std::string(); };
  h.pair = [this] {
    Reloader::Pair p;
    if (Slot* act = engines_.Active()) {
      Slot* stby = engines_.Other(act);
      p.active = act->name;
      p.standby = stby->name;
      p.standby_state = stby->state;
    }
    return p;
  };
  h.running = [this] {
    std::vector<SlotVersion> running;
    for (Slot* s : engines_.slots()) {
      if (s->pid > 0 && s->runs) running.push_back({s->name, *s->runs});
    }
    return running;
  };
  h.record_refused = [this](const RolloutRecord& rec) { ledger_.Check(ledger_.ledger().RecordRollout(rec), "rollout"); };
  h.applied = [this](bool probe_changed) {
    engines_.Reconfigured(probe_changed);
    holders_.SetRestartPolicy(HolderRestartPolicy(cfg_));
    front_.SetRestartPolicy(FrontRestartPolicy(cfg_));
    front_.PushLimits();
  };
  h.roll = [this](const std::string& standby, const std::string& active, const EngineVersion& v,
                  const std::string& why, const std::shared_ptr<JsonConn>& c) {
    rollout_.Begin(standby, active, v, why, c);
  };
  h.reply = [](const std::shared_ptr<JsonConn>& c, const json& reply) {
    if (c && c->alive()) c->Send(reply);
  };
  return h;
}

Rollout::Hooks Node::RolloutHooks() {
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
    if (Slot* s = engines_.ByName(name)) engines_.SpawnAsRecovery(*s, cause);
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
  h.stopping = [this] { return stop_.stopping(); };
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
  h.status_line = [this] { health_.Update(); };
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

HolderSet::Hooks Node::HolderHooks() {
  HolderSet::Hooks h;
  h.stopping = [this] { return stop_.stopping(); };
  h.fatal = [this](const std::string& why, int exit_code) { stop_.Begin(why, exit_code); };
  h.save_state = [this] { SaveState(); };
  h.all_ready = [this] { engines_.Start(); };
  h.restarted = [this](const HolderRestartRecord& rec) {
    ledger_.Check(ledger_.ledger().RecordHolderRestart(rec), "holder restart");
    metrics_.holder_restarts++;
  };
  h.down = [this](const std::string& why) { health_.SetDegraded(why); };
  h.store_fds = [this](const std::string& name, const std::vector<int>& fds) {
    LogFailure(notifier_.StoreFds(name, fds), "storing the arena fds");
  };
  h.exited = [this] { stop_.ChildExited(); };
  return h;
}

ControlSurface::Hooks Node::ControlHooks() {
  ControlSurface::Hooks h;
  h.status = [this] { return StatusJson(); };
  h.drill = [this](const std::shared_ptr<JsonConn>& c, bool kill) { failover_.Drill(c, kill); };
  h.reload = [this](const std::shared_ptr<JsonConn>& c, const std::vector<std::string>& sets) {
    reloader_.Reload(c, "wsup reload", sets);
  };
  h.stop = [this](const std::shared_ptr<JsonConn>& c) {
    stop_.OnStopped([c] {
      if (c->alive()) c->Send(json{{"type", "stop"}, {"ok", true}});
    });
    stop_.Begin("wsup stop", 0);
  };
  h.metrics = [this] {
    // Read at each scrape: a reload may change the revision.
    metrics_.node_name = cfg_.node.name;
    metrics_.model = std::filesystem::path(cfg_.model.path).filename().string();
    metrics_.revision = cfg_.model.revision;
    ledger_.Report(metrics_);
    front_.Report(metrics_);
    return metrics_.Render();
  };
  return h;
}

NodeHealth::Hooks Node::HealthHooks() {
  NodeHealth::Hooks h;
  h.facts = [this] {
    NodeHealth::Facts f;
    f.stopping = stop_.stopping();
    if (Slot* act = engines_.Active()) f.active = act->name;
    for (Slot* s : engines_.slots()) f.slots.emplace_back(s->name, SlotStateName(s->state));
    f.front_crash_looping = front_.crash_looping();
    return f;
  };
  h.status = [this](const std::string& line) {
    notifier_.Status(line);
    const auto [a, b] = engines_.slots();
    metrics_.SetSlots(a->name, SlotStateName(a->state), a->semantic_ready, b->name, SlotStateName(b->state),
                      b->semantic_ready);
  };
  h.ready = [this](const std::string& line) { notifier_.Ready(line); };
  return h;
}

}  // namespace wsup
