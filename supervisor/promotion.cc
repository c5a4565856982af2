// Promotion: the standby checked and promoted (for a failover, a drill, or
// the first start that needs an active engine), Failover's hooks
// (failover.h), the probe through the front, and the answers to `wsup
// failover` and `wsup reload` callers once their rows are on disk.
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

Failover::Hooks Supervisor::Impl::FailoverHooks() {
  Failover::Hooks h;
  h.state = [this](const std::string& name) -> std::optional<SlotState> {
    if (Slot* s = SlotByName(name)) return s->state;
    return std::nullopt;
  };
  h.other = [this](const std::string& name) -> std::string {
    Slot* s = SlotByName(name);
    return s ? Other(s)->name : "";
  };
  h.promote = [this](const std::string& name, const std::string& cause) {
    Failover::Promotion p;
    Slot* s = SlotByName(name);
    if (!s) return p;
    // MaybePromote() waits while the failover moves the roles.
    swapping_ = true;
    p.promoted = Promote(*s, cause, &p.unfit, &p.note);
    swapping_ = false;
    return p;
  };
  h.push_routes = [this] { PushRoutes(); };
  h.record_row = [this](const FailoverRecord& rec, uint64_t* seq) { return ledger_->RecordFailover(rec, seq); };
  h.set_gone = [this](int64_t id, int64_t ms) { return ledger_->SetFailoverGone(id, ms); };
  h.set_kv_full = [this](int64_t id, int64_t ms) { return ledger_->SetFailoverKvFull(id, ms); };
  h.set_first_ok = [this](int64_t id, int64_t ms, uint64_t* seq) { return ledger_->SetFailoverFirstOk(id, ms, seq); };
  h.ledger_error = [this](const Status& st, const char* what) { LedgerResult(st, what); };
  h.ledger_last_error = [this] { return ledger_last_error_; };
  h.counted = [this](const std::string& trigger) { metrics_.failovers[trigger]++; };
  h.kv_back = [this](double seconds) { metrics_.ObserveKvBack(seconds); };
  h.pool_enabled = [this] { return kv_.Enabled(); };
  h.pool_held_by = [this](const std::string& name) { return kv_.HeldBy(name); };
  h.rearm = [this](const std::string& name, const std::string& trigger, int64_t fault_ms, std::optional<int64_t> id) {
    Slot* s = SlotByName(name);
    if (!s) return;
    s->recovery_cause = trigger;
    s->recovery_fault_ms = fault_ms;
    if (id) s->recovery_failover_id = *id;
    // A killed engine's exit event schedules the restart; one already
    // reaped is restarted now.
    if (s->pid == 0) ScheduleRestart(*s, -1);
  };
  h.postpone_probe = [this](const std::string& name) {
    if (Slot* s = SlotByName(name); s && s->monitor) s->monitor->Postpone(cfg_.probe.interval_ms);
  };
  h.probe = [this](std::function<void(bool, int64_t)> done) { ProbeThroughFront(std::move(done), 200); };
  h.send = [](const Failover::Waiters& waiters, const json& reply) {
    for (const auto& c : waiters) {
      if (c && c->alive()) c->Send(reply);
    }
  };
  h.answer = [this](Failover::Waiters waiters, json reply, std::vector<uint64_t> rows, std::string unrecorded) {
    ReplyWhenRecorded(ledger_->QueuedSeq(), std::move(waiters), std::move(reply), clock_.MonotonicMs(),
                      std::move(rows), std::move(unrecorded));
  };
  h.status_line = [this] { UpdateStatusLine(); };
  h.ended = [this] { rollout_.OnFailoverEnded(); };
  return h;
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
    // A failover that had no engine to take over has one now.
    failover_.OnPromoted(s->name);
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
