// NodeLedger: the node's ledger (state/ledger.h) as the supervisor's owners
// use it. It owns the Ledger; the owners write their rows through ledger()
// and hand a failed write to Check(), which logs it and keeps its cause for
// `wsup status` (the Ledger counts every lost row itself). A caller waiting
// on rows (`wsup failover`, `wsup reload`) is answered through
// ReplyWhenRecorded(): once the ledger has handled every row queued before
// the answer, saying whether the rows it names are on disk.
//
// Threads: the loop thread (the Ledger's writer thread is its own).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/clock.h"
#include "common/one_shots.h"
#include "common/status.h"
#include "state/ledger.h"
#include "supervisor/metrics.h"
#include "wire/json_socket.h"

namespace wsup {

class NodeLedger {
 public:
  using Waiters = std::vector<std::shared_ptr<JsonConn>>;

  NodeLedger(TimerSource& timers, const Clock& clock) : clock_(clock), later_(timers) {}
  NodeLedger(const NodeLedger&) = delete;
  NodeLedger& operator=(const NodeLedger&) = delete;

  // Opens <state_dir>/wsup.db (the folder exists, made private).
  Status Open(const std::string& state_dir, const LedgerOptions& options = {});
  bool open() const { return ledger_ != nullptr; }
  // The rows' writer. Only after Open() succeeded.
  Ledger& ledger() { return *ledger_; }

  // A ledger write that failed: logged with its cause, kept as the last
  // error `wsup status` shows. What the row describes goes on.
  void Check(const Status& st, const char* what);
  template <typename T>
  std::optional<T> Check(Result<T> r, const char* what) {
    if (r.ok()) return std::move(*r);
    Check(Status(r.error()), what);
    return std::nullopt;
  }
  const std::string& last_error() const { return last_error_; }

  // What the ledger did with rows a caller waits on, once it has handled
  // everything queued before the wait, or MaxSettleMs() has passed.
  struct Settled {
    bool checked = false;  // rows (or an unrecorded one) were named
    std::string lost;      // why one of them is not on disk; "" when all are
    std::string warning;   // the ledger had not handled them in time
    // Writes "recorded" (and "ledger_error") when checked, and "warning".
    void Stamp(nlohmann::json& reply) const;
  };
  // done runs on the loop once what is queued now is handled: rows are
  // the sequence numbers of the rows the caller is told of, unrecorded why
  // one was refused before it was queued.
  void WhenSettled(std::vector<uint64_t> rows, std::string unrecorded, std::function<void(const Settled&)> done);
  // WhenSettled, then the reply, stamped, to every waiter still connected.
  void ReplyWhenRecorded(Waiters waiters, nlohmann::json reply, std::vector<uint64_t> rows = {},
                         std::string unrecorded = "");

  // `wsup status`'s "ledger_writes".
  nlohmann::json StatusJson() const;
  // The ledger's series of /metrics.
  void Report(Metrics& m) const;

  // Drains and closes the file (idempotent).
  void Close();

 private:
  struct Wait {
    uint64_t seq;
    int64_t since_mono;
    std::vector<uint64_t> rows;
    std::string unrecorded;
    std::function<void(const Settled&)> done;
  };
  void Poll(Wait w);

  const Clock& clock_;
  OneShots later_;
  std::unique_ptr<Ledger> ledger_;
  // The latest row refused before it was queued, and why.
  std::string last_error_;
};

}  // namespace wsup
