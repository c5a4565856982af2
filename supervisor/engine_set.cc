// EngineSet (engine_set.h): the slots, the table's moves and actions, an
// engine's exit and restart, promotion, adoption and the engines' status.
// Starting a process and its readiness: engine_start.cc.
#include "supervisor/engine_set.h"

#include <signal.h>

#include "common/exit_codes.h"
#include "common/fs.h"
#include "common/log.h"
#include "supervisor/front_link.h"
#include "supervisor/reload_plan.h"

namespace wsup {

using nlohmann::json;

namespace {

// A slot with a process whose start could be the adopted engine's: it is
// killed and started afresh rather than adopted.
bool ProvenRole(const std::string& role) { return role == "active" || role == "standby" || role == "draining"; }

}  // namespace

RestartPolicy EngineRestartPolicy(const Config& cfg) {
  RestartPolicy p;
  p.backoff_ms = cfg.supervisor.restart_backoff_ms;
  p.backoff_max_ms = cfg.supervisor.restart_backoff_max_ms;
  p.max_restarts = cfg.supervisor.max_restarts;
  p.window_ms = cfg.supervisor.restart_window_ms;
  p.give_up = true;
  // An engine's "do not restart me" (any engine command may use it).
  p.permanent_exit_codes = {kExitConfig};
  return p;
}

EngineSet::EngineSet(uv_loop_t* loop, Launcher& launcher, TimerSource& timers, const Clock& clock, const Config& cfg,
                     http::HttpClient& http, Metrics& metrics, Hooks hooks)
    : loop_(loop),
      launcher_(launcher),
      clock_(clock),
      cfg_(cfg),
      http_(http),
      metrics_(metrics),
      hooks_(std::move(hooks)),
      later_(timers),
      a_(timers, "a", EngineRestartPolicy(cfg)),
      b_(timers, "b", EngineRestartPolicy(cfg)) {}

EngineSet::~EngineSet() { Close(); }

void EngineSet::StopProbing() {
  for (EngineSlot* s : slots()) {
    s->monitor.reset();
    s->status_timer->Stop();
  }
}

void EngineSet::Close() {
  StopProbing();
  for (EngineSlot* s : slots()) {
    s->CloseWatches();
    s->poll->Stop();
    s->stop_timer->Stop();
    s->restart_timer->Stop();
  }
}

EngineSlot* EngineSet::ByName(const std::string& name) {
  if (name == a_.name) return &a_;
  if (name == b_.name) return &b_;
  return nullptr;
}

EngineSlot* EngineSet::Active() {
  if (a_.state == SlotState::kActive) return &a_;
  if (b_.state == SlotState::kActive) return &b_;
  return nullptr;
}

EngineSlot* EngineSet::Standby() {
  EngineSlot* act = Active();
  for (EngineSlot* s : slots()) {
    if (s != act && s->state == SlotState::kStandby) return s;
  }
  return nullptr;
}

void EngineSet::Signal(pid_t pid, int sig, const char* what) {
  Status st = launcher_.Signal(pid, sig);
  if (!st.ok()) spdlog::warn("{}: {}", what, st.error().message());
}

void EngineSet::Start() {
  if (started_ || hooks_.stopping()) return;
  started_ = true;
  for (EngineSlot* s : slots()) {
    if (s->state == SlotState::kIdle) {
      // A slot whose engine died while no supervisor ran keeps that cause.
      if (s->recovery_cause.empty()) {
        s->recovery_cause = "cold start";
        s->recovery_fault_ms = clock_.WallMs();
      }
      Spawn(*s);
    }
  }
}

void EngineSet::Fire(EngineSlot& s, SlotEvent event, const std::string& cause) {
  auto t = NextTransition(s.state, event);
  if (!t) {
    spdlog::debug("engine {}: {}; ignored ({})", s.name, kSlotNames.Refused(s.state, event), cause);
    return;
  }
  spdlog::info("engine {}: {} {}", s.name, kSlotNames.Move(*t), cause);
  s.state = t->to;
  metrics_.ObserveTransition(s.name, SlotStateName(t->from), SlotStateName(t->to));
  // Everything else that follows from the move, in the order the node
  // subscribed it (its SubscribeToEngines()).
  events_.Publish(EngineEvent{s.name, *t, cause});
}

void EngineSet::OnMoved(EngineSlot& s, const SlotTransition& t) {
  if (t.to != SlotState::kStandby || s.recovery_cause.empty()) return;
  // Proven ready again: one recovery row with the engine's own phases.
  RecoveryRecord rec;
  rec.failover_id = s.recovery_failover_id;
  rec.slot = s.name;
  rec.cause = s.recovery_cause;
  rec.fault_ms = s.recovery_fault_ms;
  rec.ready_ms = clock_.WallMs();
  rec.cache_result = s.cache_result.empty() ? (cfg_.weight_cache.mode == CacheMode::kOff ? "off" : "miss")
                                            : s.cache_result;
  rec.cache_reason = s.cache_reason;
  if (s.last_status.contains("phases")) {
    rec.phases_json = s.last_status["phases"].dump(-1, ' ', false, json::error_handler_t::replace);
  }
  hooks_.record_recovery(rec);
  metrics_.ObserveRecovery(static_cast<double>(rec.ready_ms - rec.fault_ms) / 1000.0);
  s.recovery_cause.clear();
  s.recovery_failover_id.reset();
}

void EngineSet::Apply(EngineSlot& s, const SlotTransition& t, const std::string& cause) {
  switch (t.action) {
    case SlotAction::kNone:
      break;
    case SlotAction::kStartProbing:
      s.poll->Stop();
      StartProbing(s);
      break;
    case SlotAction::kRouteHere:
    case SlotAction::kRouteAway:
      hooks_.routes_changed();
      break;
    case SlotAction::kKillGroup:
      s.poll->Stop();
      if (s.monitor) s.monitor->Stop();
      s.semantic_ready = false;
      if (s.pid > 0) Signal(s.pid, SIGKILL, "killing an engine");
      // A slot with no process (it could not be started) waits for no exit.
      if (s.pid == 0) ScheduleRestart(s, -1);
      break;
    case SlotAction::kTerminate:
      s.poll->Stop();
      if (s.monitor) s.monitor->Stop();
      if (s.pid > 0) {
        Signal(s.pid, SIGTERM, "stopping an engine");
        pid_t pid = s.pid;
        s.stop_timer->Start(cfg_.engine.stop_timeout_ms,
                           [this, pid] { Signal(pid, SIGKILL, "killing an engine after its stop budget"); });
      }
      break;
    case SlotAction::kScheduleRestart:
      // Exits come through OnExit, which schedules with the exit code.
      break;
    case SlotAction::kFailover: {
      if (s.monitor) s.monitor->Stop();
      bool drill = s.drill_kill;
      int64_t fault = drill ? s.drill_fault_ms : clock_.WallMs();
      if (!drill && t.event == SlotEvent::kProbeTrip) {
        // A hang or wrong answers began after the last correct answer, from
        // a probe or from traffic (the front's report), not at the trip.
        int64_t last_good = std::max(s.last_ok_wall, s.traffic_last_ms);
        if (last_good > 0 && last_good < fault) fault = last_good;
      }
      if (s.pid > 0 && launcher_.Alive(s.pid)) Signal(s.pid, SIGKILL, "killing the failed engine");
      hooks_.failed(s.name, s.pid != 0, TriggerFor(t.event, drill, s.tripped_hung), cause, fault, drill);
      break;
    }
  }
}

void EngineSet::OnDying(EngineSlot& s, pid_t pid, const std::string& how) {
  // The first of the two signs decides; the other is not needed any more.
  if (s.lifeline) s.lifeline->Close();
  s.lifeline = nullptr;
  if (s.death) s.death->Close();
  s.death = nullptr;
  if (s.pid != pid) return;
  if (s.state == SlotState::kStarting) {
    // Not ready yet: the engine may have closed inherited fds itself. Its
    // exit, when it comes, is still seen through the pidfd.
    spdlog::info("engine {}: pid {} is exiting while starting ({}); its exit will be seen when it is reaped", s.name,
                 pid, how);
    return;
  }
  s.semantic_ready = false;
  s.comm_warm = false;
  // An engine that failed already (a probe trip, killed by the supervisor)
  // had its requests hedged or sent on: its sockets close in a moment.
  const bool serving = s.state != SlotState::kFailed;
  const std::string address = HostPortString(cfg_.engine.host, s.port);
  Fire(s, SlotEvent::kDying, "pid " + std::to_string(pid) + " is exiting (" + how + ")");
  // After the routes moved (an active engine's failover pushed them): the
  // front cuts what it still has in flight there and sends it on at once,
  // instead of waiting for the kernel to close the dead engine's sockets
  // (tens of ms for a GPU engine): an active engine's requests and streams,
  // a draining one's streams, a standby's hedges.
  if (serving) hooks_.cut(address, "engine " + s.name + " pid " + std::to_string(pid) + " died (" + how + ")");
}

void EngineSet::OnExit(EngineSlot& s, const ExitInfo& info) {
  const std::string why = "pid " + std::to_string(s.pid) + " " + info.Describe();
  s.EndProcess();
  metrics_.engine_memory.erase(s.name);
  metrics_.engine_load.erase(s.name);
  hooks_.gone(s.name);
  Fire(s, SlotEvent::kExited, why);
  // Only the exit frees the pool of an engine that held it: none of its
  // work can still be running now (its lifeline's EOF came earlier).
  hooks_.kv_exit(s, why);
  // The row for an exit is failed/stopped; a failed slot is restarted with
  // the exit code in hand (a permanent-failure code is not retried).
  if (s.state == SlotState::kFailed) {
    // After the pool's grant to the promoted engine, if the exit just sent
    // one: the spawn would hold that request back.
    EngineSlot* sp = &s;
    const int code = info.known && !info.signal ? info.exit_code : -1;
    hooks_.after_grant([this, sp, code] { ScheduleRestart(*sp, code); });
  }
  hooks_.exited();
}

void EngineSet::RestartNow(EngineSlot& s) {
  EngineSlot* sp = &s;
  s.restart_timer->Start(0, [this, sp] {
    if (sp->state == SlotState::kFailed) Spawn(*sp);
  });
}

void EngineSet::ScheduleRestart(EngineSlot& s, int exit_code) {
  if (hooks_.stopping() || s.state != SlotState::kFailed) return;
  if (s.pid > 0) return;                       // wait for the exit; OnExit calls back here
  if (s.restart_timer->active()) return;        // already scheduled
  std::string log = JoinPath(cfg_.node.state_dir, "logs/engine-" + s.name + ".log");
  if (s.runs && !s.version && *s.runs != VersionOf(cfg_)) {
    // Its process ran another version than the node's (a rollout's new
    // one, rolled back; one a restarted supervisor adopted): the failure
    // was that version's, so it neither counts toward the crash-loop
    // budget nor makes a permanent failure of the node's version, which
    // starts at once.
    s.permanent_failure = false;
    s.failure_reason.clear();
    if (!s.recovery_failover_id) {
      s.recovery_cause = "rollout rolled back";
      s.recovery_fault_ms = clock_.WallMs();
    }
    spdlog::info("engine {}: its process ran another version than the node's; starting the node's version at once",
                 s.name);
    RestartNow(s);
    return;
  }
  if (s.permanent_failure) {
    hooks_.degraded(s.failure_reason);
    return;
  }
  if (s.drill_kill) {
    // The operator's kill drill, not a crash: re-armed at once and not
    // counted toward the crash-loop budget (a dozen drills in a row must
    // not leave the node degraded; a real crash after them is still
    // throttled as any other).
    if (s.recovery_cause.empty()) {
      s.recovery_cause = "restart";
      s.recovery_fault_ms = clock_.WallMs();
    }
    spdlog::info("engine {}: killed by a drill; restarting it at once", s.name);
    RestartNow(s);
    return;
  }
  RestartDecision d = s.throttle.OnExit(clock_.MonotonicMs(), exit_code);
  if (d.kind == RestartDecision::Kind::kPermanent) {
    s.permanent_failure = true;
    s.failure_reason = "engine " + s.name + " exited with " + std::to_string(exit_code) +
                       " (its configuration cannot work); not restarting it; see " + log;
    hooks_.degraded(s.failure_reason);
    return;
  }
  if (d.kind == RestartDecision::Kind::kGiveUp) {
    hooks_.degraded("engine " + s.name + " failed " + std::to_string(d.recent) + " times in " +
                std::to_string(cfg_.supervisor.restart_window_ms / 1000) + " s; not restarting it (see its log in " +
                log + ")");
    return;
  }
  if (s.recovery_cause.empty()) {
    s.recovery_cause = "restart";
    s.recovery_fault_ms = clock_.WallMs();
  }
  EngineSlot* sp = &s;
  spdlog::info("engine {}: {}", s.name, d.Describe());
  s.restart_timer->Start(d.delay_ms, [this, sp] {
    if (sp->state == SlotState::kFailed) Spawn(*sp);
  });
}

void EngineSet::Reconfigured(bool probe_changed) {
  for (EngineSlot* s : slots()) {
    s->throttle.set_policy(EngineRestartPolicy(cfg_));
    if (probe_changed && s->monitor && IsLive(s->state) && s->state != SlotState::kStarting) {
      s->monitor->Stop();
      StartProbing(*s);
    }
  }
}

PromotionCheck EngineSet::CheckStandby(const EngineSlot& s) const {
  // Cheap and local, so a crash's failover is not delayed
  // (supervisor/promotion_check.h says what is checked and why).
  char run = 0;
  if (s.pid > 0) {
    auto r = launcher_.RunState(s.pid);
    if (r.ok()) run = *r;
  }
  int64_t age = s.last_ok_mono > 0 ? clock_.MonotonicMs() - s.last_ok_mono : -1;
  int64_t limit = 2 * cfg_.probe.interval_ms + cfg_.probe.jitter_ms + cfg_.probe.timeout_ms;
  return CheckPromotion(s.pid, run, age, limit);
}

bool EngineSet::Promote(EngineSlot& s, const std::string& cause, std::string* unfit_out, std::string* note_out) {
  PromotionCheck check = CheckStandby(s);
  if (!check.unfit.empty()) {
    if (unfit_out) *unfit_out = check.unfit;
    Fire(s, SlotEvent::kUnfit, "not promoted: " + check.unfit);
    return false;
  }
  if (!check.note.empty()) {
    spdlog::warn("engine {}: {}", s.name, check.note);
    if (note_out) *note_out = check.note;
  }
  Fire(s, SlotEvent::kPromote, check.note.empty() ? cause : cause + "; " + check.note);
  return s.state == SlotState::kActive;
}

bool EngineSet::StillRuns(const ProcessRef& p) const {
  if (p.pid <= 0 || !launcher_.Alive(p.pid)) return false;
  auto st = launcher_.StartTime(p.pid);
  return st.ok() && *st == p.start_time;
}

EngineSet::Adoption EngineSet::Adopt(const RuntimeState::Engine& pe, const std::string& version_text) {
  EngineSlot* s = ByName(pe.slot);
  if (!s || !StillRuns(pe.proc)) return Adoption::kGone;
  // The recorded process must still be the one listening on the recorded
  // port; that needs no answer from it, so a busy engine is not mistaken
  // for a dead one.
  auto listens = launcher_.ListensOn(pe.proc.pid, pe.port);
  const bool proven_role = ProvenRole(pe.role);
  if (!listens.ok() || !*listens || !proven_role) {
    std::string why = !proven_role ? "it was " + pe.role + ", never proven"
                                   : "it no longer listens on port " + std::to_string(pe.port);
    spdlog::warn("engine {} pid {}: not adopted ({}); stopping it and starting a new one", pe.slot, pe.proc.pid, why);
    Signal(pe.proc.pid, SIGKILL, "killing an engine that is not adopted");
    // Its slot starts afresh; it was never serving, so nothing is recorded.
    return Adoption::kReplaced;
  }
  s->pid = pe.proc.pid;
  s->start_time = pe.proc.start_time;
  s->port = pe.port;
  s->nonce = pe.nonce;
  s->control_token = pe.control_token;
  s->spawned_ms = pe.started_ms;
  s->cache_result = pe.cache_result;
  s->cache_recorded = true;
  s->adopted = true;
  s->runs = pe.version;
  s->version_text = version_text;
  EngineSlot* sp = s;
  auto w = launcher_.WatchExit(loop_, s->pid, [this, sp](const ExitInfo& info) { OnExit(*sp, info); });
  if (w.ok()) {
    s->watch = *w;
  } else {
    spdlog::error("engine {} pid {}: {}; its death will not be seen", s->name, s->pid, w.error().message());
  }
  Fire(*s, SlotEvent::kAdopt, "adopted after a supervisor restart (pid " + std::to_string(s->pid) + ")");
  return Adoption::kAdopted;
}

json EngineSet::StatusJson(bool pool_enabled) const {
  json engines = json::array();
  for (const EngineSlot* s : slots()) {
    std::string role = s->state == SlotState::kActive    ? "active"
                       : s->state == SlotState::kStandby ? "standby"
                                                         : "none";
    json e{{"slot", s->name},
           {"role", role},
           {"state", SlotStateName(s->state)},
           {"pid", s->pid},
           {"port", s->port},
           {"semantic_ready", s->semantic_ready},
           {"comm_warm", s->comm_warm},
           {"cache", s->cache_result},
           {"last_probe_ms", s->last_probe_ms},
           {"last_probe_error", s->last_probe_reason},
           {"restarts", s->throttle.total()},
           {"adopted", s->adopted},
           {"version", s->version_text}};
    if (s->permanent_failure) e["failure"] = s->failure_reason;
    // How its death would be seen first: the death word it armed (at the
    // kill), else its lifeline (after the kernel's teardown), else only its
    // exit (an adopted engine).
    if (s->pid > 0) e["death_seen_by"] = s->death && s->death->armed() ? "death_word" : s->lifeline ? "lifeline" : "exit";
    // What the engine last said of its KV (source pool, scratch or
    // private) and memory; absent for an engine that does not say.
    if (s->kv.is_object()) {
      e["kv"] = s->kv;
    } else if (pool_enabled && !s->kv_capable) {
      e["kv"] = json{{"source", "private"}};
    }
    if (s->memory.is_object()) e["memory"] = s->memory;
    if (s->resume.is_object()) e["resume"] = s->resume;
    engines.push_back(e);
  }
  return engines;
}

}  // namespace wsup
