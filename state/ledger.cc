#include "state/ledger.h"

#include <sqlite3.h>
#include <sys/stat.h>

#include <unordered_map>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "common/fs.h"
#include "state/schema.h"
#include "state/sqlite.h"

namespace wsup {
namespace {

bool OneOf(const std::string& v, std::initializer_list<const char*> allowed) {
  for (const char* a : allowed)
    if (v == a) return true;
  return false;
}

Status CheckJson(const std::string& what, const std::string& text, bool object) {
  if (!nlohmann::json::accept(text))
    return InvalidArgument(what + " is not valid JSON: " + text.substr(0, 80) + "; pass the engine's JSON unchanged");
  if (object && !nlohmann::json::parse(text).is_object())
    return InvalidArgument(what + " must be a JSON object, got: " + text.substr(0, 80));
  return Status::Ok();
}

Status Check(const FailoverRecord& r) {
  if (!OneOf(r.trigger, {"crash", "probe", "drill"}))
    return InvalidArgument("failover trigger \"" + r.trigger + "\" is not one of crash, probe, drill");
  if (r.from_slot.empty() || r.to_slot.empty())
    return InvalidArgument("failover from_slot and to_slot must name the engine slots");
  return Status::Ok();
}

Status Check(const CacheEventRecord& r) {
  if (!OneOf(r.result, {"hit", "miss"}))
    return InvalidArgument("cache event result \"" + r.result + "\" is not one of hit, miss");
  if (!OneOf(r.mode, {"daemon", "client", "off"}))
    return InvalidArgument("cache event mode \"" + r.mode + "\" is not one of daemon, client, off");
  if (r.slot.empty()) return InvalidArgument("cache event slot is empty; name the engine slot");
  if (r.result == "miss" && r.miss_reason.empty())
    return InvalidArgument("cache miss without a miss_reason; say why (e.g. \"cold\", \"fingerprint\")");
  if (!r.diff_json.empty()) WSUP_RETURN_IF_ERROR(CheckJson("cache event diff_json", r.diff_json, false));
  return Status::Ok();
}

Status Check(const RecoveryRecord& r) {
  if (!OneOf(r.cache_result, {"hit", "miss", "off"}))
    return InvalidArgument("recovery cache_result \"" + r.cache_result + "\" is not one of hit, miss, off");
  if (r.slot.empty()) return InvalidArgument("recovery slot is empty; name the engine slot");
  if (r.cause.empty()) return InvalidArgument("recovery cause is empty; say what was recovered from");
  return CheckJson("recovery phases_json", r.phases_json.empty() ? "{}" : r.phases_json, true);
}

Status Check(const HolderRestartRecord& r) {
  if (r.rank < 0) return InvalidArgument("holder restart rank " + std::to_string(r.rank) + " is negative");
  return Status::Ok();
}

Status Check(const ProbeTransitionRecord& r) {
  for (const std::string* s : {&r.from_state, &r.to_state})
    if (!OneOf(*s, {"unknown", "healthy", "unhealthy"}))
      return InvalidArgument("probe transition state \"" + *s + "\" is not one of unknown, healthy, unhealthy");
  if (r.slot.empty()) return InvalidArgument("probe transition slot is empty; name the engine slot");
  return Status::Ok();
}

Status Check(const RolloutRecord& r) {
  if (!OneOf(r.outcome, {"running", "done", "rolled_back", "refused", "failed", "interrupted"}))
    return InvalidArgument("rollout outcome \"" + r.outcome +
                           "\" is not one of running, done, rolled_back, refused, failed, interrupted");
  if (r.started_ms <= 0) return InvalidArgument("rollout started_ms is not set; pass the wall time it began");
  return Status::Ok();
}

std::optional<std::string_view> OptText(const std::string& s) {
  if (s.empty()) return std::nullopt;
  return std::string_view(s);
}

}  // namespace

// The writer thread's connection and prepared statements.
struct Ledger::Writer {
  Db db;
  Stmt failover, first_ok, gone, kv_full, cache, recovery, holder, probe, rollout;
  // Failover ids whose row could not be written, and why (bounded).
  std::unordered_map<int64_t, std::string> lost_failovers;

