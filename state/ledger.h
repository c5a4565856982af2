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
// Failed writes: a batch that fails for a cause that can pass (a lock held
// by another connection past busy_timeout_ms, a full disk, an I/O error) is
// tried again, with growing pauses, for retry_ms; rows queued meanwhile join
// it. Only then are its rows lost. A row refused for its own content (a
// value the schema refuses) is lost at once, and the others of its batch
// are written. Every lost row (refused by Record*(), dropped from a full
// queue, or not written) is counted, by table, in the side file
// `<ledger>-lost` (state/losses.h), so the count survives a restart.
// LostRow() tells a caller whether a given row was lost, and why.
//
// The file itself: before each batch the writer checks that the path still
// names the file it has open (device and inode). One deleted under it is
// made again at its path with the rows the open file still holds (a copy,
// VACUUM INTO); one replaced by another file is opened instead. Either way
// the writer logs what it found and did, and stats() says so.
//
// Privacy: the ledger, its -wal and -shm files and the side file are
// created 0600, and tightened to it when found looser.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <variant>

#include "common/status.h"
#include "state/losses.h"
#include "state/records.h"

namespace wsup {

struct LedgerOptions {
  size_t max_queue = 100'000;   // rows waiting for the writer
  int busy_timeout_ms = 5000;   // how long a write waits for another connection's lock
  int retry_ms = 10'000;        // how long a batch that failed for a passing cause is tried again
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
  // RecordFailover and SetFailoverFirstOk also give the row's sequence
  // number (seq, when not null), for LostRow().
  Result<int64_t> RecordFailover(FailoverRecord row, uint64_t* seq = nullptr);
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
  Status SetFailoverFirstOk(int64_t failover_id, int64_t first_ok_ms, uint64_t* seq = nullptr);
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
  // Why the row with sequence number seq was not written; none when it
  // was, or is still queued. (The latest 4096 lost rows are remembered.)
  std::optional<std::string> LostRow(uint64_t seq) const;
  // The longest a queued row can wait to be written or lost: an attempt,
  // the retries, and the last attempt's wait for a lock.
  int64_t MaxSettleMs() const;

  // Drains the queue, stops the writer and closes the file. Idempotent;
  // Record*() after Close() fails with kUnavailable.
  void Close();

  struct Stats {
    uint64_t queued = 0;     // accepted by Record*()
    uint64_t committed = 0;  // on disk
    uint64_t failed = 0;     // not written by the writer, after its retries (logged)
    uint64_t dropped = 0;    // refused because the queue was full
    uint64_t refused = 0;    // refused by Record*(): a value out of its set, or the ledger closed
    uint64_t retries = 0;    // batches tried again after a failure that could pass
    size_t waiting = 0;      // in the queue now
    bool retrying = false;   // the writer is retrying a failed batch now
    std::string retry_error; // what failed the batch being retried
    std::string last_error;  // the latest row the writer could not write, and why
    // Every row lost since the ledger was created, earlier runs included
    // (the side file `<ledger>-lost`).
    LedgerLosses losses;
    std::string loss_file_error;  // the side file cannot be written: the latest losses are in memory only
    uint64_t reopens = 0;         // times the file was found deleted or replaced
    std::string reopened;         // what was found and done the latest time
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
  Result<int64_t> Enqueue(Item item, int64_t* counter, uint64_t* seq = nullptr);
  Status SetFailoverTime(FailoverTime t, uint64_t* seq = nullptr);
  // A row refused before it was queued: counted as lost, and the error back.
  Error Refuse(const char* table, Error e);
  void Run();
  void WriteBatch(std::deque<std::pair<uint64_t, Item>>& batch);
  // Makes sure the connection is on the file at path_ (writer thread).
  Status EnsureFile();
  void SaveLosses();  // the writer thread, or Close() after it

  std::unique_ptr<LossFile> loss_file_;  // null when it could not be opened
  uint64_t losses_version_ = 0, losses_saved_ = 0;  // under mu_; saved when they differ
  std::map<uint64_t, std::string> lost_rows_;      // seq -> why (the latest 4096)

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
