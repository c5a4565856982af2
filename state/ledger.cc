#include "state/ledger.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <unordered_map>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "common/fs.h"
#include "common/unique_fd.h"
#include "state/ledger_writer.h"
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
  if (!OneOf(r.trigger, {"crash", "probe", "drill", "hang", "rollout"}))
    return InvalidArgument("failover trigger \"" + r.trigger + "\" is not one of crash, probe, drill, hang, rollout");
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

Status Check(const FenceRecord& r) {
  if (!OneOf(r.kind, {"kv_pool"})) return InvalidArgument("fence kind \"" + r.kind + "\" is not one of kv_pool");
  if (r.slot.empty()) return InvalidArgument("fence slot is empty; name the engine slot");
  if (r.reason.empty()) return InvalidArgument("fence reason is empty; say what the engine did");
  return Status::Ok();
}

Status Check(const RolloutRecord& r) {
  if (!OneOf(r.outcome, {"running", "done", "rolled_back", "refused", "failed", "interrupted"}))
    return InvalidArgument("rollout outcome \"" + r.outcome +
                           "\" is not one of running, done, rolled_back, refused, failed, interrupted");
  if (r.started_ms <= 0) return InvalidArgument("rollout started_ms is not set; pass the wall time it began");
  return Status::Ok();
}

// The table a row goes to, as the loss count names it.
const char* TableOf(const Ledger::Item& item) {
  struct Name {
    const char* operator()(const FailoverRecord&) const { return "failovers"; }
    const char* operator()(const Ledger::FailoverTime&) const { return "failover_times"; }
    const char* operator()(const CacheEventRecord&) const { return "cache_events"; }
    const char* operator()(const RecoveryRecord&) const { return "recoveries"; }
    const char* operator()(const HolderRestartRecord&) const { return "holder_restarts"; }
    const char* operator()(const ProbeTransitionRecord&) const { return "probe_transitions"; }
    const char* operator()(const RolloutRecord&) const { return "rollouts"; }
    const char* operator()(const FenceRecord&) const { return "fences"; }
  };
  return std::visit(Name{}, item);
}

// A failure that can pass by itself: a lock another connection holds, a
// full disk, an I/O error (SqliteError's kUnavailable and kIo). A row
// the schema refuses, or an update of a row that is not there, fails again.
bool Passing(const Status& st) {
  return !st.ok() && (st.error().code() == Code::kUnavailable || st.error().code() == Code::kIo);
}

int64_t WallNowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

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
  w.path = path;
  w.busy_timeout_ms = options.busy_timeout_ms;
  WSUP_RETURN_IF_ERROR(w.Connect());
  WSUP_ASSIGN_OR_RETURN(std::vector<int64_t> next, w.NextIds());
  int64_t* counters[] = {&ledger->next_failover_, &ledger->next_cache_, &ledger->next_recovery_,
                         &ledger->next_holder_, &ledger->next_probe_, &ledger->next_rollout_,
                         &ledger->next_fence_};
  for (size_t i = 0; i < next.size(); ++i) *counters[i] = next[i];

  // The rows earlier runs lost. The ledger works without its side file
  // (the node must not stop for it), but says so.
  auto prior = ReadLosses(path);
  if (prior.ok()) {
    ledger->stats_.losses = std::move(*prior);
  } else {
    ledger->stats_.loss_file_error = prior.error().message();
    ledger->losses_version_ = 1;  // written again at once, from 0
    spdlog::error("ledger: {}", prior.error().message());
  }
  auto file = LossFile::Open(path, ledger->stats_.losses);
  if (file.ok()) {
    ledger->loss_file_ = std::make_unique<LossFile>(std::move(*file));
  } else {
    ledger->stats_.loss_file_error = file.error().message();
    spdlog::error("ledger: {}; rows the ledger loses are counted in memory only", file.error().message());
  }

  WSUP_ASSIGN_OR_RETURN(w.fence, w.db.Prepare(
      "INSERT INTO fences (id, time_ms, slot, pid, slot_state, kind, pool_owner, reason) "
      "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)"));

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

std::optional<std::string> Ledger::LostRow(uint64_t seq) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = lost_rows_.find(seq);
  if (it == lost_rows_.end()) return std::nullopt;
  return it->second;
}

int64_t Ledger::MaxSettleMs() const {
  return int64_t{options_.retry_ms} + 2 * int64_t{options_.busy_timeout_ms} + 1000;
}

Error Ledger::Refuse(const char* table, Error e) {
  std::lock_guard<std::mutex> lk(mu_);
  ++stats_.refused;
  stats_.losses.Add(table, WallNowMs(), e.message());
  ++losses_version_;
  work_cv_.notify_one();
  return e;
}