  Status Write(const FailoverRecord& r) {
    failover.Reset();
    failover.Bind(1, r.id).Bind(2, r.trigger).Bind(3, r.reason).Bind(4, int64_t{r.drill}).Bind(5, r.from_slot);
    failover.Bind(6, r.to_slot).Bind(7, r.fault_ms).Bind(8, r.detected_ms).Bind(9, r.swapped_ms);
    failover.Bind(10, r.first_ok_ms).Bind(11, int64_t{r.reconstructed});
    Status st = failover.Run();
    if (st.ok()) {
      lost_failovers.erase(r.id);
    } else {
      // Its first_ok_ms, queued later, will find no row: remember why, so
      // that error names the cause instead of hiding it.
      if (lost_failovers.size() >= 1024) lost_failovers.clear();
      lost_failovers[r.id] = st.error().message();
    }
    return st;
  }
  Status Write(const FailoverTime& r) {
    using F = FailoverTime::Field;
    Stmt& stmt = r.field == F::kFirstOk ? first_ok : r.field == F::kGone ? gone : kv_full;
    const char* column = r.field == F::kFirstOk ? "first_ok_ms" : r.field == F::kGone ? "gone_ms" : "kv_full_ms";
    stmt.Reset();
    stmt.Bind(1, r.id).Bind(2, r.ms);
    WSUP_RETURN_IF_ERROR(stmt.Run());
    if (sqlite3_changes(db.get()) == 1) return Status::Ok();
    if (auto lost = lost_failovers.find(r.id); lost != lost_failovers.end())
      return Unavailable(db.path() + ": " + column + " of failover " + std::to_string(r.id) +
                         " is lost with the failover's own row, which was not written: " + lost->second);
    return NotFound(db.path() + ": no failover with id " + std::to_string(r.id) + " to set " + column + " on");
  }
  Status Write(const CacheEventRecord& r) {
    cache.Reset();
    cache.Bind(1, r.id).Bind(2, r.time_ms).Bind(3, r.slot).Bind(4, r.rank).Bind(5, r.result).Bind(6, r.mode);
    if (auto v = OptText(r.miss_reason)) cache.Bind(7, *v); else cache.BindNull(7);
    if (auto v = OptText(r.diff_json)) cache.Bind(8, *v); else cache.BindNull(8);
    cache.Bind(9, r.attach_ms).Bind(10, r.load_ms);
    return cache.Run();
  }
  Status Write(const RecoveryRecord& r) {
    recovery.Reset();
    recovery.Bind(1, r.id).Bind(2, r.failover_id).Bind(3, r.slot).Bind(4, r.cause).Bind(5, r.fault_ms);
    recovery.Bind(6, r.ready_ms).Bind(7, r.cache_result);
    if (auto v = OptText(r.cache_reason)) recovery.Bind(8, *v); else recovery.BindNull(8);
    recovery.Bind(9, r.phases_json.empty() ? std::string_view("{}") : std::string_view(r.phases_json));
    return recovery.Run();
  }
  Status Write(const HolderRestartRecord& r) {
    holder.Reset();
    holder.Bind(1, r.id).Bind(2, r.time_ms).Bind(3, int64_t{r.rank}).Bind(4, r.reason).Bind(5, int64_t{r.from_fds});
    holder.Bind(6, r.restart_ms);
    return holder.Run();
  }
  Status Write(const ProbeTransitionRecord& r) {
    probe.Reset();
    probe.Bind(1, r.id).Bind(2, r.time_ms).Bind(3, r.slot).Bind(4, r.from_state).Bind(5, r.to_state).Bind(6, r.cause);
    return probe.Run();
  }
  Status Write(const RolloutRecord& r) {
    rollout.Reset();
    rollout.Bind(1, r.id).Bind(2, r.started_ms).Bind(3, r.ended_ms).Bind(4, r.outcome).Bind(5, r.reason);
    rollout.Bind(6, r.command_before).Bind(7, r.command_after);
    rollout.Bind(8, r.steps_json.empty() ? std::string_view("[]") : std::string_view(r.steps_json));
    return rollout.Run();
  }
  Status Write(const Item& item) {
    return std::visit([this](const auto& r) { return Write(r); }, item);
  }
};

std::string Ledger::PathIn(const std::string& state_dir) { return JoinPath(state_dir, "wsup.db"); }

Ledger::Ledger(std::string path, const LedgerOptions& options)
    : path_(std::move(path)), options_(options), writer_(std::make_unique<Writer>()) {}

Result<std::unique_ptr<Ledger>> Ledger::Open(const std::string& path, const LedgerOptions& options) {
  std::string dir = DirName(path);
  struct stat st {};
  if (::stat(dir.empty() ? "." : dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    return NotFound(path + ": the folder " + dir +
                    " does not exist (or is not a folder); create it or fix node.state_dir in the config");
  std::unique_ptr<Ledger> ledger(new Ledger(path, options));
  Writer& w = *ledger->writer_;
  WSUP_ASSIGN_OR_RETURN(w.db, Db::Open(path, /*create=*/true));
  WSUP_RETURN_IF_ERROR(ConfigureConnection(w.db, options.busy_timeout_ms));
  WSUP_RETURN_IF_ERROR(Migrate(w.db));

  struct Counter {
    const char* table;
    int64_t* next;
  };
  for (Counter c : {Counter{"failovers", &ledger->next_failover_}, Counter{"cache_events", &ledger->next_cache_},
                    Counter{"recoveries", &ledger->next_recovery_}, Counter{"holder_restarts", &ledger->next_holder_},
                    Counter{"probe_transitions", &ledger->next_probe_}, Counter{"rollouts", &ledger->next_rollout_}}) {
    WSUP_ASSIGN_OR_RETURN(int64_t max_id, w.db.QueryInt(std::string("SELECT COALESCE(MAX(id), 0) FROM ") + c.table));
    *c.next = max_id + 1;
  }
  WSUP_ASSIGN_OR_RETURN(w.failover, w.db.Prepare(
      "INSERT INTO failovers (id, trigger, reason, drill, from_slot, to_slot, fault_ms, detected_ms, swapped_ms, "
      "first_ok_ms, reconstructed) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)"));
  WSUP_ASSIGN_OR_RETURN(w.first_ok, w.db.Prepare("UPDATE failovers SET first_ok_ms = ?2 WHERE id = ?1"));
  WSUP_ASSIGN_OR_RETURN(w.gone, w.db.Prepare("UPDATE failovers SET gone_ms = ?2 WHERE id = ?1"));
  WSUP_ASSIGN_OR_RETURN(w.kv_full, w.db.Prepare("UPDATE failovers SET kv_full_ms = ?2 WHERE id = ?1"));
  WSUP_ASSIGN_OR_RETURN(w.cache, w.db.Prepare(
      "INSERT INTO cache_events (id, time_ms, slot, rank, result, mode, miss_reason, diff_json, attach_ms, load_ms) "
      "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)"));
  WSUP_ASSIGN_OR_RETURN(w.recovery, w.db.Prepare(
      "INSERT INTO recoveries (id, failover_id, slot, cause, fault_ms, ready_ms, cache_result, cache_reason, "
      "phases_json) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)"));
  WSUP_ASSIGN_OR_RETURN(w.holder, w.db.Prepare(
      "INSERT INTO holder_restarts (id, time_ms, rank, reason, from_fds, restart_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6)"));
  WSUP_ASSIGN_OR_RETURN(w.probe, w.db.Prepare(
      "INSERT INTO probe_transitions (id, time_ms, slot, from_state, to_state, cause) VALUES (?1, ?2, ?3, ?4, ?5, ?6)"));

  WSUP_ASSIGN_OR_RETURN(w.rollout, w.db.Prepare(
      "INSERT OR REPLACE INTO rollouts (id, started_ms, ended_ms, outcome, reason, command_before, command_after, "
      "steps_json) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)"));

  ledger->thread_ = std::thread([l = ledger.get()] { l->Run(); });
  return ledger;
}

Ledger::~Ledger() { Close(); }

uint64_t Ledger::QueuedSeq() const {
  std::lock_guard<std::mutex> lk(mu_);
  return next_seq_ - 1;
}

uint64_t Ledger::HandledSeq() const {
  std::lock_guard<std::mutex> lk(mu_);
  return done_seq_;
}

Result<int64_t> Ledger::Enqueue(Item item, int64_t* counter) {
  std::lock_guard<std::mutex> lk(mu_);
  if (stopping_ || closed_)
    return Unavailable(path_ + ": the ledger is closed; rows can no longer be recorded (a bug in the caller)");
  if (queue_.size() >= options_.max_queue) {
    ++stats_.dropped;
    if (stats_.dropped == 1 || stats_.dropped % 1000 == 0)
      spdlog::error("{}: ledger queue full ({} rows waiting); {} row(s) dropped so far: the disk under the "
                    "state_dir is not keeping up, check it", path_, queue_.size(), stats_.dropped);
    return Unavailable(path_ + ": ledger queue full (" + std::to_string(queue_.size()) +
                       " rows waiting); row dropped: the disk under node.state_dir is not keeping up");
  }
  int64_t id = 0;
  if (counter) {
    id = (*counter)++;
    std::visit([id](auto& r) {
      if constexpr (!std::is_same_v<std::decay_t<decltype(r)>, FailoverTime>) r.id = id;
    }, item);
  }
  queue_.emplace_back(next_seq_++, std::move(item));
  ++stats_.queued;
  work_cv_.notify_one();
  return id;
}

Result<int64_t> Ledger::RecordFailover(FailoverRecord row) {
  WSUP_RETURN_IF_ERROR(Check(row));
  return Enqueue(std::move(row), &next_failover_);
}

Result<int64_t> Ledger::RecordCacheEvent(CacheEventRecord row) {
  WSUP_RETURN_IF_ERROR(Check(row));
  return Enqueue(std::move(row), &next_cache_);
}

Result<int64_t> Ledger::RecordRecovery(RecoveryRecord row) {
  WSUP_RETURN_IF_ERROR(Check(row));
  return Enqueue(std::move(row), &next_recovery_);
}

Result<int64_t> Ledger::RecordHolderRestart(HolderRestartRecord row) {
  WSUP_RETURN_IF_ERROR(Check(row));
  return Enqueue(std::move(row), &next_holder_);
}

Result<int64_t> Ledger::RecordProbeTransition(ProbeTransitionRecord row) {
  WSUP_RETURN_IF_ERROR(Check(row));
  return Enqueue(std::move(row), &next_probe_);
}

Result<int64_t> Ledger::RecordRollout(RolloutRecord row) {
  WSUP_RETURN_IF_ERROR(Check(row));
  return Enqueue(std::move(row), &next_rollout_);
}

Status Ledger::UpdateRollout(RolloutRecord row) {
  WSUP_RETURN_IF_ERROR(Check(row));
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (row.id < 1 || row.id >= next_rollout_)
      return InvalidArgument("no rollout with id " + std::to_string(row.id) + " was recorded; pass the id RecordRollout returned");
  }
  return Enqueue(std::move(row), nullptr).status();
}

Status Ledger::SetFailoverFirstOk(int64_t failover_id, int64_t first_ok_ms) {
  return SetFailoverTime(FailoverTime{failover_id, FailoverTime::Field::kFirstOk, first_ok_ms});
}

Status Ledger::SetFailoverGone(int64_t failover_id, int64_t gone_ms) {
  return SetFailoverTime(FailoverTime{failover_id, FailoverTime::Field::kGone, gone_ms});
}

Status Ledger::SetFailoverKvFull(int64_t failover_id, int64_t kv_full_ms) {
  return SetFailoverTime(FailoverTime{failover_id, FailoverTime::Field::kKvFull, kv_full_ms});
}

Status Ledger::SetFailoverTime(FailoverTime t) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (t.id < 1 || t.id >= next_failover_)
      return InvalidArgument("no failover with id " + std::to_string(t.id) +
                             " was recorded; pass the id RecordFailover returned");
  }
  return Enqueue(t, nullptr).status();
}

