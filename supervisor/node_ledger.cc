#include "supervisor/node_ledger.h"

#include "common/log.h"

namespace wsup {

using nlohmann::json;

Status NodeLedger::Open(const std::string& state_dir, const LedgerOptions& options) {
  auto ledger = Ledger::Open(Ledger::PathIn(state_dir), options);
  if (!ledger.ok()) return ledger.error();
  ledger_ = std::move(*ledger);
  return Status::Ok();
}

void NodeLedger::Check(const Status& st, const char* what) {
  if (st.ok()) return;
  last_error_ = std::string(what) + ": " + st.error().message();
  spdlog::error("ledger: {} was not recorded: {}", what, st.error().message());
}

void NodeLedger::Settled::Stamp(json& reply) const {
  if (!warning.empty()) reply["warning"] = warning;
  if (!checked) return;
  reply["recorded"] = lost.empty();
  if (!lost.empty()) reply["ledger_error"] = lost;
}

void NodeLedger::WhenSettled(std::vector<uint64_t> rows, std::string unrecorded,
                             std::function<void(const Settled&)> done) {
  Poll(Wait{ledger_->QueuedSeq(), clock_.MonotonicMs(), std::move(rows), std::move(unrecorded), std::move(done)});
}

void NodeLedger::ReplyWhenRecorded(Waiters waiters, json reply, std::vector<uint64_t> rows, std::string unrecorded) {
  WhenSettled(std::move(rows), std::move(unrecorded),
              [waiters = std::move(waiters), reply = std::move(reply)](const Settled& settled) mutable {
                settled.Stamp(reply);
                for (auto& c : waiters) {
                  if (c && c->alive()) c->Send(reply);
                }
              });
}

void NodeLedger::Poll(Wait w) {
  // As long as the ledger may take to write a row or give it up (its
  // retries included), so that the answer is final.
  const int64_t wait_ms = ledger_->MaxSettleMs();
  const int64_t waited = clock_.MonotonicMs() - w.since_mono;
  if (ledger_->HandledSeq() < w.seq && waited < wait_ms) {
    // Often at first (a batch commits in milliseconds), then gently.
    later_.After(waited < 200 ? 2 : 50, [this, w = std::move(w)]() mutable { Poll(std::move(w)); });
    return;
  }
  Settled s;
  s.checked = !w.rows.empty() || !w.unrecorded.empty();
  s.lost = w.unrecorded;
  for (uint64_t r : w.rows) {
    if (!s.lost.empty()) break;
    if (auto why = ledger_->LostRow(r)) s.lost = *why;
  }
  if (ledger_->HandledSeq() < w.seq) {
    const std::string retrying = ledger_->stats().retry_error;
    s.warning = "the ledger has not committed this row within " + std::to_string(wait_ms / 1000) +
                " s; see the supervisor's log";
    if (s.lost.empty()) {
      s.lost = "not committed within " + std::to_string(wait_ms / 1000) + " s" +
               (retrying.empty() ? std::string() : " (the ledger is still retrying: " + retrying + ")");
    }
  }
  if (s.checked && !s.lost.empty()) spdlog::error("the ledger did not record what a caller is told: {}", s.lost);
  w.done(s);
}

json NodeLedger::StatusJson() const {
  Ledger::Stats ls = ledger_->stats();
  // write_errors: rows lost by this supervisor; lost_rows: by every run
  // since the ledger was created (its side file, so a restart keeps them).
  json lj{{"write_errors", ls.failed + ls.dropped + ls.refused},
          {"committed", ls.committed},
          {"waiting", ls.waiting},
          {"retrying", ls.retrying},
          {"lost_rows", ls.losses.rows}};
  if (ls.losses.rows > 0) {
    lj["lost_by_table"] = ls.losses.by_table;
    lj["lost_first_ms"] = ls.losses.first_ms;
    lj["lost_last_ms"] = ls.losses.last_ms;
    lj["lost_last_error"] = ls.losses.last_error;
  }
  if (!last_error_.empty()) lj["last_error"] = last_error_;
  if (!ls.last_error.empty()) lj["last_write_error"] = ls.last_error;
  if (ls.retrying) lj["retry_error"] = ls.retry_error;
  if (!ls.loss_file_error.empty()) lj["lost_file_error"] = ls.loss_file_error;
  if (ls.reopens > 0) lj["reopened"] = ls.reopened;
  return lj;
}

void NodeLedger::Report(Metrics& m) const {
  Ledger::Stats ls = ledger_->stats();
  m.ledger_write_errors = ls.failed + ls.dropped + ls.refused;
  m.ledger_lost_rows = static_cast<uint64_t>(ls.losses.rows);
}

void NodeLedger::Close() {
  if (ledger_) ledger_->Close();
}

}  // namespace wsup
