// The node's KV pool: which engine maps it (supervisor/kv_handover.h), the
// role requests that carry the table's actions out (POST /wsup/role,
// engine/kv_pool_link.h), and what the engines say of their KV and memory.
//
// The table's events come from the engine table's moves (PoolOnSlotMoved,
// called by Fire()) and from the pidfd's exit (OnEngineExit): a slot that
// becomes active is wanted; one that fails is fenced; one that drains is
// asked to let the pool go; only an answer that it did, or its exit, frees
// the pool for the next. The lifeline's EOF fails a slot (it is dying), but
// never frees the pool: a dying GPU process may still be running kernels.
#include "common/json_fields.h"
#include "common/json_limits.h"
#include "common/log.h"
#include "http/control_auth.h"
#include "supervisor/supervisor_impl.h"

namespace wsup {

using nlohmann::json;

namespace {

// How long an engine may take to map the pool or to let it go. Mapping is
// milliseconds; letting go waits for the sequences on the pool, which a
// drain has ended already, so a release past this is a stuck engine.
constexpr int64_t kGrantTimeoutMs = 30'000;
// The longest a restart waits for a pool grant in flight (AfterGrant).
constexpr int64_t kHoldForGrantMs = 100;
constexpr int64_t kReleaseTimeoutMs = 30'000;
constexpr int64_t kGrantRetryMs = 1000;

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

bool Supervisor::Impl::PoolEnabled() const { return cfg_.kv.pool_mib > 0; }

void Supervisor::Impl::PoolOnSlotMoved(Slot& s, SlotState from, SlotState to, const std::string& cause) {
  if (!PoolEnabled() || from == to) return;
  if (from == SlotState::kActive) PoolFire(s, PoolEvent::kUnwant, cause);
  if (to == SlotState::kFailed) PoolFire(s, PoolEvent::kFailed, cause);
  if (from == SlotState::kDraining && to == SlotState::kStandby) PoolFire(s, PoolEvent::kDrained, cause);
  if (to == SlotState::kActive) {
    if (!s.kv_capable) {
      spdlog::info("kv pool: engine {} keeps a private KV cache; the pool is not given to it", s.name);
      return;
    }
    KvHandover::Step step = PoolFire(s, PoolEvent::kWant, cause);
    if (step.action != PoolAction::kGrant) {
      // Another engine may still write the pool: this one serves from its
      // scratch until the table frees it. A standby that holds it (found
      // so by a restarted supervisor) has no traffic of its own to wait for.
      Slot* owner = SlotByName(kv_.owner());
      if (owner && owner != &s && owner->state == SlotState::kStandby) {
        PoolFire(*owner, PoolEvent::kDrained, "the pool's owner is the standby");
      }
      if (kv_.owner() != s.name) SendRole(s, "active", false, 2000, nullptr);
    }
  }
}

KvHandover::Step Supervisor::Impl::PoolFire(Slot& s, PoolEvent event, const std::string& why) {
  const PoolState before = kv_.state();
  KvHandover::Step step = kv_.Fire(event, s.name);
  if (!step.applied) {
    if (event != PoolEvent::kUnwant) {
      spdlog::debug("kv pool: {} of engine {} changes nothing ({}, owner {})", PoolEventName(event), s.name,
                    PoolStateName(before), kv_.owner().empty() ? "none" : kv_.owner());
    }
    return step;
  }
  spdlog::info("kv pool: {} --{}({})--> {} [{}{}] {}", PoolStateName(before), PoolEventName(event), s.name,
               PoolStateName(kv_.state()), PoolActionName(step.action), step.slot.empty() ? "" : " " + step.slot,
               why);
  ++pool_seq_;
  metrics_.kv_pool_events[PoolEventName(event)]++;
  metrics_.kv_pool_owner = kv_.state() == PoolState::kHeld ? kv_.owner() : "";
  SaveState();  // a restarted supervisor must know who may write the pool
  Slot* target = step.slot.empty() ? nullptr : SlotByName(step.slot);
  switch (step.action) {
    case PoolAction::kGrant:
      if (target) GrantPool(*target);
      break;
    case PoolAction::kRelease:
      if (target) ReleasePool(*target);
      break;
    case PoolAction::kKillOwner:
      if (target) Fire(*target, SlotEvent::kKvStuck, "did not let the KV pool go: " + why);
      break;
    case PoolAction::kRetryLater: {
      std::string name = step.slot;
      After(kGrantRetryMs, [this, name] {
        Slot* t = SlotByName(name);
        if (t && t->state == SlotState::kActive && t->kv_capable && kv_.state() == PoolState::kFree) {
          PoolFire(*t, PoolEvent::kWant, "retrying the KV pool");
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

void Supervisor::Impl::SendRole(Slot& s, const std::string& role, bool pool, int64_t timeout_ms,
                                std::function<void(Result<http::HttpResponse>)> done) {
  http::ClientRequest req;
  req.method = "POST";
  req.target = "/wsup/role";
  req.headers.push_back({"Content-Type", "application/json"});
  if (!s.control_token.empty()) req.headers.push_back(http::ControlAuthHeader(s.control_token));
  req.body = json{{"role", role}, {"kv", pool ? "pool" : "scratch"}}.dump();
  req.timeout_ms = timeout_ms;
  Slot* sp = &s;
  const pid_t pid = s.pid;
  const uint64_t seq = pool_seq_;
  http_->Send(cfg_.engine.host, s.port, std::move(req),
              [this, sp, pid, seq, done = std::move(done)](Result<http::HttpResponse> r) {
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
                  if (kv.is_object()) CheckPoolTrespass(*sp, kv, seq, "its /wsup/role answer");
                }
                if (done) done(std::move(r));
              });
}

void Supervisor::Impl::GrantPool(Slot& s) {
  Slot* sp = &s;
  const pid_t pid = s.pid;
  const int64_t t0 = clock_.MonotonicMs();
  grant_in_flight_ = true;
  SendRole(s, "active", true, kGrantTimeoutMs, [this, sp, pid, t0](Result<http::HttpResponse> r) {
    grant_in_flight_ = false;
    // What waited for the grant runs once this answer is handled.
    if (!held_for_grant_.empty()) After(0, [this] { RunHeldForGrant(); });
    // A process that is gone was dropped from the table by its exit.
    if (sp->pid != pid || pid == 0) return;
    const std::string source = KvSource(sp->kv);
    // The engine's own time to map it, for the log; not a number: 0.
    const auto map_ms = FieldOr<double>(sp->kv, "map_ms", 0.0);
    if (r.ok() && r->status == 200 && source == "pool") {
      failover_.OnKvFull(sp->name);
      PoolFire(*sp, PoolEvent::kGranted,
               "mapped in " + std::to_string(clock_.MonotonicMs() - t0) + " ms (engine: " +
                   std::to_string(map_ms.ok() ? *map_ms : 0.0) + " ms)");
    } else if (r.ok()) {
      // It answered, and it does not map the pool.
      PoolFire(*sp, PoolEvent::kGrantFailed,
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

void Supervisor::Impl::AfterGrant(std::function<void()> work) {
  if (!grant_in_flight_) {
    work();
    return;
  }
  held_for_grant_.push_back(std::move(work));
  After(kHoldForGrantMs, [this] { RunHeldForGrant(); });
}

void Supervisor::Impl::RunHeldForGrant() {
  auto held = std::move(held_for_grant_);
  held_for_grant_.clear();
  for (auto& w : held) w();
}

void Supervisor::Impl::ReleasePool(Slot& s) {
  Slot* sp = &s;
  const pid_t pid = s.pid;
  SendRole(s, "standby", false, kReleaseTimeoutMs, [this, sp, pid](Result<http::HttpResponse> r) {
    if (sp->pid != pid || pid == 0) return;
    if (r.ok() && r->status == 200 && KvSource(sp->kv) != "pool") {
      PoolFire(*sp, PoolEvent::kReleased, "it let the pool go");
    } else {
      PoolFire(*sp, PoolEvent::kReleaseFailed, AnswerText(r));
    }
  });
}

void Supervisor::Impl::CheckPoolTrespass(Slot& s, const json& kv, uint64_t seq_at_send, const char* where) {
  if (!PoolEnabled() || !kv.is_object()) return;
  const bool maps = (kv.contains("source") && kv["source"] == "pool") ||
                    (kv.contains("pool_mapped") && kv["pool_mapped"].is_boolean() && kv["pool_mapped"].get<bool>());
  if (!maps || kv_.owner() == s.name) return;
  if (!IsLive(s.state) || s.state == SlotState::kStopping) return;
  if (seq_at_send != pool_seq_) {
    spdlog::debug("engine {}: {} said it maps the KV pool, but the pool's table moved since it was asked; asking again",
                  s.name, where);
    RefreshStatus(s);
    return;
  }
  const std::string owner = kv_.owner().empty() ? "no engine" : "engine " + kv_.owner();
  const std::string why = std::string(where) + " says it maps the node's KV pool, which is " + owner +
                          "'s (pool " + std::string(PoolStateName(kv_.state())) +
                          "); two writers of one pool serve wrong tokens, so it is fenced";
  spdlog::error("engine {} (pid {}, {}): {}", s.name, s.pid, SlotStateName(s.state), why);
  metrics_.kv_pool_events["trespass"]++;
  RecordFence(s, why);
  Fire(s, SlotEvent::kKvTrespass, why);
}

void Supervisor::Impl::RefreshStatus(Slot& s) {
  if (!IsLive(s.state) || s.state == SlotState::kStarting || s.pid == 0) return;
  http::ClientRequest req;
  req.target = "/wsup/status";
  req.timeout_ms = 1000;
  if (!s.control_token.empty()) req.headers.push_back(http::ControlAuthHeader(s.control_token));
  Slot* sp = &s;
  const pid_t pid = s.pid;
  const uint64_t seq = pool_seq_;
  http_->Send(cfg_.engine.host, s.port, std::move(req), [this, sp, pid, seq](Result<http::HttpResponse> r) {
    if (sp->pid != pid || !r.ok() || r->status != 200) return;
    auto st = ParseJsonChecked(r->body, "engine " + sp->name + "'s /wsup/status", "it is not a wsup engine's status");
    if (!st.ok() || !st->is_object()) return;
    if (st->contains("nonce") && (*st)["nonce"] != sp->nonce) return;
    if (st->contains("kv") && (*st)["kv"].is_object()) {
      sp->kv = (*st)["kv"];
      CheckPoolTrespass(*sp, sp->kv, seq, "its /wsup/status");
      if (sp->pid != pid || !IsLive(sp->state)) return;
    }
    if (st->contains("resume") && (*st)["resume"].is_object()) {
      const json& r = (*st)["resume"];
      sp->resume = r;
      // Added to the slot's totals as they grow: a counter must not fall
      // back to zero when the engine that counted dies.
      auto& m = metrics_.engine_resume[sp->name];
      for (const char* k : {"adopted_sequences", "adopted_tokens", "recomputed_sequences"}) {
        if (!r.contains(k) || !r[k].is_number_unsigned()) continue;
        const uint64_t now = r[k].get<uint64_t>();
        uint64_t& seen = sp->resume_seen[k];
        m[k] += now >= seen ? now - seen : now;
        seen = now;
      }
    }
    // An adopted engine's communicator was never reported while it started.
    if (st->contains("comm") && (*st)["comm"].is_object() && (*st)["comm"].contains("warm") &&
        (*st)["comm"]["warm"].is_boolean()) {
      sp->comm_warm = (*st)["comm"]["warm"].get<bool>();
    }
    if (st->contains("memory") && (*st)["memory"].is_object()) {
      sp->memory = (*st)["memory"];
      for (const char* part : {"weights_bytes", "kv_bytes", "other_bytes"}) {
        if ((*st)["memory"].contains(part) && (*st)["memory"][part].is_number_unsigned()) {
          std::string name = part;
          metrics_.engine_memory[sp->name][name.substr(0, name.size() - 6)] = (*st)["memory"][part].get<uint64_t>();
        }
      }
    }
  });
}

json Supervisor::Impl::PoolStatusJson() const {
  json j{{"pool_mib", cfg_.kv.pool_mib},
         {"scratch_mib", cfg_.kv.scratch_mib},
         {"state", PoolStateName(kv_.state())},
         {"owner", kv_.owner().empty() ? json(nullptr) : json(kv_.owner())},
         {"wanted", kv_.wanted().empty() ? json(nullptr) : json(kv_.wanted())}};
  return j;
}

}  // namespace wsup
