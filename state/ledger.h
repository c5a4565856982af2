// Ledger: the supervisor's durable record of what happened (failovers, cache
// lookups, recoveries, holder restarts, probe verdicts) in <state_dir>/wsup.db.
//
// Writes never block the caller on the disk: Record*() checks the row,
// assigns its id, queues it and returns at once; one writer thread owned by
// the Ledger commits queued rows in batches (one transaction per batch).
// Flush() blocks until everything queued so far is committed, and is meant
// for shutdown, tests and tools, never for the supervisor's event loop.
//
// Durability: WAL journal with synchronous=FULL, so a row is on disk when its
// batch commits; a process kill (or a power loss) keeps every committed row
// and the file stays consistent. Rows still queued when the process dies are
// lost; that window is one batch (a few milliseconds).
//
// Ids: the ledger has one writer (the supervisor), so ids are taken from
// counters read at Open() (MAX(id) + 1 per table) and returned synchronously;
// a recovery can thus name its failover before either is on disk.
//
// Bounded memory: at most max_queue rows wait; past that Record*() refuses
// the row with kUnavailable (the caller logs it) instead of growing without
// bound behind a stuck disk. stats() counts what was dropped.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <variant>

#include "common/status.h"
#include "state/records.h"

namespace wsup {

struct LedgerOptions {
  size_t max_queue = 100'000;   // rows waiting for the writer
  int busy_timeout_ms = 5000;   // how long a write waits for another connection's lock
};

class Ledger {
 public:
  // The ledger of a state_dir: <state_dir>/wsup.db.
  static std::string PathIn(const std::string& state_dir);

  // Opens or creates the file, migrates the schema, starts the writer.
  // The folder must exist (the supervisor creates state_dir).
  static Result<std::unique_ptr<Ledger>> Open(const std::string& path, const LedgerOptions& options = {});

  ~Ledger();  // Close()
  Ledger(const Ledger&) = delete;
  Ledger& operator=(const Ledger&) = delete;

  // Queue one row; return its id. A row with a value outside its allowed set
  // (trigger, result, ...) is refused here with kInvalidArgument.
  Result<int64_t> RecordFailover(FailoverRecord row);
  Result<int64_t> RecordCacheEvent(CacheEventRecord row);
  Result<int64_t> RecordRecovery(RecoveryRecord row);
  Result<int64_t> RecordHolderRestart(HolderRestartRecord row);
  Result<int64_t> RecordProbeTransition(ProbeTransitionRecord row);
  Result<int64_t> RecordFence(FenceRecord row);
  // A rollout as it begins (its id assigned), then the same id again,
  // whole, as it goes on and ends (the row is replaced).
  Result<int64_t> RecordRollout(RolloutRecord row);
  Status UpdateRollout(RolloutRecord row);
  // Fills in first_ok_ms of a failover recorded earlier.
  Status SetFailoverFirstOk(int64_t failover_id, int64_t first_ok_ms);
  // Fills in gone_ms, or kv_full_ms, of a failover recorded earlier.
  Status SetFailoverGone(int64_t failover_id, int64_t gone_ms);
  Status SetFailoverKvFull(int64_t failover_id, int64_t kv_full_ms);

  // Blocks until every row queued before the call is committed. Returns the
  // first write error since the previous Flush(), if any.
  Status Flush();

  // For callers that must not block (the supervisor's loop) but must not
  // answer before a row is on disk: the sequence number of the last row
  // queued so far, and the highest sequence number handled by the writer
  // (committed, or refused and counted). Poll HandledSeq() >= QueuedSeq().
  uint64_t QueuedSeq() const;
  uint64_t HandledSeq() const;

  // Drains the queue, stops the writer and closes the file. Idempotent;
  // Record*() after Close() fails with kUnavailable.
  void Close();

  struct Stats {
    uint64_t queued = 0;     // accepted by Record*()
    uint64_t committed = 0;  // on disk
    uint64_t failed = 0;     // refused by SQLite (logged)
    uint64_t dropped = 0;    // refused because the queue was full
    size_t waiting = 0;      // in the queue now
    std::string last_error;  // the latest row the writer could not write, and why
  };
  Stats stats() const;
  const std::string& path() const { return path_; }

  // A time filled in later on a failover's row.
  struct FailoverTime {
    enum class Field { kFirstOk, kGone, kKvFull };
    int64_t id;
    Field field;
    int64_t ms;
  };
  using Item = std::variant<FailoverRecord, CacheEventRecord, RecoveryRecord, HolderRestartRecord,
                            ProbeTransitionRecord, FailoverTime, RolloutRecord, FenceRecord>;

 private:
  struct Writer;
  Ledger(std::string path, const LedgerOptions& options);
  Result<int64_t> Enqueue(Item item, int64_t* counter);
  Status SetFailoverTime(FailoverTime t);
  void Run();

  const std::string path_;
  const LedgerOptions options_;
  std::unique_ptr<Writer> writer_;  // the connection and statements; used by the thread only

  mutable std::mutex mu_;
  std::condition_variable work_cv_;  // the writer waits for rows or stop
  std::condition_variable done_cv_;  // Flush() waits for commits
  std::deque<std::pair<uint64_t, Item>> queue_;
  uint64_t next_seq_ = 1;       // sequence of the next queued item
  uint64_t done_seq_ = 0;       // every item up to this one is handled
  bool stopping_ = false;
  bool closed_ = false;
  Status first_error_;
  Stats stats_;
  int64_t next_failover_ = 1, next_cache_ = 1, next_recovery_ = 1, next_holder_ = 1, next_probe_ = 1,
          next_rollout_ = 1, next_fence_ = 1;
  std::thread thread_;
};

}  // namespace wsup