Result<int64_t> Ledger::Enqueue(Item item, int64_t* counter, uint64_t* seq) {
  std::lock_guard<std::mutex> lk(mu_);
  auto lose = [&](Error e) -> Error {
    stats_.losses.Add(TableOf(item), WallNowMs(), e.message());
    ++losses_version_;
    work_cv_.notify_one();
    return e;
  };
  if (stopping_ || closed_) {
    ++stats_.refused;
    return lose(Unavailable(path_ + ": the ledger is closed; rows can no longer be recorded (a bug in the caller)"));
  }
  if (queue_.size() >= options_.max_queue) {
    ++stats_.dropped;
    if (stats_.dropped == 1 || stats_.dropped % 1000 == 0)
      spdlog::error("{}: ledger queue full ({} rows waiting); {} row(s) dropped so far: the disk under the "
                    "state_dir is not keeping up, check it", path_, queue_.size(), stats_.dropped);
    return lose(Unavailable(path_ + ": ledger queue full (" + std::to_string(queue_.size()) +
                            " rows waiting); row dropped: the disk under node.state_dir is not keeping up"));
  }
  int64_t id = 0;
  if (counter) {
    id = (*counter)++;
    std::visit([id](auto& r) {
      if constexpr (!std::is_same_v<std::decay_t<decltype(r)>, FailoverTime>) r.id = id;
    }, item);
  }
  if (seq) *seq = next_seq_;
  queue_.emplace_back(next_seq_++, std::move(item));
  ++stats_.queued;
  work_cv_.notify_one();
  return id;
}

Result<int64_t> Ledger::RecordFailover(FailoverRecord row, uint64_t* seq) {
  if (Status st = Check(row); !st.ok()) return Refuse("failovers", st.error());
  return Enqueue(std::move(row), &next_failover_, seq);
}

Result<int64_t> Ledger::RecordCacheEvent(CacheEventRecord row) {
  if (Status st = Check(row); !st.ok()) return Refuse("cache_events", st.error());
  return Enqueue(std::move(row), &next_cache_);
}

Result<int64_t> Ledger::RecordRecovery(RecoveryRecord row) {
  if (Status st = Check(row); !st.ok()) return Refuse("recoveries", st.error());
  return Enqueue(std::move(row), &next_recovery_);
}

Result<int64_t> Ledger::RecordHolderRestart(HolderRestartRecord row) {
  if (Status st = Check(row); !st.ok()) return Refuse("holder_restarts", st.error());
  return Enqueue(std::move(row), &next_holder_);
}

Result<int64_t> Ledger::RecordProbeTransition(ProbeTransitionRecord row) {
  if (Status st = Check(row); !st.ok()) return Refuse("probe_transitions", st.error());
  return Enqueue(std::move(row), &next_probe_);
}

Result<int64_t> Ledger::RecordFence(FenceRecord row) {
  if (Status st = Check(row); !st.ok()) return Refuse("fences", st.error());
  return Enqueue(std::move(row), &next_fence_);
}

Result<int64_t> Ledger::RecordRollout(RolloutRecord row) {
  if (Status st = Check(row); !st.ok()) return Refuse("rollouts", st.error());
  return Enqueue(std::move(row), &next_rollout_);
}

Status Ledger::UpdateRollout(RolloutRecord row) {
  if (Status st = Check(row); !st.ok()) return Refuse("rollouts", st.error());
  bool known = false;
  {
    std::lock_guard<std::mutex> lk(mu_);
    known = row.id >= 1 && row.id < next_rollout_;
  }
  if (!known) {
    return Refuse("rollouts", InvalidArgument("no rollout with id " + std::to_string(row.id) +
                                              " was recorded; pass the id RecordRollout returned"));
  }
  return Enqueue(std::move(row), nullptr).status();
}

Status Ledger::SetFailoverFirstOk(int64_t failover_id, int64_t first_ok_ms, uint64_t* seq) {
  return SetFailoverTime(FailoverTime{failover_id, FailoverTime::Field::kFirstOk, first_ok_ms}, seq);
}

Status Ledger::SetFailoverGone(int64_t failover_id, int64_t gone_ms) {
  return SetFailoverTime(FailoverTime{failover_id, FailoverTime::Field::kGone, gone_ms});
}

Status Ledger::SetFailoverKvFull(int64_t failover_id, int64_t kv_full_ms) {
  return SetFailoverTime(FailoverTime{failover_id, FailoverTime::Field::kKvFull, kv_full_ms});
}

Status Ledger::SetFailoverTime(FailoverTime t, uint64_t* seq) {
  bool known = false;
  {
    std::lock_guard<std::mutex> lk(mu_);
    known = t.id >= 1 && t.id < next_failover_;
  }
  if (!known) {
    return Refuse("failover_times", InvalidArgument("no failover with id " + std::to_string(t.id) +
                                                    " was recorded; pass the id RecordFailover returned"));
  }
  return Enqueue(t, nullptr, seq).status();
}

