// KvPoolRoles (kv_pool_roles.h): the node's KV pool, its table's actions
// carried out as role requests, and what the engines say of their KV.
#include "supervisor/kv_pool_roles.h"

#include "common/json_fields.h"
#include "common/json_limits.h"
#include "common/log.h"
#include "http/control_auth.h"

namespace wsup {

using nlohmann::json;

namespace {

// The `kv` object of an engine's role answer or status; empty when none.
json KvOf(const Result<http::HttpResponse>& r) {
  if (!r.ok()) return json();
  auto j = ParseJsonChecked(r->body, "an engine's /wsup/role answer", "it is not a wsup engine's answer");
  if (!j.ok() || !j->is_object() || !j->contains("kv") || !(*j)["kv"].is_object()) return json();
  return (*j)["kv"];
}

// The engine's words in an error answer: {"error": "..."} or the API's
// {"error": {"message": "..."}}.
std::string AnswerText(const Result<http::HttpResponse>& r) {
  if (!r.ok()) return r.error().message();
  auto j = ParseJsonChecked(r->body, "an engine's /wsup/role answer", "");
  std::string msg;
  if (j.ok() && j->is_object() && j->contains("error")) {
    const json& e = (*j)["error"];
    auto text = e.is_object() ? FieldOr<std::string>(e, "message", "") : FieldOr<std::string>(*j, "error", "");
    msg = text.ok() ? *text : "(an error of another form: " + text.error().message() + ")";
  }
  return "HTTP " + std::to_string(r->status) + (msg.empty() ? "" : ": " + msg.substr(0, 300));
}

// What an engine says its KV is served from (kv.source): pool, scratch or
// private; "" when it does not say, or says it in another form.
std::string KvSource(const json& kv) {
  if (!kv.is_object()) return "";
  auto source = FieldOr<std::string>(kv, "source", "");
  return source.ok() ? *source : "";
}

}  // namespace

KvPoolRoles::KvPoolRoles(const Config& cfg, const Clock& clock, Metrics& metrics, Hooks hooks)
    : pool_mib_(cfg.kv.pool_mib),
      scratch_mib_(cfg.kv.scratch_mib),
      clock_(clock),
      metrics_(metrics),
      hooks_(std::move(hooks)) {}

KvPoolRoles::~KvPoolRoles() { Close(); }

void KvPoolRoles::Close() {
  if (fence_watch_) fence_watch_->Close();
  fence_watch_ = nullptr;
}

void KvPoolRoles::OnSlotMoved(EngineSlot& s, SlotState from, SlotState to, const std::string& cause) {
  if (!Enabled() || from == to) return;
  if (from == SlotState::kActive) Fire(s, PoolEvent::kUnwant, cause);
  if (to == SlotState::kFailed) Fire(s, PoolEvent::kFailed, cause);
  if (from == SlotState::kDraining && to == SlotState::kStandby) Fire(s, PoolEvent::kDrained, cause);
  if (to == SlotState::kActive) {
    if (!s.kv_capable) {
      spdlog::info("kv pool: engine {} keeps a private KV cache; the pool is not given to it", s.name);
      return;
    }
    KvHandover::Step step = Fire(s, PoolEvent::kWant, cause);
    if (step.action != PoolAction::kGrant) {
      // Another engine may still write the pool: this one serves from its
      // scratch until the table frees it. A standby that holds it (found
      // so by a restarted supervisor) has no traffic of its own to wait for.
      EngineSlot* holder = hooks_.slot(owner());
      if (holder && holder != &s && holder->state == SlotState::kStandby) {
        Fire(*holder, PoolEvent::kDrained, "the pool's owner is the standby");
      }
      if (owner() != s.name) SendRole(s, "active", false, 2000, nullptr);
    }
  }
}

void KvPoolRoles::OnExit(EngineSlot& s, const std::string& why) {
  if (Enabled()) Fire(s, PoolEvent::kGone, why);
}

KvHandover::Step KvPoolRoles::Fire(EngineSlot& s, PoolEvent event, const std::string& why) {
  const PoolState before = table_.state();
  KvHandover::Step step = table_.Fire(event, s.name);
  if (!step.applied) {
    if (event != PoolEvent::kUnwant) {
      spdlog::debug("kv pool: {} of engine {} changes nothing ({}, owner {})", PoolEventName(event), s.name,
                    PoolStateName(before), owner().empty() ? "none" : owner());
    }
    return step;
  }
  spdlog::info("kv pool: {} --{}({})--> {} [{}{}] {}", PoolStateName(before), PoolEventName(event), s.name,
               PoolStateName(table_.state()), PoolActionName(step.action), step.slot.empty() ? "" : " " + step.slot,
               why);
  ++seq_;
  metrics_.kv_pool_events[PoolEventName(event)]++;
  metrics_.kv_pool_owner = table_.state() == PoolState::kHeld ? owner() : "";
  hooks_.save_state();  // a restarted supervisor must know who may write the pool
  EngineSlot* target = step.slot.empty() ? nullptr : hooks_.slot(step.slot);
  switch (step.action) {
    case PoolAction::kGrant:
      if (target) Grant(*target);
      break;
    case PoolAction::kRelease:
      if (target) Release(*target);
      break;
    case PoolAction::kKillOwner:
      if (target) hooks_.fire(*target, SlotEvent::kKvStuck, "did not let the KV pool go: " + why);
      break;
    case PoolAction::kRetryLater: {
      std::string name = step.slot;
      hooks_.after(kGrantRetryMs, [this, name] {
        EngineSlot* t = hooks_.slot(name);
        if (t && t->state == SlotState::kActive && t->kv_capable && table_.state() == PoolState::kFree) {
          Fire(*t, PoolEvent::kWant, "retrying the KV pool");
        }
      });
      break;
    }
    case PoolAction::kNone:
    case PoolAction::kGrantIfWanted:
      break;
  }
  return step;
}

void KvPoolRoles::SendRole(EngineSlot& s, const std::string& role, bool pool, int64_t timeout_ms, Answer done) {
  http::ClientRequest req;
  req.method = "POST";
  req.target = "/wsup/role";
  req.headers.push_back({"Content-Type", "application/json"});
  if (!s.control_token.empty()) req.headers.push_back(http::ControlAuthHeader(s.control_token));
  req.body = json{{"role", role}, {"kv", pool ? "pool" : "scratch"}}.dump();
  req.timeout_ms = timeout_ms;
  EngineSlot* sp = &s;
  const pid_t pid = s.pid;
  const uint64_t seq = seq_;
  hooks_.send(s, std::move(req), [this, sp, pid, seq, done = std::move(done)](Result<http::HttpResponse> r) {
    if (sp->pid == pid && pid != 0) {
      json kv = KvOf(r);
      if (kv.is_object()) sp->kv = kv;
      // An engine without the route keeps a private cache.
      if (r.ok() && (r->status == 404 || KvSource(kv) == "private")) sp->kv_capable = false;
      if (r.ok() && r->status == 401) {
        spdlog::error("engine {}: its /wsup/role refused the supervisor's control token ({}); it is not "
                      "the engine this supervisor started",
                      sp->name, AnswerText(r));
      }
      if (kv.is_object()) OnEngineKv(*sp, kv, seq, "its /wsup/role answer");
    }
    if (done) done(std::move(r));
  });
}

void KvPoolRoles::Grant(EngineSlot& s) {
  EngineSlot* sp = &s;
  const pid_t pid = s.pid;
  const int64_t t0 = clock_.MonotonicMs();
  grant_in_flight_ = true;
  SendRole(s, "active", true, kGrantTimeoutMs, [this, sp, pid, t0](Result<http::HttpResponse> r) {
    grant_in_flight_ = false;
    // What waited for the grant runs once this answer is handled.
    if (!held_for_grant_.empty()) hooks_.after(0, [this] { RunHeldForGrant(); });
    // A process that is gone was dropped from the table by its exit.
    if (sp->pid != pid || pid == 0) return;
    const std::string source = KvSource(sp->kv);
    // The engine's own time to map it, for the log; not a number: 0.
    const auto map_ms = FieldOr<double>(sp->kv, "map_ms", 0.0);
    if (r.ok() && r->status == 200 && source == "pool") {
      hooks_.kv_full(sp->name);
      Fire(*sp, PoolEvent::kGranted,
           "mapped in " + std::to_string(clock_.MonotonicMs() - t0) + " ms (engine: " +
               std::to_string(map_ms.ok() ? *map_ms : 0.0) + " ms)");
    } else if (r.ok()) {
      // It answered, and it does not map the pool.
      Fire(*sp, PoolEvent::kGrantFailed,
           !sp->kv_capable ? "it keeps a private KV cache" : "it could not map it: " + AnswerText(r));
    } else {
      // No answer: it may have mapped it. It stays the owner until it
      // drains, fails or exits.
      spdlog::warn("kv pool: engine {} did not answer its grant ({}); it is taken to hold the pool until it "
                   "drains, fails or exits",
                   sp->name, r.error().message());
    }
  });
}

void KvPoolRoles::AfterGrant(std::function<void()> work) {
  if (!grant_in_flight_) {
    work();
    return;
  }
  held_for_grant_.push_back(std::move(work));
  hooks_.after(kHoldForGrantMs, [this] { RunHeldForGrant(); });
}

void KvPoolRoles::RunHeldForGrant() {
  auto held = std::move(held_for_grant_);
  held_for_grant_.clear();
  for (auto& w : held) w();
}

void KvPoolRoles::Release(EngineSlot& s) {
  EngineSlot* sp = &s;
  const pid_t pid = s.pid;
  SendRole(s, "standby", false, kReleaseTimeoutMs, [this, sp, pid](Result<http::HttpResponse> r) {
    if (sp->pid != pid || pid == 0) return;
    if (r.ok() && r->status == 200 && KvSource(sp->kv) != "pool") {
      Fire(*sp, PoolEvent::kReleased, "it let the pool go");
    } else {
      Fire(*sp, PoolEvent::kReleaseFailed, AnswerText(r));
    }
  });
}

void KvPoolRoles::OnEngineKv(EngineSlot& s, const json& kv, uint64_t seq_at_send, const char* where) {
  if (!Enabled() || !kv.is_object()) return;
  const bool maps = (kv.contains("source") && kv["source"] == "pool") ||
                    (kv.contains("pool_mapped") && kv["pool_mapped"].is_boolean() && kv["pool_mapped"].get<bool>());
  if (!maps || owner() == s.name) return;
  if (!IsLive(s.state) || s.state == SlotState::kStopping) return;
  if (seq_at_send != seq_) {
    spdlog::debug("engine {}: {} said it maps the KV pool, but the pool's table moved since it was asked; asking again",
                  s.name, where);
    hooks_.refresh_status(s);
    return;
  }
  const std::string who = owner().empty() ? "no engine" : "engine " + owner();
  const std::string why = std::string(where) + " says it maps the node's KV pool, which is " + who + "'s (pool " +
                          std::string(PoolStateName(table_.state())) +
                          "); two writers of one pool serve wrong tokens, so it is fenced";
  spdlog::error("engine {} (pid {}, {}): {}", s.name, s.pid, SlotStateName(s.state), why);
  metrics_.kv_pool_events["trespass"]++;
  FenceRecord rec;
  rec.time_ms = clock_.WallMs();
  rec.slot = s.name;
  rec.pid = s.pid;
  rec.slot_state = SlotStateName(s.state);
  rec.kind = "kv_pool";
  rec.pool_owner = owner();
  rec.reason = why;
  hooks_.record_fence(rec);
  hooks_.fire(s, SlotEvent::kKvTrespass, why);
}

void KvPoolRoles::AdoptHeld(const std::string& slot) {
  if (Enabled() && hooks_.slot(slot)) table_.AdoptHeld(slot);
}

void KvPoolRoles::AdoptOwner(const RuntimeState& prev) {
  if (!Enabled() || owner().empty()) return;
  EngineSlot* o = hooks_.slot(owner());
  if (!o) return;
  if (o->pid > 0) {
    // Adopted: it keeps the pool if it is the active engine, and lets it go
    // if it is the standby now.
    spdlog::info("kv pool: engine {} held it before the supervisor restart", o->name);
    if (o->state == SlotState::kStandby) Fire(*o, PoolEvent::kDrained, "the pool's owner is the standby");
    return;
  }
  // Not adopted: the pool is free once that process is gone.
  for (const auto& pe : prev.engines) {
    if (pe.slot != o->name || !hooks_.still_runs(pe.proc)) continue;
    spdlog::warn("kv pool: engine {} pid {} held it and was not adopted; the pool waits for its exit", o->name,
                 pe.proc.pid);
    auto w = hooks_.watch_exit(pe.proc.pid, [this, o](const ExitInfo& info) {
      Close();
      Fire(*o, PoolEvent::kGone, "the engine that held it before the restart " + info.Describe());
    });
    if (w.ok()) {
      fence_watch_ = *w;
      return;
    }
    spdlog::error("kv pool: cannot watch pid {}: {}; taking it as gone", pe.proc.pid, w.error().message());
  }
  Fire(*o, PoolEvent::kGone, "the engine that held it before the restart is gone");
}

json KvPoolRoles::StatusJson() const {
  return json{{"pool_mib", pool_mib_},
              {"scratch_mib", scratch_mib_},
              {"state", PoolStateName(table_.state())},
              {"owner", owner().empty() ? json(nullptr) : json(owner())},
              {"wanted", table_.wanted().empty() ? json(nullptr) : json(table_.wanted())}};
}

}  // namespace wsup
