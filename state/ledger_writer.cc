#include "state/ledger_writer.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <string_view>
#include <variant>

#include "common/unique_fd.h"
#include "state/schema.h"

namespace wsup {
namespace {

std::optional<std::string_view> OptText(const std::string& s) {
  if (s.empty()) return std::nullopt;
  return std::string_view(s);
}

// Makes path private (0600): created so when absent (create), tightened
// when looser. SQLite gives the -wal and -shm files the database's mode, so
// a private database keeps them private too. A path that cannot be opened
// is left for SQLite to report (it names the cause and the fix).
Status MakePrivateFile(const std::string& path, bool create) {
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW | (create ? O_CREAT : 0), 0600));
  if (!fd.valid()) return Status::Ok();
  struct stat st{};
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) || (st.st_mode & 077) == 0) return Status::Ok();
  if (::fchmod(fd.get(), st.st_mode & 0700) != 0) {
    return IoError(path + ": other users may read it (mode " + std::to_string(st.st_mode & 0777) +
                   " in decimal) and it cannot be made private: " + std::strerror(errno) +
                   "; run chmod 0600 on it as its owner");
  }
  return Status::Ok();
}

}  // namespace

Status Ledger::Writer::Connect() {
  WSUP_RETURN_IF_ERROR(MakePrivateFile(path, /*create=*/true));
  for (const char* suffix : {"-wal", "-shm"}) WSUP_RETURN_IF_ERROR(MakePrivateFile(path + suffix, false));
  WSUP_ASSIGN_OR_RETURN(db, Db::Open(path, /*create=*/true));
  WSUP_RETURN_IF_ERROR(ConfigureConnection(db, busy_timeout_ms));
  WSUP_RETURN_IF_ERROR(Migrate(db));
  WSUP_ASSIGN_OR_RETURN(failover, db.Prepare(
      "INSERT INTO failovers (id, trigger, reason, drill, from_slot, to_slot, fault_ms, detected_ms, swapped_ms, "
      "first_ok_ms, reconstructed) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)"));
  WSUP_ASSIGN_OR_RETURN(first_ok, db.Prepare("UPDATE failovers SET first_ok_ms = ?2 WHERE id = ?1"));
  WSUP_ASSIGN_OR_RETURN(gone, db.Prepare("UPDATE failovers SET gone_ms = ?2 WHERE id = ?1"));
  WSUP_ASSIGN_OR_RETURN(kv_full, db.Prepare("UPDATE failovers SET kv_full_ms = ?2 WHERE id = ?1"));
  WSUP_ASSIGN_OR_RETURN(cache, db.Prepare(
      "INSERT INTO cache_events (id, time_ms, slot, rank, result, mode, miss_reason, diff_json, attach_ms, load_ms) "
      "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)"));
  WSUP_ASSIGN_OR_RETURN(recovery, db.Prepare(
      "INSERT INTO recoveries (id, failover_id, slot, cause, fault_ms, ready_ms, cache_result, cache_reason, "
      "phases_json) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)"));
  WSUP_ASSIGN_OR_RETURN(holder, db.Prepare(
      "INSERT INTO holder_restarts (id, time_ms, rank, reason, from_fds, restart_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6)"));
  WSUP_ASSIGN_OR_RETURN(probe, db.Prepare(
      "INSERT INTO probe_transitions (id, time_ms, slot, from_state, to_state, cause) VALUES (?1, ?2, ?3, ?4, ?5, ?6)"));
  WSUP_ASSIGN_OR_RETURN(rollout, db.Prepare(
      "INSERT OR REPLACE INTO rollouts (id, started_ms, ended_ms, outcome, reason, command_before, command_after, "
      "steps_json) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)"));
  WSUP_ASSIGN_OR_RETURN(fence, db.Prepare(
      "INSERT INTO fences (id, time_ms, slot, pid, slot_state, kind, pool_owner, reason) "
      "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)"));
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0) return ErrnoError(path + ": cannot stat the ledger just opened", errno);
  dev = st.st_dev;
  ino = st.st_ino;
  wal_ino = ::stat((path + "-wal").c_str(), &st) == 0 ? st.st_ino : 0;
  connected = true;
  connect_error = Status::Ok();
  return Status::Ok();
}

void Ledger::Writer::Disconnect(bool keep_wal) {
  if (keep_wal && db.get()) {
    int on = 1;
    sqlite3_file_control(db.get(), "main", SQLITE_FCNTL_PERSIST_WAL, &on);
  }
  for (Stmt* s : {&failover, &first_ok, &gone, &kv_full, &cache, &recovery, &holder, &probe, &rollout, &fence}) {
    *s = Stmt();
  }
  db = Db();
  connected = false;
}

Result<std::vector<int64_t>> Ledger::Writer::NextIds() {
  std::vector<int64_t> next;
  for (const char* table :
       {"failovers", "cache_events", "recoveries", "holder_restarts", "probe_transitions", "rollouts", "fences"}) {
    WSUP_ASSIGN_OR_RETURN(int64_t max_id, db.QueryInt(std::string("SELECT COALESCE(MAX(id), 0) FROM ") + table));
    next.push_back(max_id + 1);
  }
  return next;
}

void Ledger::Writer::RollbackIfOpen() {
  if (connected && !sqlite3_get_autocommit(db.get())) (void)db.Exec("ROLLBACK");
}

