// The node's wiring of its engines: the hooks of EngineSet (engine_set.h),
// Failover (failover.h), KvPoolRoles (kv_pool_roles.h), Promoter
// (promoter.h), Adopter (adopter.h) and NodeStop (node_stop.h), and what
// follows a slot's move (SubscribeToEngines).
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>

#include "common/log.h"
#include "probes/probe.h"
#include "supervisor/node.h"
#include "supervisor/promotion_check.h"

namespace wsup {

using nlohmann::json;

EngineSet::Hooks Node::EngineHooks() {
  EngineSet::Hooks h;
  h.stopping = [this] { return stop_.stopping(); };
  h.fatal = [this](const std::string& why, int exit_code) { stop_.Begin(why, exit_code); };
  h.degraded = [this](const std::string& why) { health_.SetDegraded(why); };
  h.save_state = [this] { SaveState(); };
  h.exited = [this] { stop_.ChildExited(); };
  h.version_failed = [this](const std::string& slot, const std::string& why) { rollout_.OnSpawnFailed(slot, why); };
  h.keep_layouts = [this] { holders_.KeepLayoutsEverywhere(); };
  h.rollout_in_progress = [this] { return rollout_.InProgress(); };
  h.record_cache = [this](const CacheEventRecord& rec) {
    ledger_.Check(ledger_.ledger().RecordCacheEvent(rec), "cache event");
  };
  h.record_probe = [this](const ProbeTransitionRecord& rec) {
    ledger_.Check(ledger_.ledger().RecordProbeTransition(rec), "probe transition");
  };
  h.record_recovery = [this](const RecoveryRecord& rec) { ledger_.Check(ledger_.ledger().RecordRecovery(rec), "recovery"); };
  h.kv_seq = [this] { return kv_.seq(); };
  h.kv_said = [this](Slot& s, const json& kv, uint64_t seq, const char* where) { kv_.OnEngineKv(s, kv, seq, where); };
  h.kv_exit = [this](Slot& s, const std::string& why) { kv_.OnExit(s, why); };
  h.after_grant = [this](std::function<void()> work) { kv_.AfterGrant(std::move(work)); };
  h.failed = [this](const std::string& slot, bool had_process, FailoverTrigger trigger, const std::string& cause,
                    int64_t fault_ms, bool drill) {
    failover_.OnFailed(slot, had_process, trigger, cause, fault_ms, drill);
  };
  h.gone = [this](const std::string& slot) { failover_.OnEngineGone(slot); };
  h.cut = [this](const std::string& address, const std::string& why) { front_.CutEngine(address, why); };
  // A swap in progress moves two slots; its caller pushes the routes once.
  h.routes_changed = [this] { promoter_.RoutesChanged(); };
  return h;
}

void Node::SubscribeToEngines() {
  EngineEventList& events = engines_.events();
  auto slot = [this](const EngineEvent& e) -> Slot& { return *engines_.ByName(e.slot); };
  // Proven ready again: recorded now, before an action or a rollout step
  // below moves the slot on (a rollout promotes its new engine inside the
  // transition that proves it).
  events.Subscribe("recovery row", [this, slot](const EngineEvent& e) { engines_.OnMoved(slot(e), e.row); });
  // The pool before the action: a slot that failed is fenced before its
  // standby is promoted by the action.
  events.Subscribe("kv pool", [this, slot](const EngineEvent& e) {
    kv_.OnSlotMoved(slot(e), e.row.from, e.row.to, e.cause);
  });
  // The table's own action (kill, terminate, failover, routes).
  events.Subscribe("action", [this, slot](const EngineEvent& e) { engines_.Apply(slot(e), e.row, e.cause); });
  events.Subscribe("rollout", &rollout_);
  events.Subscribe("promotion", [this](const EngineEvent&) { promoter_.MaybePromote(); });
  // The routes before state.json and any ledger row that follows: the
  // front is told first. A swap in progress moves two slots; its caller
  // pushes the routes once.
  events.Subscribe("front routes", [this](const EngineEvent&) { promoter_.RoutesChanged(); });
  events.Subscribe("state.json", [this](const EngineEvent&) { SaveState(); });
  events.Subscribe("status line", [this](const EngineEvent&) { health_.Update(); });
}

KvPoolRoles::Hooks Node::KvPoolHooks() {
  KvPoolRoles::Hooks h;
  h.slot = [this](const std::string& name) { return engines_.ByName(name); };
  h.fire = [this](Slot& s, SlotEvent e, const std::string& cause) { engines_.Fire(s, e, cause); };
  h.send = [this](Slot& s, http::ClientRequest req, KvPoolRoles::Answer done) {
    http_->Send(cfg_.engine.host, s.port, std::move(req), std::move(done));
  };
  h.refresh_status = [this](Slot& s) { engines_.RefreshStatus(s); };
  h.record_fence = [this](const FenceRecord& rec) { ledger_.Check(ledger_.ledger().RecordFence(rec), "fence"); };
  h.kv_full = [this](const std::string& slot) { failover_.OnKvFull(slot); };
  h.after = [this](int64_t ms, std::function<void()> work) { later_.After(ms, std::move(work)); };
  h.save_state = [this] { SaveState(); };
  h.watch_exit = [this](pid_t pid, std::function<void(const ExitInfo&)> done) {
    return launcher_.WatchExit(&loop_, pid, std::move(done));
  };
  h.still_runs = [this](const ProcessRef& p) { return engines_.StillRuns(p); };
  return h;
}

Failover::Hooks Node::FailoverHooks() {
  Failover::Hooks h;
  h.state = [this](const std::string& name) -> std::optional<SlotState> {
    if (Slot* s = engines_.ByName(name)) return s->state;
    return std::nullopt;
  };
  h.other = [this](const std::string& name) -> std::string {
    Slot* s = engines_.ByName(name);
    return s ? engines_.Other(s)->name : "";
  };
  h.promote = [this](const std::string& name, const std::string& cause) {
    Failover::Promotion p;
    Slot* s = engines_.ByName(name);
    if (!s) return p;
    // No other promotion while the failover moves the roles.
    p.promoted = promoter_.Promote(name, cause, &p.unfit, &p.note);
    return p;
  };
  h.push_routes = [this] { promoter_.PushRoutes(); };
  h.record_row = [this](const FailoverRecord& rec, uint64_t* seq) { return ledger_.ledger().RecordFailover(rec, seq); };
  h.set_gone = [this](int64_t id, int64_t ms) { return ledger_.ledger().SetFailoverGone(id, ms); };
  h.set_kv_full = [this](int64_t id, int64_t ms) { return ledger_.ledger().SetFailoverKvFull(id, ms); };
  h.set_first_ok = [this](int64_t id, int64_t ms, uint64_t* seq) { return ledger_.ledger().SetFailoverFirstOk(id, ms, seq); };
  h.ledger_error = [this](const Status& st, const char* what) { ledger_.Check(st, what); };
  h.ledger_last_error = [this] { return ledger_.last_error(); };
  h.counted = [this](const std::string& trigger) { metrics_.failovers[trigger]++; };
  h.phase = [this](const char* phase, double seconds) { metrics_.ObservePhase(phase, seconds); };
  h.pool_enabled = [this] { return kv_.Enabled(); };
  h.pool_held_by = [this](const std::string& name) { return kv_.HeldBy(name); };
  h.rearm = [this](const std::string& name, const std::string& trigger, int64_t fault_ms, std::optional<int64_t> id) {
    Slot* s = engines_.ByName(name);
    if (!s) return;
    s->NoteRecovery(trigger, fault_ms, id);
    // A killed engine's exit event schedules the restart; one already
    // reaped is restarted now.
    if (s->pid == 0) engines_.ScheduleRestart(*s, -1);
  };
  h.postpone_probe = [this](const std::string& name) {
    if (Slot* s = engines_.ByName(name); s && s->monitor) s->monitor->Postpone(cfg_.probe.interval_ms);
  };
  h.probe = [this](std::function<void(bool, int64_t)> done) { front_probe_.Run(std::move(done), 200); };
  h.send = [](const Failover::Waiters& waiters, const json& reply) {
    for (const auto& c : waiters) {
      if (c && c->alive()) c->Send(reply);
    }
  };
  h.answer = [this](Failover::Waiters waiters, json reply, std::vector<uint64_t> rows, std::string unrecorded) {
    ledger_.ReplyWhenRecorded(std::move(waiters), std::move(reply), std::move(rows), std::move(unrecorded));
  };
  h.status_line = [this] { health_.Update(); };
  h.ended = [this] { rollout_.OnFailoverEnded(); };
  h.active = [this] { return engines_.Active() ? engines_.Active()->name : std::string(); };
  h.check = [this](const std::string& name) {
    Slot* s = engines_.ByName(name);
    return s ? engines_.CheckStandby(*s) : PromotionCheck{"no such engine slot", ""};
  };
  h.rollout_step = [this] { return rollout_.InProgress() ? rollout_.StepName() : std::string(); };
  h.kill = [this](const std::string& name, int64_t fault_ms) {
    Slot* s = engines_.ByName(name);
    if (!s || s->pid <= 0) return;
    s->drill_kill = true;
    s->drill_fault_ms = fault_ms;
    LogFailure(launcher_.Signal(s->pid, SIGKILL), "drill: killing the active engine");
  };
  // The front gets the routes once, after both moves of a swap.
  h.demote = [this](const std::string& name, const std::string& why) {
    if (Slot* s = engines_.ByName(name)) promoter_.Hold([&] { engines_.Fire(*s, SlotEvent::kDemote, why); });
  };
  h.drained = [this](const std::string& name, const std::string& why) {
    if (Slot* s = engines_.ByName(name)) engines_.Fire(*s, SlotEvent::kDrained, why);
  };
  h.inflight = [this](const std::string& name, std::function<void(int64_t)> done) {
    Slot* s = engines_.ByName(name);
    if (!s || !front_.linked()) {
      done(0);
      return;
    }
    // A reply that cannot be read counts as nothing in flight, as no reply
    // does: the drain budget is not held up by it.
    const std::string addr = HostPortString(cfg_.engine.host, s->port);
    front_.AskStatus([done = std::move(done), addr](const json* reply) {
      if (!reply) {
        done(0);
        return;
      }
      auto n = FrontInflight(*reply, addr);
      if (!n.ok()) spdlog::warn("front's status: {}; the drain of {} ends", n.error().message(), addr);
      done(n.ok() ? *n : 0);
    });
  };
  return h;
}

Promoter::Hooks Node::PromoterHooks() {
  Promoter::Hooks h;
  h.stopping = [this] { return stop_.stopping(); };
  h.has_active = [this] { return engines_.HasActive(); };
  h.standbys = [this] {
    std::vector<std::string> names;
    for (Slot* s : engines_.slots()) {
      if (s->state == SlotState::kStandby) names.push_back(s->name);
    }
    return names;
  };
  h.promote = [this](const std::string& name, const std::string& cause, std::string* unfit, std::string* note) {
    Slot* s = engines_.ByName(name);
    return s && engines_.Promote(*s, cause, unfit, note);
  };
  h.push_routes = [this] { front_.SetRoutes(WantedRoutes()); };
  h.promoted = [this](const std::string& name) {
    // A failover that had no engine to take over has one now.
    failover_.OnPromoted(name);
    front_probe_.Run(
        [this](bool ok, int64_t) {
          if (!ok) return;
          health_.Serving("serving: the active engine answered the probe through the front");
          health_.Update();
        },
        200);
  };
  return h;
}

Adopter::Hooks Node::AdopterHooks() {
  Adopter::Hooks h;
  h.kv_held = [this](const std::string& owner) { kv_.AdoptHeld(owner); };
  h.adopt = [this](const RuntimeState::Engine& pe) {
    const std::string version = pe.version ? EngineVersionText(WithVersion(cfg_, *pe.version)) : "";
    switch (engines_.Adopt(pe, version)) {
      case EngineSet::Adoption::kAdopted:
        return Adopter::Fate::kAdopted;
      case EngineSet::Adoption::kReplaced:
        return Adopter::Fate::kReplaced;
      case EngineSet::Adoption::kGone:
        break;
    }
    return Adopter::Fate::kGone;
  };
  h.keep_active = [this](const std::string& name) {
    Slot* s = engines_.ByName(name);
    if (!s) return;
    promoter_.Hold([&] { engines_.Fire(*s, SlotEvent::kPromote, "was active before the supervisor restart"); });
    promoter_.PushRoutes();
  };
  h.proven = [this] { engines_.MarkProven(); };
  h.adopting = [this](bool adopting) { promoter_.SetAdopting(adopting); };
  h.kv_owner = [this](const RuntimeState& prev) { kv_.AdoptOwner(prev); };
  h.settle = [this] {
    promoter_.MaybePromote();
    if (engines_.Active()) health_.Serving("serving (re-adopted)");
  };
  h.has_slot = [this](const std::string& name) { return engines_.ByName(name) != nullptr; };
  h.date = [this](const std::string& name, const std::string& cause, int64_t fault_ms, std::optional<int64_t> id) {
    if (Slot* s = engines_.ByName(name)) s->NoteRecovery(cause, fault_ms, id);
  };
  h.ask_front = [this](const std::function<void(const json*)>& done) { front_.AskStatus(done); };
  h.slots = [this] {
    std::vector<std::pair<std::string, std::string>> slots;
    for (Slot* o : engines_.slots()) slots.emplace_back(o->name, HostPortString(cfg_.engine.host, o->port));
    return slots;
  };
  h.active = [this] { return engines_.Active() ? engines_.Active()->name : std::string(); };
  h.address = [this](int port) { return HostPortString(cfg_.engine.host, port); };
  h.record = [this](const FailoverRecord& rec) {
    auto id = ledger_.Check(ledger_.ledger().RecordFailover(rec), "reconstructed failover");
    metrics_.failovers[rec.trigger]++;
    metrics_.reconstructed_failovers++;
    return id;
  };
  h.resume_rollout = [this](const RuntimeState::Rollout& r) { rollout_.Resume(r); };
  return h;
}

NodeStop::Hooks Node::StopHooks() {
  NodeStop::Hooks h;
  h.stop_children = [this](const std::string& why) {
    notifier_.Stopping();
    rollout_.Abort("the node is stopping: " + why);
    for (Slot* s : engines_.slots()) {
      s->restart_timer->Stop();
      engines_.Fire(*s, SlotEvent::kStop, why);
    }
    front_.Stop(why);
    holders_.Stop(why);
  };
  h.any_process = [this] { return engines_.AnyProcess() || front_.has_process() || holders_.AnyProcess(); };
  h.remove_state = [this] {
    const std::string path = RuntimeState::PathIn(cfg_.node.runtime_dir);
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
      spdlog::warn("{}: cannot remove ({}); the next start finds nothing of it running and starts clean", path,
                   strerror(errno));
    }
  };
  // Every handle below is closed; the loop ends when the last one is.
  h.close = [this] {
    ledger_.Close();
    http_->CancelAll();
    surface_.Close();
    front_.CloseLink("stopping");
    watchdog_->Stop();
    signals_.Close();
    engines_.StopProbing();
    kv_.Close();
    holders_.ReleaseKept();  // the holders have stopped
    uv_stop(&loop_);
  };
  return h;
}

}  // namespace wsup