Status Ledger::EnsureFile() {
  Writer& w = *writer_;
  struct stat st{};
  const bool present = ::stat(path_.c_str(), &st) == 0;
  if (!present && errno != ENOENT) {
    // Cannot tell (a permission changed): go on with what is open.
    return w.connected ? Status::Ok() : w.connect_error;
  }
  if (w.connected && present && st.st_dev == w.dev && st.st_ino == w.ino) {
    struct stat ws{};
    if (::stat((path_ + "-wal").c_str(), &ws) == 0) w.wal_ino = ws.st_ino;
    return Status::Ok();
  }
  std::string done;
  if (w.connected) {
    w.fate = present ? "was replaced by another file" : "was deleted";
    struct stat ws{};
    const std::string wal = path_ + "-wal", shm = path_ + "-shm", copy = path_ + ".restore";
    const bool wal_ours = ::stat(wal.c_str(), &ws) == 0 && ws.st_dev == w.dev && ws.st_ino == w.wal_ino;
    Status restored = Status::Ok();
    if (!present) {
      // The open connection still reads the deleted file (and its -wal):
      // copy what it holds, so that a restart does not lose it.
      ::unlink(copy.c_str());
      UniqueFd fd(::open(copy.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
      if (!fd.valid()) {
        restored = ErrnoError(copy + ": cannot create", errno);
      } else {
        auto vacuum = w.db.Prepare("VACUUM INTO ?1");
        restored = vacuum.ok() ? vacuum->Bind(1, copy).Run() : Status(vacuum.error());
      }
    }
    // A -wal at the path that is not this connection's (it came with a
    // replacement) must survive the close.
    w.Disconnect(/*keep_wal=*/!wal_ours);
    if (wal_ours) {
      // SQLite does not checkpoint a moved file at close, so this
      // connection's -wal is still there, and would be replayed into the
      // file that now has the path: it goes (the old file goes with it).
      ::unlink(wal.c_str());
      ::unlink(shm.c_str());
    }
    if (!present) {
      if (restored.ok() && ::rename(copy.c_str(), path_.c_str()) != 0)
        restored = ErrnoError("rename " + copy + " -> " + path_, errno);
      if (restored.ok()) {
        done = "made it again at its path with the rows the deleted file held";
      } else {
        ::unlink(copy.c_str());
        done = "could not copy the rows the deleted file held (" + restored.error().message() +
               "), so a new, empty ledger starts there";
      }
    } else {
      done = "the new file is used from now on";
    }
  } else {
    done = "opened it again";
  }
  const std::string found = w.fate.empty() ? "could not be opened" : w.fate;
  // The whole state_dir removed: the ledger's folder comes back (private).
  const std::string dir = DirName(path_);
  struct stat ds{};
  if (::stat(dir.c_str(), &ds) != 0 && errno == ENOENT) (void)MakeDirs(dir, 0700);
  Status st2 = w.Connect();
  if (st2.ok()) {
    auto next = w.NextIds();
    if (!next.ok()) {
      st2 = next.error();
    } else {
      // Ids already handed out stay; none the file already has is used again.
      std::lock_guard<std::mutex> lk(mu_);
      int64_t* counters[] = {&next_failover_, &next_cache_, &next_recovery_, &next_holder_, &next_probe_,
                             &next_rollout_, &next_fence_};
      for (size_t i = 0; i < next->size(); ++i) *counters[i] = std::max(*counters[i], (*next)[i]);
    }
  }
  std::string what = "the ledger " + path_ + " " + found + " while the supervisor ran; ";
  if (!st2.ok()) {
    w.Disconnect(false);
    w.connect_error = Error(st2.error().code(), what + "it cannot be opened again: " + st2.error().message());
    // Tried again at each batch and idle check: said once per cause.
    if (w.connect_error.error().message() != w.logged_error) spdlog::error("{}", w.connect_error.error().message());
    w.logged_error = w.connect_error.error().message();
    return w.connect_error;
  }
  w.logged_error.clear();
  w.fate.clear();
  what += done + "; to start a new ledger, stop the node and move " + path_ + "* aside";
  spdlog::error("{}", what);
  std::lock_guard<std::mutex> lk(mu_);
  ++stats_.reopens;
  stats_.reopened = what;
  return Status::Ok();
}

void Ledger::WriteBatch(std::deque<std::pair<uint64_t, Item>>& batch) {
  using Clock = std::chrono::steady_clock;
  struct Lost {
    uint64_t seq;
    const char* table;
    std::string why;
  };
  std::optional<Clock::time_point> give_up;
  int64_t pause_ms = 50;
  uint64_t committed = 0;
  uint64_t last_seq = batch.back().first;
  std::vector<Lost> lost;
  Status first_lost;
  for (;;) {
    Status st = EnsureFile();
    if (st.ok()) st = writer_->Commit(batch);
    if (st.ok()) {
      committed += batch.size();
      break;
    }
    if (!Passing(st)) {
      // One bad row must not take the batch with it: each on its own. A
      // row that fails for a passing cause goes on to the retries.
      std::deque<std::pair<uint64_t, Item>> again;
      for (auto& [seq, item] : batch) {
        Status one = writer_->Write(item);
        if (one.ok()) {
          ++committed;
        } else if (Passing(one)) {
          st = one;
          again.emplace_back(seq, std::move(item));
        } else {
          spdlog::error("ledger: row not written: {}", one.error().message());
          lost.push_back({seq, TableOf(item), one.error().message()});
          if (first_lost.ok()) first_lost = one;
        }
      }
      batch.swap(again);
      if (batch.empty()) break;
    }
    const auto now = Clock::now();
    if (!give_up) {
      give_up = now + std::chrono::milliseconds(options_.retry_ms);
      spdlog::warn("ledger: {} row(s) not written yet: {}; trying again for up to {} ms", batch.size(),
                   st.error().message(), options_.retry_ms);
    }
    if (now >= *give_up) {
      spdlog::error("ledger: row not written: {} row(s) lost after {} ms of retries: {}", batch.size(),
                    options_.retry_ms, st.error().message());
      const std::string why = st.error().message() + " (after " + std::to_string(options_.retry_ms) +
                              " ms of retries)";
      if (first_lost.ok()) first_lost = st;
      for (const auto& [seq, item] : batch) {
        lost.push_back({seq, TableOf(item), why});
        if (const auto* f = std::get_if<FailoverRecord>(&item)) writer_->LostFailover(f->id, why);
      }
      break;
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      stats_.retrying = true;
      stats_.retry_error = st.error().message();
      ++stats_.retries;
    }
    // A pause on the writer's own thread: the callers never wait for it.
    std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
    pause_ms = std::min<int64_t>(pause_ms * 2, 1000);
    // Rows queued meanwhile go with it: none waits behind more than one
    // retry window.
    std::lock_guard<std::mutex> lk(mu_);
    for (auto& q : queue_) batch.push_back(std::move(q));
    queue_.clear();
    if (!batch.empty()) last_seq = std::max(last_seq, batch.back().first);
  }
  std::lock_guard<std::mutex> lk(mu_);
  stats_.committed += committed;
  stats_.failed += lost.size();
  stats_.retrying = false;
  stats_.retry_error.clear();
  if (!lost.empty()) {
    const int64_t now_ms = WallNowMs();
    for (const auto& l : lost) {
      stats_.losses.Add(l.table, now_ms, l.why);
      lost_rows_[l.seq] = l.why;
    }
    while (lost_rows_.size() > 4096) lost_rows_.erase(lost_rows_.begin());
    ++losses_version_;
    stats_.last_error = lost.back().why;
    if (first_error_.ok()) first_error_ = first_lost;
  }
  done_seq_ = last_seq;
  done_cv_.notify_all();
}

void Ledger::SaveLosses() {
  LedgerLosses snapshot;
  uint64_t version = 0;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (losses_version_ == losses_saved_) return;
    snapshot = stats_.losses;
    version = losses_version_;
  }
  Status st = Status::Ok();
  if (!loss_file_) {
    auto file = LossFile::Open(path_, snapshot);
    if (file.ok()) {
      loss_file_ = std::make_unique<LossFile>(std::move(*file));
    } else {
      st = file.error();
    }
  }
  if (loss_file_) st = loss_file_->Save(snapshot);
  std::lock_guard<std::mutex> lk(mu_);
  losses_saved_ = version;
  const std::string error = st.ok() ? "" : st.error().message();
  if (!error.empty() && error != stats_.loss_file_error)
    spdlog::error("ledger: {}; the count of lost rows is in memory only until it can be written", error);
  stats_.loss_file_error = error;
}

void Ledger::Run() {
  // An idle writer still looks at its file now and then: one deleted while
  // nothing is written is made again before a restart could lose it.
  constexpr auto kIdleCheck = std::chrono::seconds(2);
  for (;;) {
    std::deque<std::pair<uint64_t, Item>> batch;
    {
      std::unique_lock<std::mutex> lk(mu_);
      auto ready = [&] { return stopping_ || !queue_.empty() || losses_version_ != losses_saved_; };
      if (!work_cv_.wait_for(lk, kIdleCheck, ready)) {
        lk.unlock();
        (void)EnsureFile();  // logged there
        continue;
      }
      if (queue_.empty() && losses_version_ == losses_saved_) break;  // stopping, and drained
      batch.swap(queue_);
    }
    if (!batch.empty()) WriteBatch(batch);
    SaveLosses();
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
  SaveLosses();     // the writer is gone: this thread owns the side file now
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
