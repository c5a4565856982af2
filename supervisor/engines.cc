// The engine slots: spawn, identity, status polling, probes, the engine
// table's actions, failover, promotion and restarts.
//
// Identity, not ports: each start gets a nonce (WSUP_ENGINE_NONCE in its
// environment, {nonce} in its command). An engine that echoes it in
// /wsup/status is known by it; one that does not is known by the listening
// socket: its process group must hold the socket on its port. Whatever else
// answers on the port (another node's engine, a leftover) is never taken
// for ready and never routed.
#include <fcntl.h>
#include <unistd.h>


#include "common/fs.h"
#include "common/random_id.h"
#include "common/json_limits.h"
#include "common/log.h"
#include "http/control_auth.h"
#include "probes/probe.h"
#include "supervisor/expectation_check.h"
#include "supervisor/probe_config.h"
#include "supervisor/preflight.h"
#include "supervisor/supervisor_impl.h"
#include "wire/death_word.h"

namespace wsup {

using nlohmann::json;

namespace {

constexpr int64_t kStatusPollMs = 25;  // while an engine starts
constexpr int64_t kStatusRefreshMs = 1000;  // while it serves

}  // namespace

void Supervisor::Impl::StartEngines() {
  if (engines_started_ || stopping_) return;
  engines_started_ = true;
  for (Slot* s : {&a_, &b_}) {
    if (s->state == SlotState::kIdle) {
      // A slot whose engine died while no supervisor ran keeps that cause.
      if (s->recovery_cause.empty()) {
        s->recovery_cause = "cold start";
        s->recovery_fault_ms = clock_.WallMs();
      }
      SpawnEngine(*s);
    }
  }
}

void Supervisor::Impl::SpawnEngine(Slot& s) {
  if (stopping_) return;
  int port = &s == &a_ ? cfg_.engine.primary_port : cfg_.engine.standby_port;
  if (port == 0) {
    auto p = PickFreePort(cfg_.engine.host);
    if (!p.ok()) {
      spdlog::error("engine {}: {}", s.name, p.error().message());
      Fire(s, SlotEvent::kStartTimeout, "no free port: " + p.error().message());
      return;
    }
    port = *p;
  }
  std::string nonce = RandomHexId();
  // A fresh secret per start: a process that learned an earlier one (a
  // killed engine's child, say) gains nothing.
  std::string control_token = RandomHexId();
  ChildSpec spec;
  // The engine inherits the write end of its lifeline as fd 3 (before it
  // opens anything of its own, so it is among the first files closed when
  // it dies). Without a pipe the pidfd alone still sees the exit.
  auto line = Lifeline::Make();
  if (line.ok()) {
    spec.pass_fds.push_back(line->write_end.get());
  } else {
    spdlog::warn("engine {}: {}; its death is seen through its pidfd only", s.name, line.error().message());
  }
  // The death word (wire/death_word.h): the engine arms it, and its death
  // is seen at the kill rather than after the kernel's teardown.
  auto death = MakeDeathWord();
  if (death.ok()) {
    spec.pass_fds.push_back(death->get());
  } else {
    spdlog::warn("engine {}: {}; its death is seen through its lifeline", s.name, death.error().message());
  }
  const int death_fd = death.ok() ? 3 + static_cast<int>(spec.pass_fds.size()) - 1 : -1;
  // {ready_fd}: a pipe the engine writes one line to once it serves.
  UniqueFd ready_rd, ready_wr;
  int ready_fd = -1;
  if (EngineAnnouncesReady(cfg_)) {
    int p[2];
    if (::pipe2(p, O_CLOEXEC) == 0) {
      ready_rd.Reset(p[0]);
      ready_wr.Reset(p[1]);
      spec.pass_fds.push_back(ready_wr.get());
      ready_fd = 3 + static_cast<int>(spec.pass_fds.size()) - 1;
    } else {
      spdlog::warn("engine {}: pipe for {{ready_fd}}: {}; polling its status instead", s.name, strerror(errno));
    }
  }
  // A rollout's version for this slot, else the node's.
  const Config* cfg = &cfg_;
  std::optional<Config> versioned;
  if (s.version) {
    versioned = WithVersion(cfg_, *s.version);
    cfg = &*versioned;
  }
  auto argv = EngineArgv(*cfg, port, nonce, ready_fd);
  if (!argv.ok()) {
    if (s.version) {
      // The new version's command cannot be expanded: that version fails,
      // the node goes on.
      rollout_.OnSpawnFailed(s.name, argv.error().message());
      return;
    }
    BeginStop(argv.error().message(), kExitConfig);
    return;
  }
  spec.argv = std::move(*argv);
  spec.env_set = cfg->engine.env;
  spec.env_set.emplace_back("WSUP_ENGINE_NONCE", nonce);
  spec.env_set.emplace_back(http::kControlTokenEnv, control_token);
  spec.env_set.emplace_back("WSUP_ENGINE_SLOT", s.name);
  if (death_fd >= 0) spec.env_set.emplace_back(kDeathFdEnv, std::to_string(death_fd));
  spec.log_path = JoinPath(cfg_.node.state_dir, "logs/engine-" + s.name + ".log");
  auto pid = launcher_.Spawn(spec);
  if (line.ok()) line->write_end.Reset();
  ready_wr.Reset();
  if (!pid.ok() && s.version) {
    // A rollout's new version that cannot be started: that version fails
    // (and is rolled back), the node goes on.
    rollout_.OnSpawnFailed(s.name, pid.error().message());
    return;
  }
  if (!pid.ok()) {
    // The program cannot be started at all: no restart can help.
    s.permanent_failure = true;
    s.failure_reason = "engine " + s.name + ": " + pid.error().message();
    Fire(s, SlotEvent::kStartTimeout, s.failure_reason);
    SetDegraded(s.failure_reason);
    return;
  }
  auto start_time = launcher_.StartTime(*pid);
  s.BeginProcess(*pid, start_time.ok() ? *start_time : 0, nonce, std::move(control_token), port, clock_.WallMs(),
                 clock_.MonotonicMs());
  s.runs = VersionOf(*cfg);
  s.version_text = EngineVersionText(*cfg);
  // Recorded before anything else can happen: a supervisor that dies now
  // leaves a process its successor and `wsup stop` can find.
  SaveState();
  Slot* sp = &s;
  s.CloseWatches();
  auto w = launcher_.WatchExit(&loop_, s.pid, [this, sp](const ExitInfo& info) { OnEngineExit(*sp, info); });
  if (w.ok()) {
    s.watch = *w;
  } else {
    spdlog::error("engine {} pid {}: {}; its death will not be seen", s.name, s.pid, w.error().message());
  }
  const pid_t child = s.pid;
  if (line.ok()) {
    auto hw = HangupWatch::Start(&loop_, std::move(line->read_end),
                                 [this, sp, child] { OnEngineDying(*sp, child, "its lifeline closed"); });
    if (hw.ok()) s.lifeline = *hw;
  }
  if (death.ok()) {
    auto dw = DeathWatch::Start(&loop_, death->get(),
                                [this, sp, child] { OnEngineDying(*sp, child, "its death word was marked"); });
    if (dw.ok()) {
      s.death = *dw;
    } else {
      spdlog::warn("engine {}: {}; its death is seen through its lifeline", s.name, dw.error().message());
    }
  }
  Fire(s, SlotEvent::kSpawn, "started pid " + std::to_string(s.pid) + " on port " + std::to_string(port));
  if (ready_rd.valid()) {
    // Announced readiness: no polling while it loads. The line (or the
    // pipe's EOF, from an engine that closes it unused) starts the status
    // check at once; the start budget still applies.
    auto lw = LineWatch::Start(&loop_, std::move(ready_rd), [this, sp, child](Result<std::string> l) {
      sp->ready_line = nullptr;
      if (sp->pid != child) return;
      spdlog::info("engine {}: {}", sp->name,
                   l.ok() ? "announced readiness: " + l->substr(0, 200)
                          : "closed its {ready_fd} without a line; checking its status");
      PollStatus(*sp);
    });
    if (lw.ok()) {
      s.ready_line = *lw;
      s.poll->Start(cfg_.engine.ready_timeout_ms + 1, [this, sp] { PollStatus(*sp); });
      return;
    }
  }
  s.poll->Start(kStatusPollMs, [this, sp] { PollStatus(*sp); });
}

bool Supervisor::Impl::CheckIdentity(Slot& s, const json* status) {
  // An engine that knows its nonce says so; a wrong one is someone else.
  if (status && status->is_object() && status->contains("nonce") && (*status)["nonce"].is_string()) {
    std::string theirs = (*status)["nonce"].get<std::string>();
    if (theirs == s.nonce) return true;
    if (!s.identity_logged) {
      s.identity_logged = true;
      spdlog::error("engine {}: port {} is answered by another process (its nonce differs from the one pid {} was "
                    "given): not ready, never routed; another node's engine or a leftover holds the port",
                    s.name, s.port, s.pid);
    }
    return false;
  }
  // Otherwise the listening socket must be this engine's.
  auto mine = launcher_.ListensOn(s.pid, s.port);
  if (mine.ok() && *mine) return true;
  if (!s.identity_logged) {
    s.identity_logged = true;
    std::string who;
    auto owners = ListeningPortOwners(s.port);
    if (owners.ok()) {
      for (pid_t p : *owners) who += (who.empty() ? "" : ", ") + DescribeProcess(p);
    }
    spdlog::error("engine {}: port {} answers, but not from pid {} (the socket belongs to {}): not ready, never "
                  "routed",
                  s.name, s.port, s.pid, who.empty() ? "a process this user cannot see" : who);
  }
  return false;
}

void Supervisor::Impl::PollStatus(Slot& s) {
  if (s.state != SlotState::kStarting) return;
  if (clock_.MonotonicMs() - s.spawned_mono > cfg_.engine.ready_timeout_ms) {
    Fire(s, SlotEvent::kStartTimeout,
         "not ready within engine.ready_timeout_ms = " + std::to_string(cfg_.engine.ready_timeout_ms) + " ms");
    return;
  }
  http::ClientRequest req;
  req.method = "GET";
  req.target = "/wsup/status";
  req.timeout_ms = 1000;
  if (!s.control_token.empty()) req.headers.push_back(http::ControlAuthHeader(s.control_token));
  Slot* sp = &s;
  pid_t pid = s.pid;
  http_->Send(cfg_.engine.host, s.port, std::move(req), [this, sp, pid](Result<http::HttpResponse> r) {
    Slot& s = *sp;
    if (s.pid != pid || s.state != SlotState::kStarting) return;
    if (r.ok() && r->status == 200) {
      auto st = ParseJsonChecked(r->body, "engine " + s.name + "'s /wsup/status", "it is not a wsup engine's status");
      // A status whose fields are not a wsup engine's (a field of another
      // type) is taken as no wsup status at all, said once per start.
      auto view = st.ok() ? ParseEngineStatus(*st) : Result<EngineStatus>(st.error());
      if (st.ok() && st->is_object() && !view.ok() && !s.status_logged) {
        s.status_logged = true;
        metrics_.bad_messages["engine"]++;
        spdlog::warn("engine {}: its /wsup/status cannot be read ({}); its semantic probe decides whether it is "
                     "ready",
                     s.name, view.error().message());
      }
      if (view.ok()) {
        if (!CheckIdentity(s, &*st)) {
          s.poll->Start(kStatusPollMs * 4, [this, sp] { PollStatus(*sp); });
          return;
        }
        OnEngineStatus(s, *st, *view);
        if (view->state == "ready") {
          Fire(s, SlotEvent::kEngineReady, "engine reports ready");
          return;
        }
      } else if (CheckIdentity(s, nullptr)) {
        // Not our engine's status format: let the semantic probe decide.
        Fire(s, SlotEvent::kEngineReady, "engine answers HTTP (status is not wsup JSON)");
        return;
      }
    } else if (r.ok() && r->status == 404 && CheckIdentity(s, nullptr)) {
      // An engine without /wsup/status: it answers, so probe it.
      Fire(s, SlotEvent::kEngineReady, "engine answers HTTP (no /wsup/status)");
      return;
    }
    s.poll->Start(kStatusPollMs, [this, sp] { PollStatus(*sp); });
  });
}

void Supervisor::Impl::RefreshStatus(Slot& s) {
  if (!IsLive(s.state) || s.state == SlotState::kStarting || s.pid == 0) return;
  http::ClientRequest req;
  req.target = "/wsup/status";
  req.timeout_ms = 1000;
  if (!s.control_token.empty()) req.headers.push_back(http::ControlAuthHeader(s.control_token));
  Slot* sp = &s;
  const pid_t pid = s.pid;
  const uint64_t seq = kv_.seq();
  http_->Send(cfg_.engine.host, s.port, std::move(req), [this, sp, pid, seq](Result<http::HttpResponse> r) {
    if (sp->pid != pid || !r.ok() || r->status != 200) return;
    auto st = ParseJsonChecked(r->body, "engine " + sp->name + "'s /wsup/status", "it is not a wsup engine's status");
    if (!st.ok() || !st->is_object()) return;
    if (st->contains("nonce") && (*st)["nonce"] != sp->nonce) return;
    if (st->contains("kv") && (*st)["kv"].is_object()) {
      sp->kv = (*st)["kv"];
      // The pool's judgement first: an engine fenced for what its KV says
      // is gone, and the rest of what it said goes with it.
      kv_.OnEngineKv(*sp, sp->kv, seq, "its /wsup/status");
      if (sp->pid != pid || !IsLive(sp->state)) return;
    }
    sp->TakeServingStatus(*st, metrics_);
  });
}

KvPoolRoles::Hooks Supervisor::Impl::KvPoolHooks() {
  KvPoolRoles::Hooks h;
  h.slot = [this](const std::string& name) { return SlotByName(name); };
  h.fire = [this](Slot& s, SlotEvent e, const std::string& cause) { Fire(s, e, cause); };
  h.send = [this](Slot& s, http::ClientRequest req, KvPoolRoles::Answer done) {
    http_->Send(cfg_.engine.host, s.port, std::move(req), std::move(done));
  };
  h.refresh_status = [this](Slot& s) { RefreshStatus(s); };
  h.record_fence = [this](Slot& s, const std::string& why) { RecordFence(s, why); };
  h.kv_full = [this](const std::string& slot) { failover_.OnKvFull(slot); };
  h.after = [this](int64_t ms, std::function<void()> work) { After(ms, std::move(work)); };
  h.save_state = [this] { SaveState(); };
  h.watch_exit = [this](pid_t pid, std::function<void(const ExitInfo&)> done) {
    return launcher_.WatchExit(&loop_, pid, std::move(done));
  };
  h.still_runs = [this](const ProcessRef& p) { return StillRuns(p); };
  return h;
}

void Supervisor::Impl::OnEngineStatus(Slot& s, const json& st, const EngineStatus& view) {
  s.last_status = st;
  if (view.comm_warm) s.comm_warm = *view.comm_warm;
  if (view.state == "ready" && view.weights && !s.cache_recorded) RecordCache(s, *view.weights);
}

void Supervisor::Impl::RecordCache(Slot& s, const EngineStatus::Weights& weights) {
  s.cache_recorded = true;
  const std::string mode = weights.mode.empty() ? CacheModeName(cfg_.weight_cache.mode) : weights.mode;
  const std::string& source = weights.source;
  if (mode == "off") {
    s.cache_result = "off";
    return;
  }
  CacheEventRecord rec;
  rec.time_ms = clock_.WallMs();
  rec.slot = s.name;
  rec.mode = mode;
  if (source == "holder") {
    rec.result = "hit";
    if (weights.ms) rec.attach_ms = *weights.ms;
  } else if (source == "published") {
    // The engine found no committed layout and wrote its own (it loaded
    // from disk): a miss, with the time the publish took.
    rec.result = "miss";
    rec.miss_reason = "published";
    if (weights.ms) rec.load_ms = *weights.ms;
  } else {
    rec.result = "miss";
    rec.miss_reason = weights.miss_reason.empty() ? "unknown" : weights.miss_reason;
    if (!weights.diffs_json.empty()) rec.diff_json = weights.diffs_json;
    if (weights.ms) rec.load_ms = *weights.ms;
  }
  s.cache_result = rec.result;
  s.cache_reason = rec.miss_reason;
  metrics_.cache_lookups[rec.result]++;
  LedgerResult(ledger_->RecordCacheEvent(rec), "cache event");
  // An engine that published committed a layout; one that attached may
  // have found one committed by an engine that died before it said so.
  // Either way the holders are asked for what is not kept yet.
  if (cfg_.weight_cache.layout == CacheLayout::kEngine && (source == "published" || source == "holder")) {
    holders_.KeepLayoutsEverywhere();
  }
}

void Supervisor::Impl::StartProbing(Slot& s) {
  Slot* sp = &s;
  pid_t pid = s.pid;
  auto probe = MakeProbeFromConfig(cfg_, s.port, s.control_token, *http_, clock_);
  s.monitor = std::make_unique<HealthMonitor>(
      &loop_, std::move(probe), HysteresisFromConfig(cfg_, s.name == "a" ? 1 : 2), clock_,
      [this, sp, pid](const HealthTransition& t) {
        Slot& s = *sp;
        if (s.pid != pid) return;
        ProbeTransitionRecord rec;
        rec.time_ms = t.at_ms;
        rec.slot = s.name;
        rec.from_state = HealthName(t.from);
        rec.to_state = HealthName(t.to);
        rec.cause = t.cause;
        LedgerResult(ledger_->RecordProbeTransition(rec), "probe transition");
        if (t.to == Health::kHealthy) {
          s.semantic_ready = true;
          Fire(s, SlotEvent::kProbePass, t.cause);
        } else if (t.to == Health::kUnhealthy) {
          s.semantic_ready = false;
          Fire(s, SlotEvent::kProbeTrip, t.cause);
        }
      },
      [this, sp, pid](const ProbeOutcome& o) {
        Slot& s = *sp;
        if (s.pid != pid) return;
        s.last_probe_reason = o.reason;
        s.last_probe_ms = o.latency_ms;
        if (o.ok) {
          s.last_ok_mono = clock_.MonotonicMs();
          s.last_ok_wall = clock_.WallMs();
          ever_proven_ = true;
        }
        s.wrong_answer = o.wrong_answer;
        metrics_.ObserveProbe(s.name, o.ok, o.latency_ms);
        if (s.wrong_answer) CheckExpectation(s);
      });
  s.monitor->Start();
  // What it says of its KV and memory, at once and then while it serves.
  s.status_timer->Start(0, [this, sp] { RefreshStatus(*sp); }, kStatusRefreshMs);
}

void Supervisor::Impl::CheckExpectation(Slot& s) {
  if (ever_proven_ || rollout_.InProgress() || stopping_) return;
  Slot* other = Other(&s);
  if (!s.wrong_answer || !other->wrong_answer) return;
  auto unmet = UnmetExpectation(cfg_, *s.wrong_answer, *other->wrong_answer);
  if (!unmet) return;
  // Restarting engines cannot change what the model answers: a config that
  // cannot work, as any other, stops the node with 78 (systemd's
  // RestartPreventExitStatus) instead of a restart loop.
  spdlog::error("{}", *unmet);
  BeginStop(*unmet, kExitConfig);
}

void Supervisor::Impl::Fire(Slot& s, SlotEvent event, const std::string& cause) {
  auto t = NextTransition(s.state, event);
  if (!t) {
    spdlog::debug("engine {}: {}; ignored ({})", s.name, kSlotNames.Refused(s.state, event), cause);
    return;
  }
  spdlog::info("engine {}: {} {}", s.name, kSlotNames.Move(*t), cause);
  s.state = t->to;
  // Everything else that follows from the move, in the order of
  // SubscribeToEngines().
  engine_events_.Publish(EngineEvent{s.name, *t, cause});
}

void Supervisor::Impl::SubscribeToEngines() {
  auto slot = [this](const EngineEvent& e) -> Slot& { return e.slot == a_.name ? a_ : b_; };
  // Proven ready again: recorded now, before an action or a rollout step
  // below moves the slot on (a rollout promotes its new engine inside the
  // transition that proves it).
  engine_events_.Subscribe("recovery row", [this, slot](const EngineEvent& e) {
    Slot& s = slot(e);
    if (e.row.to == SlotState::kStandby && !s.recovery_cause.empty()) RecordRecovery(s);
  });
  // The pool before the action: a slot that failed is fenced before its
  // standby is promoted by the action.
  engine_events_.Subscribe("kv pool", [this, slot](const EngineEvent& e) {
    kv_.OnSlotMoved(slot(e), e.row.from, e.row.to, e.cause);
  });
  // The table's own action (kill, terminate, failover, routes).
  engine_events_.Subscribe("action", [this, slot](const EngineEvent& e) { Apply(slot(e), e.row, e.cause); });
  engine_events_.Subscribe("rollout", &rollout_);
  engine_events_.Subscribe("promotion", [this](const EngineEvent&) { MaybePromote(); });
  // The routes before state.json and any ledger row that follows: the
  // front is told first. A swap in progress moves two slots; its caller
  // pushes the routes once.
  engine_events_.Subscribe("front routes", [this](const EngineEvent&) {
    if (!swapping_) PushRoutes();
  });
  engine_events_.Subscribe("state.json", [this](const EngineEvent&) { SaveState(); });
  engine_events_.Subscribe("status line", [this](const EngineEvent&) { UpdateStatusLine(); });
}

void Supervisor::Impl::RecordRecovery(Slot& s) {
  // One recovery row with the engine's own phases.
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
  LedgerResult(ledger_->RecordRecovery(rec), "recovery");
  metrics_.ObserveRecovery(static_cast<double>(rec.ready_ms - rec.fault_ms) / 1000.0);
  s.recovery_cause.clear();
  s.recovery_failover_id.reset();
}

void Supervisor::Impl::Apply(Slot& s, const SlotTransition& t, const std::string& cause) {
  switch (t.action) {
    case SlotAction::kNone:
      break;
    case SlotAction::kStartProbing:
      s.poll->Stop();
      StartProbing(s);
      break;
    case SlotAction::kRouteHere:
    case SlotAction::kRouteAway:
      // A swap in progress moves two slots; its caller pushes the routes once.
      if (!swapping_) PushRoutes();
      break;
    case SlotAction::kKillGroup:
      s.poll->Stop();
      if (s.monitor) s.monitor->Stop();
      s.semantic_ready = false;
      if (s.pid > 0) Logged(launcher_.Signal(s.pid, SIGKILL), "killing an engine");
      // A slot with no process (it could not be started) waits for no exit.
      if (s.pid == 0) ScheduleRestart(s, -1);
      break;
    case SlotAction::kTerminate:
      s.poll->Stop();
      if (s.monitor) s.monitor->Stop();
      if (s.pid > 0) {
        Logged(launcher_.Signal(s.pid, SIGTERM), "stopping an engine");
        pid_t pid = s.pid;
        s.stop_timer->Start(cfg_.engine.stop_timeout_ms,
                           [this, pid] { Logged(launcher_.Signal(pid, SIGKILL), "killing an engine after its stop budget"); });
      }
      break;
    case SlotAction::kScheduleRestart:
      // Exits come through OnEngineExit, which schedules with the exit code.
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
      if (s.pid > 0 && launcher_.Alive(s.pid)) Logged(launcher_.Signal(s.pid, SIGKILL), "killing the failed engine");
      failover_.OnFailed(s.name, s.pid != 0, TriggerFor(t.event, drill), cause, fault, drill);
      break;
    }
  }
}

