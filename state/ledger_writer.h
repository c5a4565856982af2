// Ledger::Writer: the writer thread's SQLite connection and its prepared
// statements, one per table. Internal to the ledger: ledger.cc owns the queue,
// the retries and the loss count, and drives this from its thread; this file
// holds only the SQL, so that a new table touches one place.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <deque>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/status.h"
#include "state/ledger.h"
#include "state/sqlite.h"

namespace wsup {

struct Ledger::Writer {
  std::string path;
  int busy_timeout_ms = 5000;
  Db db;
  Stmt failover, first_ok, gone, kv_full, cache, recovery, holder, probe, rollout, fence;
  bool connected = false;
  Status connect_error;  // why it is not connected
  std::string logged_error;  // the latest connect_error logged
  std::string fate;          // what became of the file, until it is open again
  // The files the connection has open, as the path named them at the
  // latest check.
  dev_t dev = 0;
  ino_t ino = 0, wal_ino = 0;
  // Failover ids whose row could not be written, and why (bounded).
  std::unordered_map<int64_t, std::string> lost_failovers;

  Status Connect();
  // Closes the connection. keep_wal: the -wal file at the path is not this
  // connection's, so SQLite must not delete it by name.
  void Disconnect(bool keep_wal);
  // MAX(id) + 1 of each table, in the order of Ledger's counters.
  Result<std::vector<int64_t>> NextIds();
  void RollbackIfOpen();
  // The whole batch in one transaction, or nothing of it.
  Status Commit(const std::deque<std::pair<uint64_t, Item>>& batch);
  Status Write(const FailoverRecord& r);
  // Its first_ok_ms, queued later, will find no row: remember why, so
  // that error names the cause instead of hiding it.
  void LostFailover(int64_t id, const std::string& why);
  Status Write(const FailoverTime& r);
  Status Write(const CacheEventRecord& r);
  Status Write(const RecoveryRecord& r);
  Status Write(const HolderRestartRecord& r);
  Status Write(const ProbeTransitionRecord& r);
  Status Write(const RolloutRecord& r);
  Status Write(const FenceRecord& r);
  Status Write(const Item& item);
};

}  // namespace wsup
