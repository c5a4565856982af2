// Failover and promotion: the standby checked and promoted when the active
// slot fails (or a drill or the first start asks for an active engine), the
// ledger row, the probe through the front that proves the swap, and the
// answer to `wsup failover` once the rows are on disk.
#include "common/log.h"
#include "probes/probe.h"
#include "supervisor/supervisor_impl.h"
#include "supervisor/promotion_check.h"

namespace wsup {

using nlohmann::json;

PromotionCheck Supervisor::Impl::CheckStandby(Slot& s) {
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

bool Supervisor::Impl::Promote(Slot& s, const std::string& cause, std::string* unfit_out, std::string* note_out) {
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

void Supervisor::Impl::Failover(Slot& failed, FailoverTrigger trigger, const std::string& reason, int64_t fault_ms,
                                bool drill) {
  int64_t detected = clock_.WallMs();
  Slot* to = Other(&failed);
  std::string why = reason;
  std::string to_name;
  // The standby, or the engine a planned swap moved the traffic from and
  // that still drains: proven and serving until moments ago, it is the
  // node's only engine that can answer now (a crash in a rollout's watch
  // window lands here while the old version drains).
  const bool draining = to->state == SlotState::kDraining;
  if (to->state == SlotState::kStandby || draining) {
    // Checked before it takes the traffic.
    const std::string what = draining ? "draining engine " : "standby ";
    swapping_ = true;
    std::string unfit, note;
    bool promoted = Promote(*to, "failover from " + failed.name + (draining ? " (it was draining)" : ""), &unfit, &note);
    swapping_ = false;
    if (promoted) {
      to_name = to->name;
      if (draining) why = reason + "; " + what + to->name + " took the traffic back";
      if (!note.empty()) why += "; " + what + to->name + " " + note;
    } else {
      why = reason + "; " + what + to->name + " not promoted: " + unfit;
    }
  }
  PushRoutes();
  int64_t swapped = clock_.WallMs();
  FailoverRecord rec;
  rec.trigger = FailoverTriggerName(trigger);
  rec.reason = why;
  rec.drill = drill;
  rec.from_slot = failed.name;
  rec.to_slot = to_name.empty() ? "none" : to_name;
  rec.fault_ms = fault_ms;
  rec.detected_ms = detected;
  rec.swapped_ms = swapped;
  uint64_t seq = 0;
  auto id = LedgerResult(ledger_->RecordFailover(rec, &seq), "failover");
  metrics_.failovers[rec.trigger]++;
  TrackFailover(id, failed.name, failed.pid != 0 ? FromEngine::kExiting : FromEngine::kExited, to_name, fault_ms);
  failed.recovery_cause = rec.trigger;
  failed.recovery_fault_ms = fault_ms;
  if (id) failed.recovery_failover_id = *id;
  spdlog::warn("failover {} -> {} ({}: {}): detected {} ms after the fault, swapped {} ms later", failed.name,
               rec.to_slot, rec.trigger, why, detected - fault_ms, swapped - detected);
  if (to_name.empty()) {
    spdlog::error("no proven standby to take over; requests wait in the front until an engine is ready");
  }
  // Re-arm: a new standby in the failed slot. A killed engine's exit event
  // schedules the restart; one already reaped is restarted now.
  if (failed.pid == 0) ScheduleRestart(failed, -1);
  std::vector<std::shared_ptr<JsonConn>> waiters;
  if (pending_) waiters = std::move(pending_->waiters);
  pending_ = PendingFailover{id ? *id : 0, failed.name, to_name, fault_ms, detected, swapped, std::move(waiters), drill};
  if (id) {
    pending_->rows.push_back(seq);
  } else {
    pending_->unrecorded = ledger_last_error_;
  }
  if (!to_name.empty()) ArmProof();
}

namespace {
// How long after the swap a failover may wait for its first correct answer
// through the front. It normally comes in milliseconds; one that has not
// come by then (the front down, no answer right) is ended unproven.
constexpr int64_t kProofBudgetMs = 120'000;
}  // namespace

void Supervisor::Impl::ArmProof() {
  if (!pending_) return;
  const int64_t id = pending_->id;
  const std::string to = pending_->to;
  if (!proof_budget_) proof_budget_ = timers_.Make();
  proof_budget_->Start(kProofBudgetMs, [this, id] {
    if (pending_ && pending_->id == id) {
      AbandonPending("no correct answer came through the front within " + std::to_string(kProofBudgetMs / 1000) +
                     " s of the swap");
    }
  });
  // The proof is the promoted engine's probe for this interval: its own
  // monitor waits, or a probe of its that came mid-proof would add its
  // prompt's step to the proof's generation (the tail of kill to first
  // correct answer: docs/benchmarks.md, "The node's KV pool on the GPU").
  if (Slot* s = SlotByName(to); s && s->monitor) s->monitor->Postpone(cfg_.probe.interval_ms);
  // Only this failover's proof completes it: a later one has its own.
  ProbeThroughFront(
      [this, id, to](bool ok, int64_t at) {
        if (ok && pending_ && pending_->id == id && pending_->to == to) CompletePending(at);
      },
      200);
}

void Supervisor::Impl::AbandonPending(const std::string& why) {
  if (!pending_) return;
  PendingFailover p = std::move(*pending_);
  pending_.reset();
  if (proof_budget_) proof_budget_->Stop();
  spdlog::error("failover #{} ({} to {}) ended unproven: {}; its first correct answer is not recorded; check the "
                "front (`wsup status`, state/logs/front.log) and send a request through it",
                p.id, p.from, p.to.empty() ? "none" : p.to, why);
  json reply{{"type", "failover"}, {"ok", false},         {"from_slot", p.from}, {"to_slot", p.to},
             {"failover_id", p.id}, {"error", "the failover " + why}};
  for (auto& c : p.waiters) {
    if (c->alive()) c->Send(reply);
  }
  UpdateStatusLine();
  rollout_.OnFailoverEnded();
}

void Supervisor::Impl::TrackFailover(std::optional<int64_t> id, const std::string& from, FromEngine old,
                                     const std::string& to, int64_t fault_ms) {
  if (!id) return;
  tail_ = FailoverTimes{*id, from, to, fault_ms, false, false};
  if (old == FromEngine::kExiting) {
    tail_->await_gone = true;
  } else if (old == FromEngine::kExited) {
    // Reaped already (an adopted engine, seen through its pidfd alone).
    LedgerResult(ledger_->SetFailoverGone(*id, clock_.WallMs()), "failover gone");
  }
  tail_->await_kv = PoolEnabled() && !to.empty();
  if (tail_->await_kv && kv_.owner() == to && kv_.state() == PoolState::kHeld) {
    // A draining engine taken back still maps the pool: its full KV
    // capacity never left.
    const int64_t now = clock_.WallMs();
    LedgerResult(ledger_->SetFailoverKvFull(*id, now), "failover full KV");
    metrics_.ObserveKvBack(static_cast<double>(now - fault_ms) / 1000.0);
    tail_->await_kv = false;
  }
}

void Supervisor::Impl::CompletePending(int64_t first_ok_ms) {
  if (!pending_) return;
  PendingFailover p = std::move(*pending_);
  pending_.reset();
  if (proof_budget_) proof_budget_->Stop();
  if (p.id) {
    uint64_t seq = 0;
    Status st = ledger_->SetFailoverFirstOk(p.id, first_ok_ms, &seq);
    if (st.ok()) {
      p.rows.push_back(seq);
    } else if (p.unrecorded.empty()) {
      p.unrecorded = "its first correct answer: " + st.error().message();
    }
    LedgerResult(st, "failover first answer");
  }
  rollout_.OnFailoverEnded();
  json reply{{"type", "failover"},
             {"ok", true},
             {"from_slot", p.from},
             {"to_slot", p.to},
             {"fault_ms", p.fault_ms},
             {"swap_ms", p.swapped_ms - p.fault_ms},
             {"first_ok_ms", first_ok_ms - p.fault_ms},
             {"failover_id", p.id}};
  if (p.waiters.empty()) return;
  // `wsup failover` answers once the failover's rows are on disk, so what a
  // caller was told survives a crash of the supervisor right after.
  ReplyWhenRecorded(ledger_->QueuedSeq(), std::move(p.waiters), std::move(reply), clock_.MonotonicMs(),
                    std::move(p.rows), std::move(p.unrecorded));
}

void Supervisor::Impl::ReplyWhenRecorded(uint64_t seq, std::vector<std::shared_ptr<JsonConn>> waiters, json reply,
                                         int64_t since_mono, std::vector<uint64_t> rows, std::string unrecorded) {
  // As long as the ledger may take to write a row or give it up (its
  // retries included), so that the answer is final.
  const int64_t wait_ms = ledger_->MaxSettleMs();
  const int64_t waited = clock_.MonotonicMs() - since_mono;
  if (ledger_->HandledSeq() < seq && waited < wait_ms) {
    After(waited < 200 ? 2 : 50, [this, seq, waiters = std::move(waiters), reply = std::move(reply), since_mono,
                                  rows = std::move(rows), unrecorded = std::move(unrecorded)]() mutable {
      ReplyWhenRecorded(seq, std::move(waiters), std::move(reply), since_mono, std::move(rows), std::move(unrecorded));
    });
    return;
  }
  const bool checked = !rows.empty() || !unrecorded.empty();
  std::string lost = unrecorded;
  for (uint64_t r : rows) {
    if (!lost.empty()) break;
    if (auto why = ledger_->LostRow(r)) lost = *why;
  }
  if (ledger_->HandledSeq() < seq) {
    const std::string retrying = ledger_->stats().retry_error;
    reply["warning"] = "the ledger has not committed this row within " + std::to_string(wait_ms / 1000) +
                       " s; see the supervisor's log";
    if (lost.empty()) {
      lost = "not committed within " + std::to_string(wait_ms / 1000) + " s" +
             (retrying.empty() ? std::string() : " (the ledger is still retrying: " + retrying + ")");
    }
  }
  if (checked) {
    reply["recorded"] = lost.empty();
    if (!lost.empty()) {
      reply["ledger_error"] = lost;
      spdlog::error("the ledger did not record what `wsup failover` is told: {}", lost);
    }
  }
  for (auto& c : waiters) {
    if (c->alive()) c->Send(reply);
  }
}

void Supervisor::Impl::ProbeThroughFront(std::function<void(bool, int64_t)> done, int attempts_left) {
  SemanticProbeSpec spec;
  spec.prompt = cfg_.probe.prompt;
  spec.expect = cfg_.probe.expect;
  spec.expect_token_ids = cfg_.probe.expect_token_ids;
  spec.max_tokens = cfg_.probe.max_tokens;
  spec.timeout_ms = std::max<int64_t>(cfg_.probe.timeout_ms, 1000);
  http::ClientRequest req;
  req.method = "POST";
  req.target = "/v1/completions";
  req.headers.push_back({"Content-Type", "application/json"});
  req.body = SemanticRequestBody(spec);
  req.timeout_ms = spec.timeout_ms + cfg_.front.queue_timeout_ms;
  int64_t start = clock_.MonotonicMs();
  std::string host = cfg_.front.listen.host == "0.0.0.0" ? "127.0.0.1"
                     : cfg_.front.listen.host == "::"    ? "::1"
                                                         : cfg_.front.listen.host;
  http_->Send(host, front_.port(), std::move(req),
              [this, spec, start, done = std::move(done), attempts_left](const Result<http::HttpResponse>& r) mutable {
                int64_t lat = clock_.MonotonicMs() - start;
                ProbeOutcome o = EvaluateCompletion(spec, r, lat);
                if (o.ok) {
                  done(true, clock_.WallMs());
                  return;
                }
                if (attempts_left <= 1 || stopping_) {
                  spdlog::warn("probe through the front failed: {}", o.reason);
                  done(false, 0);
                  return;
                }
                auto retry = std::make_shared<std::function<void(bool, int64_t)>>(std::move(done));
                After(10, [this, retry, attempts_left] { ProbeThroughFront(*retry, attempts_left - 1); });
              });
}

void Supervisor::Impl::MaybePromote() {
  if (stopping_ || adopting_ || swapping_ || Active()) return;
  // Failovers and drills promote themselves; here: the first proven engine
  // at start, or the re-armed one after a failover that had no standby.
  for (Slot* s : {&a_, &b_}) {
    if (s->state != SlotState::kStandby) continue;
    swapping_ = true;
    bool promoted = Promote(*s, "no active engine", nullptr);
    swapping_ = false;
    if (!promoted) continue;
    PushRoutes();
    if (pending_ && pending_->to.empty()) {
      pending_->to = s->name;
      pending_->swapped_ms = clock_.WallMs();
      if (tail_ && tail_->id == pending_->id) tail_->await_kv = PoolEnabled();
      if (tail_ && tail_->id == pending_->id) tail_->to = s->name;
      ArmProof();
    }
    ProbeThroughFront(
        [this](bool ok, int64_t at) {
          if (!ok) return;
          if (!ready_notified_) {
            ready_notified_ = true;
            notifier_.Ready("serving: active engine proven through the front");
            spdlog::info("serving: the active engine answered the probe through the front");
          }
          UpdateStatusLine();
        },
        200);
    return;
  }
}

}  // namespace wsup