void Ledger::Run() {
  for (;;) {
    std::deque<std::pair<uint64_t, Item>> batch;
    {
      std::unique_lock<std::mutex> lk(mu_);
      work_cv_.wait(lk, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) break;  // stopping, and drained
      batch.swap(queue_);
    }
    uint64_t committed = 0, failed = 0;
    Status first;
    Status st = writer_->db.Exec("BEGIN IMMEDIATE");
    if (st.ok()) {
      for (const auto& [seq, item] : batch) {
        st = writer_->Write(item);
        if (!st.ok()) break;
      }
    }
    if (st.ok()) st = writer_->db.Exec("COMMIT");
    if (st.ok()) {
      committed = batch.size();
    } else {
      // One bad row must not take the batch with it: retry each on its own.
      if (!sqlite3_get_autocommit(writer_->db.get())) (void)writer_->db.Exec("ROLLBACK");
      for (const auto& [seq, item] : batch) {
        Status one = writer_->Write(item);
        if (one.ok()) {
          ++committed;
        } else {
          ++failed;
          spdlog::error("ledger: row not written: {}", one.error().message());
          if (first.ok()) first = one;
        }
      }
    }
    std::lock_guard<std::mutex> lk(mu_);
    stats_.committed += committed;
    stats_.failed += failed;
    if (!first.ok() && first_error_.ok()) first_error_ = first;
    if (!first.ok()) stats_.last_error = first.error().message();
    done_seq_ = batch.back().first;
    done_cv_.notify_all();
  }
}

Status Ledger::Flush() {
  std::unique_lock<std::mutex> lk(mu_);
  if (closed_) return first_error_.ok() ? Status::Ok() : std::exchange(first_error_, Status::Ok());
  uint64_t target = next_seq_ - 1;
  done_cv_.wait(lk, [&] { return done_seq_ >= target; });
  Status result = std::exchange(first_error_, Status::Ok());
  return result;
}

void Ledger::Close() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (closed_) return;
    stopping_ = true;
    work_cv_.notify_one();
  }
  if (thread_.joinable()) thread_.join();
  writer_.reset();  // statements, then the connection
  std::lock_guard<std::mutex> lk(mu_);
  closed_ = true;
  if (!first_error_.ok()) spdlog::error("ledger {}: closed after a failed write: {}", path_, first_error_.error().message());
}

Ledger::Stats Ledger::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  Stats s = stats_;
  s.waiting = queue_.size();
  return s;
}

}  // namespace wsup
