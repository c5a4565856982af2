// EngineSet (engine_set.h): an engine's start (its port, nonce, control
// token, lifeline, death word and ready pipe), its identity, its status
// while it starts and while it serves, its probes, and the cache lookup it
// reports.
//
// Identity, not ports: each start gets a nonce (WSUP_ENGINE_NONCE in its
// environment, {nonce} in its command). An engine that echoes it in
// /wsup/status is known by it; one that does not is known by the listening
// socket: its process group must hold the socket on its port. Whatever else
// answers on the port (another node's engine, a leftover) is never taken
// for ready and never routed.
#include <fcntl.h>
#include <unistd.h>

#include "common/exit_codes.h"
#include "common/fs.h"
#include "common/json_limits.h"
#include "common/log.h"
#include "common/random_id.h"
#include "http/control_auth.h"
#include "probes/probe.h"
#include "supervisor/engine_set.h"
#include "supervisor/expectation_check.h"
#include "supervisor/preflight.h"
#include "supervisor/probe_config.h"
#include "supervisor/reload_plan.h"
#include "wire/death_word.h"

namespace wsup {

using nlohmann::json;

namespace {

constexpr int64_t kStatusPollMs = 25;  // while an engine starts
constexpr int64_t kStatusRefreshMs = 1000;  // while it serves

}  // namespace

void EngineSet::SpawnAsRecovery(EngineSlot& s, const std::string& cause) {
  s.recovery_cause = cause;
  s.recovery_fault_ms = clock_.WallMs();
  s.recovery_failover_id.reset();
  later_.After(0, [this, slot = &s] {
    if (!hooks_.stopping() && started_ && (slot->state == SlotState::kStopped || slot->state == SlotState::kIdle)) {
      Spawn(*slot);
    }
  });
}

void EngineSet::Spawn(EngineSlot& s) {
  if (hooks_.stopping()) return;
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
      hooks_.version_failed(s.name, argv.error().message());
      return;
    }
    hooks_.fatal(argv.error().message(), kExitConfig);
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
    hooks_.version_failed(s.name, pid.error().message());
    return;
  }
  if (!pid.ok()) {
    // The program cannot be started at all: no restart can help.
    s.permanent_failure = true;
    s.failure_reason = "engine " + s.name + ": " + pid.error().message();
    Fire(s, SlotEvent::kStartTimeout, s.failure_reason);
    hooks_.degraded(s.failure_reason);
    return;
  }
  auto start_time = launcher_.StartTime(*pid);
  s.BeginProcess(*pid, start_time.ok() ? *start_time : 0, nonce, std::move(control_token), port, clock_.WallMs(),
                 clock_.MonotonicMs());
  s.runs = VersionOf(*cfg);
  s.version_text = EngineVersionText(*cfg);
  // Recorded before anything else can happen: a supervisor that dies now
  // leaves a process its successor and `wsup stop` can find.
  hooks_.save_state();
  EngineSlot* sp = &s;
  s.CloseWatches();
  auto w = launcher_.WatchExit(loop_, s.pid, [this, sp](const ExitInfo& info) { OnExit(*sp, info); });
  if (w.ok()) {
    s.watch = *w;
  } else {
    spdlog::error("engine {} pid {}: {}; its death will not be seen", s.name, s.pid, w.error().message());
  }
  const pid_t child = s.pid;
  if (line.ok()) {
    auto hw = HangupWatch::Start(loop_, std::move(line->read_end),
                                 [this, sp, child] { OnDying(*sp, child, "its lifeline closed"); });
    if (hw.ok()) s.lifeline = *hw;
  }
  if (death.ok()) {
    auto dw = DeathWatch::Start(loop_, death->get(),
                                [this, sp, child] { OnDying(*sp, child, "its death word was marked"); });
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
    auto lw = LineWatch::Start(loop_, std::move(ready_rd), [this, sp, child](Result<std::string> l) {
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

bool EngineSet::CheckIdentity(EngineSlot& s, const json* status) {
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

void EngineSet::PollStatus(EngineSlot& s) {
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
  EngineSlot* sp = &s;
  pid_t pid = s.pid;
  http_.Send(cfg_.engine.host, s.port, std::move(req), [this, sp, pid](Result<http::HttpResponse> r) {
    EngineSlot& s = *sp;
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

void EngineSet::RefreshStatus(EngineSlot& s) {
  if (!IsLive(s.state) || s.state == SlotState::kStarting || s.pid == 0) return;
  http::ClientRequest req;
  req.target = "/wsup/status";
  req.timeout_ms = 1000;
  if (!s.control_token.empty()) req.headers.push_back(http::ControlAuthHeader(s.control_token));
  EngineSlot* sp = &s;
  const pid_t pid = s.pid;
  const uint64_t seq = hooks_.kv_seq();
  http_.Send(cfg_.engine.host, s.port, std::move(req), [this, sp, pid, seq](Result<http::HttpResponse> r) {
    if (sp->pid != pid || !r.ok() || r->status != 200) return;
    auto st = ParseJsonChecked(r->body, "engine " + sp->name + "'s /wsup/status", "it is not a wsup engine's status");
    if (!st.ok() || !st->is_object()) return;
    if (st->contains("nonce") && (*st)["nonce"] != sp->nonce) return;
    if (st->contains("kv") && (*st)["kv"].is_object()) {
      sp->kv = (*st)["kv"];
      // The pool's judgement first: an engine fenced for what its KV says
      // is gone, and the rest of what it said goes with it.
      hooks_.kv_said(*sp, sp->kv, seq, "its /wsup/status");
      if (sp->pid != pid || !IsLive(sp->state)) return;
    }
    sp->TakeServingStatus(*st, metrics_);
  });
}

void EngineSet::OnEngineStatus(EngineSlot& s, const json& st, const EngineStatus& view) {
  s.last_status = st;
  if (view.comm_warm) s.comm_warm = *view.comm_warm;
  if (view.state == "ready" && view.weights && !s.cache_recorded) RecordCache(s, *view.weights);
}

void EngineSet::RecordCache(EngineSlot& s, const EngineStatus::Weights& weights) {
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
  hooks_.record_cache(rec);
  // An engine that published committed a layout; one that attached may
  // have found one committed by an engine that died before it said so.
  // Either way the holders are asked for what is not kept yet.
  if (cfg_.weight_cache.layout == CacheLayout::kEngine && (source == "published" || source == "holder")) {
    hooks_.keep_layouts();
  }
}

void EngineSet::StartProbing(EngineSlot& s) {
  EngineSlot* sp = &s;
  pid_t pid = s.pid;
  auto probe = MakeProbeFromConfig(cfg_, s.port, s.control_token, http_, clock_);
  s.monitor = std::make_unique<HealthMonitor>(
      loop_, std::move(probe), HysteresisFromConfig(cfg_, s.name == "a" ? 1 : 2), clock_,
      [this, sp, pid](const HealthTransition& t) {
        EngineSlot& s = *sp;
        if (s.pid != pid) return;
        ProbeTransitionRecord rec;
        rec.time_ms = t.at_ms;
        rec.slot = s.name;
        rec.from_state = HealthName(t.from);
        rec.to_state = HealthName(t.to);
        rec.cause = t.cause;
        hooks_.record_probe(rec);
        if (t.to == Health::kHealthy) {
          s.semantic_ready = true;
          Fire(s, SlotEvent::kProbePass, t.cause);
        } else if (t.to == Health::kUnhealthy) {
          s.semantic_ready = false;
          s.tripped_hung = IsHangCause(t.cause);
          Fire(s, SlotEvent::kProbeTrip, t.cause);
        }
      },
      [this, sp, pid](const ProbeOutcome& o) {
        EngineSlot& s = *sp;
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

void EngineSet::CheckExpectation(EngineSlot& s) {
  if (ever_proven_ || hooks_.rollout_in_progress() || hooks_.stopping()) return;
  EngineSlot* other = Other(&s);
  if (!s.wrong_answer || !other->wrong_answer) return;
  auto unmet = UnmetExpectation(cfg_, *s.wrong_answer, *other->wrong_answer);
  if (!unmet) return;
  // Restarting engines cannot change what the model answers: a config that
  // cannot work, as any other, stops the node with 78 (systemd's
  // RestartPreventExitStatus) instead of a restart loop.
  spdlog::error("{}", *unmet);
  hooks_.fatal(*unmet, kExitConfig);
}

}  // namespace wsup