Status Ledger::Writer::Commit(const std::deque<std::pair<uint64_t, Ledger::Item>>& batch) {
  if (!connected) return connect_error;
  Status st = db.Exec("BEGIN IMMEDIATE");
  for (auto it = batch.begin(); st.ok() && it != batch.end(); ++it) st = Write(it->second);
  if (st.ok()) st = db.Exec("COMMIT");
  if (!st.ok()) RollbackIfOpen();
  return st;
}

Status Ledger::Writer::Write(const FailoverRecord& r) {
  failover.Reset();
  failover.Bind(1, r.id).Bind(2, r.trigger).Bind(3, r.reason).Bind(4, int64_t{r.drill}).Bind(5, r.from_slot);
  failover.Bind(6, r.to_slot).Bind(7, r.fault_ms).Bind(8, r.detected_ms).Bind(9, r.swapped_ms);
  failover.Bind(10, r.first_ok_ms).Bind(11, int64_t{r.reconstructed});
  Status st = failover.Run();
  if (st.ok()) {
    lost_failovers.erase(r.id);
  } else {
    LostFailover(r.id, st.error().message());
  }
  return st;
}

void Ledger::Writer::LostFailover(int64_t id, const std::string& why) {
  if (lost_failovers.size() >= 1024) lost_failovers.clear();
  lost_failovers[id] = why;
}

Status Ledger::Writer::Write(const Ledger::FailoverTime& r) {
  using F = FailoverTime::Field;
  Stmt& stmt = r.field == F::kFirstOk ? first_ok : r.field == F::kGone ? gone : kv_full;
  const char* column = r.field == F::kFirstOk ? "first_ok_ms" : r.field == F::kGone ? "gone_ms" : "kv_full_ms";
  stmt.Reset();
  stmt.Bind(1, r.id).Bind(2, r.ms);
  WSUP_RETURN_IF_ERROR(stmt.Run());
  if (sqlite3_changes(db.get()) == 1) return Status::Ok();
  // Not there, and never will be: no use trying again.
  if (auto lost = lost_failovers.find(r.id); lost != lost_failovers.end())
    return NotFound(db.path() + ": " + column + " of failover " + std::to_string(r.id) +
                    " is lost with the failover's own row, which was not written: " + lost->second);
  return NotFound(db.path() + ": no failover with id " + std::to_string(r.id) + " to set " + column + " on");
}

Status Ledger::Writer::Write(const CacheEventRecord& r) {
  cache.Reset();
  cache.Bind(1, r.id).Bind(2, r.time_ms).Bind(3, r.slot).Bind(4, r.rank).Bind(5, r.result).Bind(6, r.mode);
  if (auto v = OptText(r.miss_reason)) cache.Bind(7, *v); else cache.BindNull(7);
  if (auto v = OptText(r.diff_json)) cache.Bind(8, *v); else cache.BindNull(8);
  cache.Bind(9, r.attach_ms).Bind(10, r.load_ms);
  return cache.Run();
}

Status Ledger::Writer::Write(const RecoveryRecord& r) {
  recovery.Reset();
  recovery.Bind(1, r.id).Bind(2, r.failover_id).Bind(3, r.slot).Bind(4, r.cause).Bind(5, r.fault_ms);
  recovery.Bind(6, r.ready_ms).Bind(7, r.cache_result);
  if (auto v = OptText(r.cache_reason)) recovery.Bind(8, *v); else recovery.BindNull(8);
  recovery.Bind(9, r.phases_json.empty() ? std::string_view("{}") : std::string_view(r.phases_json));
  return recovery.Run();
}

Status Ledger::Writer::Write(const HolderRestartRecord& r) {
  holder.Reset();
  holder.Bind(1, r.id).Bind(2, r.time_ms).Bind(3, int64_t{r.rank}).Bind(4, r.reason).Bind(5, int64_t{r.from_fds});
  holder.Bind(6, r.restart_ms);
  return holder.Run();
}

Status Ledger::Writer::Write(const ProbeTransitionRecord& r) {
  probe.Reset();
  probe.Bind(1, r.id).Bind(2, r.time_ms).Bind(3, r.slot).Bind(4, r.from_state).Bind(5, r.to_state).Bind(6, r.cause);
  return probe.Run();
}

Status Ledger::Writer::Write(const RolloutRecord& r) {
  rollout.Reset();
  rollout.Bind(1, r.id).Bind(2, r.started_ms).Bind(3, r.ended_ms).Bind(4, r.outcome).Bind(5, r.reason);
  rollout.Bind(6, r.command_before).Bind(7, r.command_after);
  rollout.Bind(8, r.steps_json.empty() ? std::string_view("[]") : std::string_view(r.steps_json));
  return rollout.Run();
}

Status Ledger::Writer::Write(const FenceRecord& r) {
  fence.Reset();
  fence.Bind(1, r.id).Bind(2, r.time_ms).Bind(3, r.slot).Bind(4, r.pid).Bind(5, r.slot_state).Bind(6, r.kind);
  if (auto v = OptText(r.pool_owner)) fence.Bind(7, *v); else fence.BindNull(7);
  fence.Bind(8, r.reason);
  return fence.Run();
}

Status Ledger::Writer::Write(const Ledger::Item& item) {
  if (!connected) return connect_error;
  return std::visit([this](const auto& r) { return Write(r); }, item);
}

}  // namespace wsup
