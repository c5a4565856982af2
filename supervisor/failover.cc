// Failover (failover.h): a failover's sequence, from the swap to the proof
// by the first correct answer through the front, its ledger row and times,
// and the answers to `wsup failover` callers.
#include "supervisor/failover.h"

#include "common/log.h"

namespace wsup {

using nlohmann::json;

Failover::Failover(TimerSource& timers, const Clock& clock, Hooks hooks)
    : timers_(timers), clock_(clock), hooks_(std::move(hooks)) {}

std::optional<int64_t> Failover::RecordRow(const FailoverRecord& rec, uint64_t* seq, const char* what) {
  Result<int64_t> id = hooks_.record_row(rec, seq);
  // Counted whether or not the ledger took it: the failover happened.
  hooks_.counted(rec.trigger);
  hooks_.phase("detect", static_cast<double>(rec.detected_ms - rec.fault_ms) / 1000.0);
  hooks_.phase("swap", static_cast<double>(rec.swapped_ms - rec.detected_ms) / 1000.0);
  if (!id.ok()) {
    LedgerError(Status(id.error()), what);
    return std::nullopt;
  }
  return *id;
}

void Failover::SetPending(Pending p, std::optional<int64_t> id, uint64_t seq) {
  pending_ = std::move(p);
  if (id) {
    pending_->rows.push_back(seq);
  } else {
    pending_->unrecorded = hooks_.ledger_last_error();
  }
}

void Failover::OnFailed(const std::string& from, bool from_alive, FailoverTrigger trigger, const std::string& reason,
                        int64_t fault_ms, bool drill) {
  const int64_t detected = clock_.WallMs();
  const std::string other = hooks_.other(from);
  const std::optional<SlotState> other_state = hooks_.state(other);
  std::string why = reason;
  std::string to_name;
  // The standby, or the engine a planned swap moved the traffic from and
  // that still drains: proven and serving until moments ago, it is the
  // node's only engine that can answer now (a crash in a rollout's watch
  // window lands here while the old version drains).
  const bool draining = other_state == SlotState::kDraining;
  if (other_state == SlotState::kStandby || draining) {
    // Checked before it takes the traffic.
    const std::string what = draining ? "draining engine " : "standby ";
    Promotion p = hooks_.promote(other, "failover from " + from + (draining ? " (it was draining)" : ""));
    if (p.promoted) {
      to_name = other;
      if (draining) why = reason + "; " + what + other + " took the traffic back";
      if (!p.note.empty()) why += "; " + what + other + " " + p.note;
    } else {
      why = reason + "; " + what + other + " not promoted: " + p.unfit;
    }
  }
  hooks_.push_routes();
  const int64_t swapped = clock_.WallMs();
  FailoverRecord rec;
  rec.trigger = FailoverTriggerName(trigger);
  rec.reason = why;
  rec.drill = drill;
  rec.from_slot = from;
  rec.to_slot = to_name.empty() ? "none" : to_name;
  rec.fault_ms = fault_ms;
  rec.detected_ms = detected;
  rec.swapped_ms = swapped;
  uint64_t seq = 0;
  const std::optional<int64_t> id = RecordRow(rec, &seq, "failover");
  Track(id, from, from_alive ? FromEngine::kExiting : FromEngine::kExited, to_name, fault_ms);
  spdlog::warn("failover {} -> {} ({}: {}): detected {} ms after the fault, swapped {} ms later", from, rec.to_slot,
               rec.trigger, why, detected - fault_ms, swapped - detected);
  if (to_name.empty()) {
    spdlog::error("no proven standby to take over; requests wait in the front until an engine is ready");
  }
  // Re-arm: a new standby in the failed slot.
  hooks_.rearm(from, rec.trigger, fault_ms, id);
  // A drill's caller waits on the failover its kill drives.
  Waiters waiters;
  if (pending_) waiters = std::move(pending_->waiters);
  SetPending(Pending{id ? *id : 0, from, to_name, fault_ms, detected, swapped, std::move(waiters), drill}, id, seq);
  if (!to_name.empty()) ArmProof();
}

void Failover::OnSwapped(const std::string& from, const std::string& standby, bool promoted, const std::string& why,
                         const std::string& unfit, int64_t fault_ms, int64_t swapped_ms,
                         const std::shared_ptr<JsonConn>& c) {
  const std::string to = promoted ? standby : "";
  FailoverRecord rec;
  const bool drill_swap = why == "planned drill";
  rec.trigger = FailoverTriggerName(drill_swap ? FailoverTrigger::kDrill : FailoverTrigger::kRollout);
  // "planned swap" for a drill (what the ledger has always said), with
  // the cause for anything else (a rollout).
  const std::string kind = drill_swap ? "planned swap" : "planned swap (" + why + ")";
  rec.reason = promoted ? kind : kind + "; standby " + standby + " not promoted: " + unfit;
  rec.drill = true;
  rec.from_slot = from;
  rec.to_slot = promoted ? to : "none";
  rec.fault_ms = fault_ms;
  rec.detected_ms = fault_ms;
  rec.swapped_ms = swapped_ms;
  uint64_t seq = 0;
  const std::optional<int64_t> id = RecordRow(rec, &seq, "planned failover");
  // Planned: the old engine lives on, as the standby (no exit to record).
  Track(id, from, FromEngine::kLivesOn, to, fault_ms);
  Waiters waiters;
  if (c) waiters.push_back(c);
  SetPending(Pending{id ? *id : 0, from, to, fault_ms, fault_ms, swapped_ms, std::move(waiters), true}, id, seq);
  if (promoted) ArmProof();
}

void Failover::ExpectKill(const std::string& from, int64_t fault_ms, const std::shared_ptr<JsonConn>& c) {
  // OnFailed() replaces this but keeps its waiters.
  pending_ = Pending{};
  pending_->from = from;
  pending_->fault_ms = fault_ms;
  if (c) pending_->waiters.push_back(c);
  pending_->drill = true;
}

void Failover::OnPromoted(const std::string& slot) {
  if (!pending_ || !pending_->to.empty()) return;
  pending_->to = slot;
  pending_->swapped_ms = clock_.WallMs();
  if (tail_ && tail_->id == pending_->id) {
    tail_->await_kv = hooks_.pool_enabled();
    tail_->to = slot;
  }
  ArmProof();
}

void Failover::OnRoutesAcked() {
  if (pending_ && pending_->swapped_ms == 0) pending_->swapped_ms = clock_.WallMs();
}

void Failover::OnFirstOk(int64_t at_ms) {
  if (pending_) Complete(at_ms);
}

void Failover::OnEngineGone(const std::string& slot) {
  if (tail_ && tail_->await_gone && tail_->from == slot) {
    LedgerError(hooks_.set_gone(tail_->id, clock_.WallMs()), "failover gone");
    tail_->await_gone = false;
  }
}

void Failover::OnKvFull(const std::string& slot) {
  if (tail_ && tail_->await_kv && tail_->to == slot) {
    const int64_t now = clock_.WallMs();
    LedgerError(hooks_.set_kv_full(tail_->id, now), "failover full KV");
    hooks_.phase("kv_full", static_cast<double>(now - tail_->fault_ms) / 1000.0);
    tail_->await_kv = false;
  }
}

void Failover::Track(std::optional<int64_t> id, const std::string& from, FromEngine old, const std::string& to,
                     int64_t fault_ms) {
  if (!id) return;
  tail_ = Times{*id, from, to, fault_ms, false, false};
  if (old == FromEngine::kExiting) {
    tail_->await_gone = true;
  } else if (old == FromEngine::kExited) {
    // Reaped already (an adopted engine, seen through its pidfd alone).
    LedgerError(hooks_.set_gone(*id, clock_.WallMs()), "failover gone");
  }
  tail_->await_kv = hooks_.pool_enabled() && !to.empty();
  if (tail_->await_kv && hooks_.pool_held_by(to)) {
    // A draining engine taken back still maps the pool: its full KV
    // capacity never left.
    const int64_t now = clock_.WallMs();
    LedgerError(hooks_.set_kv_full(*id, now), "failover full KV");
    hooks_.phase("kv_full", static_cast<double>(now - fault_ms) / 1000.0);
    tail_->await_kv = false;
  }
}

void Failover::ArmProof() {
  if (!pending_) return;
  const int64_t id = pending_->id;
  const std::string to = pending_->to;
  if (!proof_budget_) proof_budget_ = timers_.Make();
  proof_budget_->Start(kProofBudgetMs, [this, id] {
    if (pending_ && pending_->id == id) {
      Abandon("no correct answer came through the front within " + std::to_string(kProofBudgetMs / 1000) +
              " s of the swap");
    }
  });
  // The proof is the promoted engine's probe for this interval: its own
  // monitor waits, or a probe of its that came mid-proof would add its
  // prompt's step to the proof's generation (the tail of kill to first
  // correct answer: docs/benchmarks.md, "The node's KV pool on the GPU").
  hooks_.postpone_probe(to);
  // Only this failover's proof completes it: a later one has its own.
  hooks_.probe([this, id, to](bool ok, int64_t at) {
    if (ok && pending_ && pending_->id == id && pending_->to == to) Complete(at);
  });
}

void Failover::Abandon(const std::string& why) {
  if (!pending_) return;
  Pending p = std::move(*pending_);
  pending_.reset();
  if (proof_budget_) proof_budget_->Stop();
  spdlog::error("failover #{} ({} to {}) ended unproven: {}; its first correct answer is not recorded; check the "
                "front (`wsup status`, state/logs/front.log) and send a request through it",
                p.id, p.from, p.to.empty() ? "none" : p.to, why);
  json reply{{"type", "failover"}, {"ok", false},         {"from_slot", p.from}, {"to_slot", p.to},
             {"failover_id", p.id}, {"error", "the failover " + why}};
  hooks_.send(p.waiters, reply);
  hooks_.status_line();
  hooks_.ended();
}

void Failover::Complete(int64_t first_ok_ms) {
  if (!pending_) return;
  Pending p = std::move(*pending_);
  pending_.reset();
  if (proof_budget_) proof_budget_->Stop();
  hooks_.phase("first_answer", static_cast<double>(first_ok_ms - p.fault_ms) / 1000.0);
  if (p.id) {
    uint64_t seq = 0;
    Status st = hooks_.set_first_ok(p.id, first_ok_ms, &seq);
    if (st.ok()) {
      p.rows.push_back(seq);
    } else if (p.unrecorded.empty()) {
      p.unrecorded = "its first correct answer: " + st.error().message();
    }
    LedgerError(st, "failover first answer");
  }
  hooks_.ended();
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
  hooks_.answer(std::move(p.waiters), std::move(reply), std::move(p.rows), std::move(p.unrecorded));
}

std::string Failover::PendingText() const {
  if (!pending_) return "";
  const std::string to = pending_->to.empty() ? "no engine yet" : "engine " + pending_->to;
  const int64_t secs = std::max<int64_t>(0, clock_.WallMs() - pending_->fault_ms) / 1000;
  return "a failover is in progress (engine " + (pending_->from.empty() ? std::string("?") : pending_->from) + " to " +
         to + ", " + std::to_string(secs) + " s ago; it ends with the first correct answer through the front)";
}

std::string Failover::Refusal() const {
  if (!pending_) return "";
  return PendingText() + "; try again once `wsup status` shows failover.in_progress false";
}

void Failover::Refuse(const std::shared_ptr<JsonConn>& c, const std::string& why) {
  hooks_.send({c}, json{{"type", "failover"}, {"ok", false}, {"error", why}});
}

json Failover::StatusJson() const {
  // A failover ends with the first correct answer through the front; until
  // then drills and rollouts are refused (they say so and point here).
  json fo{{"in_progress", pending_.has_value()}};
  if (pending_) {
    fo["failover_id"] = pending_->id;
    fo["from_slot"] = pending_->from;
    fo["to_slot"] = pending_->to.empty() ? json(nullptr) : json(pending_->to);
    fo["fault_ms"] = pending_->fault_ms;
    fo["drill"] = pending_->drill;
  }
  return fo;
}

std::string Failover::SwapRefusal(const std::string& from, const std::string& to) const {
  if (from.empty()) return "no active engine to fail over from";
  if (InProgress()) return Refusal();
  const std::optional<SlotState> st = hooks_.state(to);
  if (st != SlotState::kStandby) {
    return "the standby (" + to + ") is " + (st ? SlotStateName(*st) : "no slot") +
           ", not proven ready; wait for `wsup status` to show it semantically ready";
  }
  if (PromotionCheck check = hooks_.check(to); !check.unfit.empty()) {
    return "the standby (" + to + ") is not fit to take the traffic: " + check.unfit;
  } else if (!check.note.empty()) {
    // A planned swap moves traffic off a healthy active: only onto a
    // standby proven just now. (A crash promotes it anyway; see
    // promotion_check.h.)
    return "the standby (" + to + ") is not proven recently: " + check.note.substr(0, check.note.find(" but")) +
           "; try again once its next probe passes";
  }
  return "";
}

void Failover::Drill(const std::shared_ptr<JsonConn>& c, bool kill) {
  const std::string act = hooks_.active();
  const std::string stby = act.empty() ? "" : hooks_.other(act);
  std::string refuse = SwapRefusal(act, stby);
  if (refuse.empty()) {
    if (std::string step = hooks_.rollout_step(); !step.empty()) {
      refuse = "a rollout is in progress (step " + step + "); drill once `wsup status` shows it ended";
    }
  }
  if (!refuse.empty()) {
    Refuse(c, refuse);
    return;
  }
  if (kill) {
    const int64_t fault = clock_.WallMs();
    ExpectKill(act, fault, c);
    // The exit drives the failover exactly as a real crash would.
    hooks_.kill(act, fault);
    return;
  }
  PlannedSwap(act, stby, "planned drill", c);
}

bool Failover::PlannedSwap(const std::string& from, const std::string& to, const std::string& why,
                           const std::shared_ptr<JsonConn>& c) {
  // The standby takes new traffic at once; the old active drains, then
  // becomes the standby. Both moves are rows of the engine table; the
  // front gets the routes once, after both.
  const int64_t fault = clock_.WallMs();
  hooks_.demote(from, why);
  Promotion p = hooks_.promote(to, why);
  hooks_.push_routes();
  const int64_t swapped = clock_.WallMs();
  // Its row, its proof and the answer to c.
  OnSwapped(from, to, p.promoted, why, p.unfit, fault, swapped, c);
  FinishDrain(from, clock_.MonotonicMs());
  return p.promoted;
}

void Failover::FinishDrain(const std::string& old, int64_t started_mono) {
  if (hooks_.state(old) != SlotState::kDraining) return;
  hooks_.inflight(old, [this, old, started_mono](int64_t inflight) {
    // Taken back as the active engine (the one that replaced it failed)
    // while the front was asked: the drain is over without its `drained`.
    if (hooks_.state(old) != SlotState::kDraining) return;
    if (inflight == 0 || clock_.MonotonicMs() - started_mono > kDrainBudgetMs) {
      hooks_.drained(old, inflight == 0 ? "no request in flight"
                                        : "drain budget of " + std::to_string(kDrainBudgetMs / 1000) +
                                              " s ran out with requests in flight");
      return;
    }
    auto& poll = drain_polls_[old];
    if (!poll) poll = timers_.Make();
    poll->Start(kDrainPollMs, [this, old, started_mono] { FinishDrain(old, started_mono); });
  });
}

}  // namespace wsup