void Supervisor::Impl::OnEngineDying(Slot& s, pid_t pid, const std::string& how) {
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
  if (serving) front_.CutEngine(address, "engine " + s.name + " pid " + std::to_string(pid) + " died (" + how + ")");
}

void Supervisor::Impl::OnEngineExit(Slot& s, const ExitInfo& info) {
  const std::string why = "pid " + std::to_string(s.pid) + " " + info.Describe();
  s.EndProcess();
  metrics_.engine_memory.erase(s.name);
  failover_.OnEngineGone(s.name);
  Fire(s, SlotEvent::kExited, why);
  // Only the exit frees the pool of an engine that held it: none of its
  // work can still be running now (its lifeline's EOF came earlier).
  kv_.OnExit(s, why);
  // The row for an exit is failed/stopped; a failed slot is restarted with
  // the exit code in hand (a permanent-failure code is not retried).
  if (s.state == SlotState::kFailed) {
    // After the pool's grant to the promoted engine, if the exit just sent
    // one: the spawn would hold that request back.
    Slot* sp = &s;
    const int code = info.known && !info.signal ? info.exit_code : -1;
    kv_.AfterGrant([this, sp, code] { ScheduleRestart(*sp, code); });
  }
  if (stopping_) MaybeFinishStop();
}

void Supervisor::Impl::ScheduleRestart(Slot& s, int exit_code) {
  if (stopping_ || s.state != SlotState::kFailed) return;
  if (s.pid > 0) return;                       // wait for the exit; OnEngineExit calls back here
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
    Slot* sp = &s;
    s.restart_timer->Start(0, [this, sp] {
      if (sp->state == SlotState::kFailed) SpawnEngine(*sp);
    });
    return;
  }
  if (s.permanent_failure) {
    SetDegraded(s.failure_reason);
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
    Slot* sp = &s;
    s.restart_timer->Start(0, [this, sp] {
      if (sp->state == SlotState::kFailed) SpawnEngine(*sp);
    });
    return;
  }
  RestartDecision d = s.throttle.OnExit(clock_.MonotonicMs(), exit_code);
  if (d.kind == RestartDecision::Kind::kPermanent) {
    s.permanent_failure = true;
    s.failure_reason = "engine " + s.name + " exited with " + std::to_string(exit_code) +
                       " (its configuration cannot work); not restarting it; see " + log;
    SetDegraded(s.failure_reason);
    return;
  }
  if (d.kind == RestartDecision::Kind::kGiveUp) {
    SetDegraded("engine " + s.name + " failed " + std::to_string(d.recent) + " times in " +
                std::to_string(cfg_.supervisor.restart_window_ms / 1000) + " s; not restarting it (see its log in " +
                log + ")");
    return;
  }
  if (s.recovery_cause.empty()) {
    s.recovery_cause = "restart";
    s.recovery_fault_ms = clock_.WallMs();
  }
  Slot* sp = &s;
  spdlog::info("engine {}: {}", s.name, d.Describe());
  s.restart_timer->Start(d.delay_ms, [this, sp] {
    if (sp->state == SlotState::kFailed) SpawnEngine(*sp);
  });
}

}  // namespace wsup
