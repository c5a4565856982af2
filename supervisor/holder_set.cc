// The weight holders' owner (holder_set.h says what it keeps and why).
#include "supervisor/holder_set.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <numeric>

#include "common/exit_codes.h"
#include "common/fs.h"
#include "common/log.h"
#include "supervisor/process.h"
#include "wire/kv_pool_record.h"
#include "wire/layout_record.h"
#include "wire/protocol.h"

namespace wsup {

namespace {
constexpr int kKeeperTimeoutMs = 10'000;
// Open fds the supervisor needs beside what it keeps (sockets, pidfds, pipes).
constexpr uint64_t kFdReserve = 512;

void Logged(const Status& st, const char* what) {
  if (!st.ok()) spdlog::warn("{}: {}", what, st.error().message());
}

// Runs `work` (a short blocking exchange with a holder) on libuv's thread
// pool, then `done` with its answer on the loop thread. `done` decides
// whether the answer is stale; a stale one is dropped, and the fds it
// brought close with it.
template <typename T>
void OffLoop(uv_loop_t* loop, std::function<T()> work, std::function<void(T)> done) {
  struct Work {
    uv_work_t req;
    std::function<T()> work;
    std::function<void(T)> done;
    std::optional<T> result;
  };
  auto* w = new Work{{}, std::move(work), std::move(done), std::nullopt};
  w->req.data = w;
  uv_queue_work(
      loop, &w->req,
      [](uv_work_t* r) {
        auto* w = static_cast<Work*>(r->data);
        w->result.emplace(w->work());
      },
      [](uv_work_t* r, int) {
        std::unique_ptr<Work> w(static_cast<Work*>(r->data));
        w->done(std::move(*w->result));
      });
}
}  // namespace

struct HolderSet::Holder {
  Holder(TimerSource& timers, RestartPolicy policy) : restart_timer(timers.Make()), throttle(std::move(policy)) {}
  int rank = 0;
  ChildState state = ChildState::kIdle;
  pid_t pid = 0;
  uint64_t start_time = 0;
  ProcessWatch* watch = nullptr;
  std::string socket;
  std::string record_path;
  std::optional<KeptArena> kept;
  // weight_cache.layout = "engine": the committed layouts kept for this
  // rank, each whole (record and fds), handed to the next holder with
  // --adopt-layouts through the record at layouts_path.
  std::vector<KeptLayout> layouts;
  std::string layouts_path;
  bool keeping_layouts = false;  // a keep round is in flight
  bool keep_again = false;       // a commit was seen meanwhile: one more round after it
  uint64_t keep_seq = 0;         // the round in flight; older answers are stale
  bool from_layouts = false;     // this start was given kept layouts
  // [kv] pool_mib > 0: this rank's KV pool, fetched once the holder is
  // ready and handed to the next one with --adopt-kv-pool through the
  // record at kv_pool_path, so that the pool outlives the holder.
  std::optional<KvPoolFds> kv_pool;
  std::string kv_pool_path;
  uint64_t kv_pool_seq = 0;         // the fetch in flight; older answers are stale
  LineWatch* ready_line = nullptr;  // its --ready-fd, until the line comes
  int64_t spawned_ms = 0;
  std::string restart_reason;  // set while a restart is in progress
  bool from_fds = false;
  std::unique_ptr<Timer> restart_timer;
  RestartThrottle throttle;
  std::string down_reason;
  std::string last_error;
  // Why the table's kill row was taken: the exit that follows is ours, and
  // its restart row says why instead of only "killed by signal 9".
  std::string kill_reason;
  bool ready() const { return state == ChildState::kReady; }
};

Status CheckHolderReadyLine(const std::string& line, const std::string& socket) {
  const std::string shown = "\"" + line.substr(0, 200) + (line.size() > 200 ? "..." : "") + "\"";
  if (line == "ready") return Status::Ok();
  if (line.rfind("ready ", 0) != 0) {
    return InvalidArgument("its readiness line " + shown + " is not \"ready <socket>\"; holder.command must run "
                           "wsup-holder (or a holder that speaks its protocol), which writes that line on the "
                           "--ready-fd the supervisor appends");
  }
  const std::string said = line.substr(6);
  if (said != socket) {
    return InvalidArgument("its readiness line says it serves on " + said + ", but the supervisor keeps it through " +
                           socket + "; holder.command must pass \"--socket\", \"{socket}\"");
  }
  return Status::Ok();
}

HolderSet::Keeper HolderSet::Keeper::Real() {
  Keeper k;
  k.attach = [](const std::string& socket) { return AttachKeeper(socket, "wsup-supervisor", kKeeperTimeoutMs); };
  k.keep_layouts = [](const std::string& socket, const std::vector<CommittedLayout>& have, uint64_t max_fds) {
    return KeepLayouts(socket, "wsup-supervisor", kKeeperTimeoutMs, have, max_fds);
  };
  k.fetch_kv_pool = [](const std::string& socket) { return FetchKvPool(socket, kKeeperTimeoutMs); };
  return k;
}

HolderSet::HolderSet(uv_loop_t* loop, Launcher& launcher, TimerSource& timers, const Clock& clock, const Config& cfg,
                     std::string bin_dir, Hooks hooks, Keeper keeper)
    : loop_(loop),
      launcher_(launcher),
      timers_(timers),
      clock_(clock),
      cfg_(cfg),
      bin_dir_(std::move(bin_dir)),
      hooks_(std::move(hooks)),
      keeper_(std::move(keeper)) {}

HolderSet::~HolderSet() {
  *alive_ = false;
  Detach();
}

void HolderSet::Detach() {
  for (auto& h : holders_) {
    h->restart_timer->Stop();
    if (h->watch) h->watch->Close();
    h->watch = nullptr;
    if (h->ready_line) h->ready_line->Close();
    h->ready_line = nullptr;
  }
}

void HolderSet::ReleaseKept() {
  for (auto& h : holders_) {
    h->kept.reset();
    h->layouts.clear();
  }
}

std::string HolderSet::LogPath(int rank) const {
  return JoinPath(cfg_.node.state_dir, "logs/holder-" + std::to_string(rank) + ".log");
}

const HolderSet::Holder* HolderSet::Find(int rank) const {
  if (rank < 0 || static_cast<size_t>(rank) >= holders_.size()) return nullptr;
  return holders_[static_cast<size_t>(rank)].get();
}

// A rank not held reads as idle, with no process and nothing said.
ChildState HolderSet::state(int rank) const { return Find(rank) ? Find(rank)->state : ChildState::kIdle; }
pid_t HolderSet::pid(int rank) const { return Find(rank) ? Find(rank)->pid : 0; }
uint64_t HolderSet::restarts(int rank) const { return Find(rank) ? Find(rank)->throttle.total() : 0; }
std::string HolderSet::failure(int rank) const { return Find(rank) ? Find(rank)->down_reason : ""; }
std::string HolderSet::last_error(int rank) const { return Find(rank) ? Find(rank)->last_error : ""; }

bool HolderSet::AllReady() const {
  return std::all_of(holders_.begin(), holders_.end(), [](const auto& h) { return h->ready(); });
}

bool HolderSet::AnyProcess() const {
  return std::any_of(holders_.begin(), holders_.end(), [](const auto& h) { return h->pid > 0; });
}

void HolderSet::SetRestartPolicy(const RestartPolicy& policy) {
  for (auto& h : holders_) h->throttle.set_policy(policy);
}

std::vector<RuntimeState::Holder> HolderSet::Records() const {
  std::vector<RuntimeState::Holder> out;
  for (const auto& h : holders_) {
    if (h->pid > 0) out.push_back({h->rank, ProcessRef{h->pid, h->start_time}, h->socket, h->record_path});
  }
  return out;
}

nlohmann::json HolderSet::StatusJson() const {
  auto out = nlohmann::json::array();
  for (const auto& h : holders_) {
    nlohmann::json hj{{"rank", h->rank},
                      {"pid", h->pid},
                      {"socket", h->socket},
                      {"state", ChildStateName(h->state)},
                      {"ready", h->ready()},
                      {"kept_fds", h->kept ? h->kept->fds.size() : 0},
                      {"kept_layouts", h->layouts.size()},
                      {"kept_layout_fds",
                       std::accumulate(h->layouts.begin(), h->layouts.end(), size_t{0},
                                       [](size_t n, const KeptLayout& k) { return n + k.fds.size(); })},
                      {"restarts", h->throttle.total()}};
    if (!h->down_reason.empty()) hj["failure"] = h->down_reason;
    if (!h->last_error.empty()) hj["last_error"] = h->last_error;
    if (h->kv_pool) hj["kv_pool"] = {{"id", h->kv_pool->pool.id}, {"bytes", h->kv_pool->pool.bytes()}};
    out.push_back(std::move(hj));
  }
  return out;
}

void HolderSet::Start(const std::vector<RuntimeState::Holder>& prev) {
  for (int r = 0; r < std::max(1, cfg_.parallel.tp); ++r) {
    auto h = std::make_unique<Holder>(timers_, HolderRestartPolicy(cfg_));
    const std::string base = JoinPath(cfg_.node.runtime_dir, "holder-" + std::to_string(r));
    h->rank = r;
    h->socket = HolderSocket(cfg_, r);
    h->record_path = base + ".arena.json";
    h->layouts_path = base + ".layouts.json";
    h->kv_pool_path = base + ".kvpool.json";
    holders_.push_back(std::move(h));
  }
  for (auto& h : holders_) {
    auto ph = std::find_if(prev.begin(), prev.end(), [&](const RuntimeState::Holder& x) { return x.rank == h->rank; });
    if (ph != prev.end() && ph->proc.StillRunning()) {
      Adopt(*h, *ph);
      continue;
    }
    Spawn(*h);
    if (Stopping()) return;
  }
}

void HolderSet::Adopt(Holder& h, const RuntimeState::Holder& prev) {
  h.pid = prev.proc.pid;
  h.start_time = prev.proc.start_time;
  WatchExit(h);
  // The keeper attach runs off the loop; a holder that does not answer is
  // killed and restarted (holder table: keeping --keep_failed-->).
  Fire(h, ChildEvent::kAdopt, "adopted pid " + std::to_string(h.pid) + " after a supervisor restart");
}

void HolderSet::Stop(const std::string& why) {
  for (auto& h : holders_) {
    h->restart_timer->Stop();
    Fire(*h, ChildEvent::kStop, why);
  }
}

void HolderSet::Fire(Holder& h, ChildEvent event, const std::string& cause, int exit_code) {
  auto t = NextChildTransition(ChildKind::kHolder, h.state, event);
  if (!t) {
    spdlog::debug("holder rank {}: {}; ignored ({})", h.rank, kChildNames.Refused(h.state, event), cause);
    return;
  }
  spdlog::info("holder rank {}: {} {}", h.rank, kChildNames.Move(*t), cause);
  h.state = t->to;
  // Ready: its weights are kept, and now its KV pool.
  if (t->to == ChildState::kReady && t->from != ChildState::kReady) KeepKvPoolAsync(h);
  switch (t->action) {
    case ChildAction::kNone:
    case ChildAction::kPushRoutes:
    case ChildAction::kReconnect:
      break;
    case ChildAction::kAttachKeeper:
      AttachKeeperAsync(h);
      break;
    case ChildAction::kEnginesMayStart:
      if (AllReady() && hooks_.all_ready) hooks_.all_ready();
      break;
    case ChildAction::kKill:
      h.kill_reason = cause;
      if (h.pid > 0) Logged(launcher_.Signal(h.pid, SIGKILL), "killing a holder");
      break;
    case ChildAction::kTerminate:
      if (h.pid > 0) Logged(launcher_.Signal(h.pid, SIGTERM), "stopping a holder");
      break;
    case ChildAction::kScheduleRestart:
      ScheduleRestart(h, exit_code, cause);
      break;
    case ChildAction::kReportDown:
      if (hooks_.down) hooks_.down(h.down_reason);
      break;
  }
}

void HolderSet::Spawn(Holder& h) {
  if (Stopping()) return;
  auto fatal = [&](const std::string& why, int code) {
    if (hooks_.fatal) hooks_.fatal(why, code);
  };
  auto argv = HolderArgv(cfg_, h.rank, JoinPath(bin_dir_, "wsup-holder"));
  if (!argv.ok()) return fatal(argv.error().message(), kExitConfig);
  ChildSpec spec;
  spec.argv = std::move(*argv);
  int pfd[2];
  if (::pipe2(pfd, O_CLOEXEC) != 0) return fatal("pipe for the holder's readiness: " + std::string(strerror(errno)), 1);
  UniqueFd rd(pfd[0]), wr(pfd[1]);
  h.from_fds = h.kept.has_value();
  h.from_layouts = false;
  if (!h.layouts.empty()) {
    // Restart from the kept layouts: the record names the fds the holder
    // inherits, in order, as 3, 4, ...
    std::vector<LayoutRecord> records;
    size_t fds = 0;
    for (KeptLayout& k : h.layouts) {
      LayoutRecord r = k.record;
      r.fds.clear();
      for (UniqueFd& f : k.fds) {
        r.fds.push_back(3 + static_cast<int>(fds++));
        spec.pass_fds.push_back(f.get());
      }
      records.push_back(std::move(r));
    }
    Status st = WriteLayoutsRecord(h.layouts_path, records);
    if (st.ok()) {
      spec.argv.insert(spec.argv.end(), {"--adopt-layouts", h.layouts_path});
      h.from_fds = true;
      h.from_layouts = true;
    } else {
      spdlog::error("holder rank {}: {}; starting it without its {} kept layouts (engines publish them again)",
                    h.rank, st.error().message(), h.layouts.size());
      spec.pass_fds.clear();
      h.layouts.clear();
    }
  }
  if (h.kept) {
    // Restart from the kept fds: no byte of the checkpoint is read.
    Status st = WriteArenaRecord(h.record_path, h.kept->record);
    if (!st.ok()) spdlog::error("{}", st.error().message());
    std::string list;
    for (size_t i = 0; i < h.kept->fds.size(); ++i) {
      spec.pass_fds.push_back(h.kept->fds[i].get());
      list += (i ? "," : "") + std::to_string(3 + i);
    }
    spec.argv.insert(spec.argv.end(), {"--adopt-manifest", h.record_path, "--adopt-fds", list});
  }
  if (h.kv_pool) {
    // The kept KV pool: the new holder serves the same memory under the
    // same id. Its record names the fds it inherits, after the others.
    KvPoolRecord rec;
    rec.pool = h.kv_pool->pool;
    for (size_t i = 0; i < h.kv_pool->fds.size(); ++i) {
      rec.fds.push_back(3 + static_cast<int>(spec.pass_fds.size() + i));
    }
    Status st = WriteKvPoolRecord(h.kv_pool_path, rec);
    if (st.ok()) {
      for (const UniqueFd& f : h.kv_pool->fds) spec.pass_fds.push_back(f.get());
      spec.argv.insert(spec.argv.end(), {"--adopt-kv-pool", h.kv_pool_path});
    } else {
      spdlog::error(
          "holder rank {}: {}; starting it without its kept KV pool {} (it makes a new one, and what the "
          "KV held is lost)",
          h.rank, st.error().message(), h.kv_pool->pool.id);
    }
  }
  spec.pass_fds.push_back(wr.get());
  spec.argv.insert(spec.argv.end(), {"--ready-fd", std::to_string(3 + spec.pass_fds.size() - 1)});
  spec.log_path = LogPath(h.rank);
  // The holder binds a fresh socket; drop the old keeper link first so its EOF
  // does not confuse the new holder's accounting.
  if (h.kept) h.kept->channel.Close();
  auto pid = launcher_.Spawn(spec);
  if (!pid.ok()) return fatal(pid.error().message(), kExitConfig);
  h.pid = *pid;
  auto st = launcher_.StartTime(h.pid);
  h.start_time = st.ok() ? *st : 0;
  h.spawned_ms = clock_.WallMs();
  h.kill_reason.clear();
  wr.Reset();
  SaveState();
  WatchExit(h);
  WatchReadyLine(h, std::move(rd));
  Fire(h, ChildEvent::kSpawn, "started pid " + std::to_string(h.pid) + (h.from_fds ? " from kept fds" : ""));
}

void HolderSet::WatchExit(Holder& h) {
  Holder* hp = &h;
  auto w = launcher_.WatchExit(loop_, h.pid, [this, hp](const ExitInfo& info) { OnExit(*hp, info); });
  if (w.ok()) {
    h.watch = *w;
  } else {
    spdlog::error("holder rank {} pid {}: {}; its death will not be seen", h.rank, h.pid, w.error().message());
  }
}

void HolderSet::WatchReadyLine(Holder& h, UniqueFd read_end) {
  if (h.ready_line) h.ready_line->Close();
  h.ready_line = nullptr;
  Holder* hp = &h;
  const pid_t pid = h.pid;
  auto w = LineWatch::Start(loop_, std::move(read_end), [this, hp, pid](Result<std::string> line) {
    hp->ready_line = nullptr;
    if (hp->pid != pid) return;
    // No line: the holder exited before it was ready; its exit says why.
    if (line.ok()) OnReadyLine(*hp, *line);
  });
  if (w.ok()) {
    h.ready_line = *w;
  } else {
    spdlog::error("holder rank {}: {}; it will not be seen ready", h.rank, w.error().message());
  }
}

void HolderSet::OnReadyLine(Holder& h, const std::string& line) {
  Status st = CheckHolderReadyLine(line, h.socket);
  if (!st.ok()) {
    // Up in some sense, but not as a holder the keeper can reach: of no
    // use, and waiting would only hold the engines back. Killed; its exit
    // goes through the restart throttle, which gives up if it persists.
    h.last_error = "holder rank " + std::to_string(h.rank) + " pid " + std::to_string(h.pid) + ": " +
                   st.error().message() + "; see " + LogPath(h.rank);
    spdlog::error("{}", h.last_error);
    Fire(h, ChildEvent::kKeepFailed, "bad readiness line: " + st.error().message());
    return;
  }
  Fire(h, ChildEvent::kUp, "readiness line: " + line.substr(0, 200));
}

void HolderSet::AttachKeeperAsync(Holder& h) {
  if (cfg_.weight_cache.layout == CacheLayout::kEngine) {
    KeepLayoutsAsync(h, true);
    return;
  }
  // The keeper's attach is a short blocking exchange; run it off the loop.
  OffLoop<Result<KeptArena>>(
      loop_, [this, socket = h.socket] { return keeper_.attach(socket); },
      [this, alive = alive_, hp = &h, pid = h.pid](Result<KeptArena> kept) {
        // A holder that died (or was replaced) meanwhile: the answer is stale.
        if (!*alive || hp->pid != pid) return;
        OnKept(*hp, std::move(kept));
      });
}

void HolderSet::OnKept(Holder& h, Result<KeptArena> kept) {
  if (!kept.ok()) {
    h.last_error = "holder rank " + std::to_string(h.rank) + ": keeper attach failed: " + kept.error().message();
    Fire(h, ChildEvent::kKeepFailed, "keeper attach failed: " + kept.error().message());
    return;
  }
  h.kept = std::move(*kept);
  const int64_t now = clock_.WallMs();
  std::vector<int> fds;
  for (auto& f : h.kept->fds) fds.push_back(f.get());
  if (hooks_.store_fds) hooks_.store_fds("arena-" + std::to_string(h.rank), fds);
  RecordRestart(h, now);
  std::string what = std::to_string(h.kept->record.manifest.entries.size()) + " tensors in " +
                     std::to_string(h.kept->fds.size()) + " allocations kept";
  if (h.spawned_ms > 0) what += " (" + std::to_string(now - h.spawned_ms) + " ms after the spawn)";
  SaveState();
  Fire(h, ChildEvent::kKept, what);
}

void HolderSet::RecordRestart(Holder& h, int64_t now) {
  if (h.restart_reason.empty()) return;
  HolderRestartRecord rec;
  rec.time_ms = now;
  rec.rank = h.rank;
  rec.reason = h.restart_reason;
  rec.from_fds = h.from_fds;
  rec.restart_ms = now - h.spawned_ms;
  h.restart_reason.clear();
  if (hooks_.restarted) hooks_.restarted(rec);
}

uint64_t HolderSet::KeptFds() const {
  uint64_t n = 0;
  for (const auto& h : holders_) {
    if (h->kept) n += h->kept->fds.size();
    for (const KeptLayout& k : h->layouts) n += k.fds.size();
    if (h->kv_pool) n += h->kv_pool->fds.size();
  }
  return n;
}

uint64_t HolderSet::FdBudget() {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY) return 1u << 20;
  uint64_t cur = lim.rlim_cur;
  return cur > kFdReserve ? (cur - kFdReserve) / 2 : 0;
}

void HolderSet::KeepLayoutsEverywhere() {
  for (auto& h : holders_) {
    if (h->ready()) KeepLayoutsAsync(*h, false);
  }
}

void HolderSet::KeepLayoutsAsync(Holder& h, bool first) {
  // A round for the holder that is up now always starts (it makes it
  // ready); a later trigger during a round asks for one more after it.
  if (h.keeping_layouts && !first) {
    h.keep_again = true;
    return;
  }
  h.keeping_layouts = true;
  h.keep_again = false;
  const uint64_t seq = ++h.keep_seq;
  std::vector<CommittedLayout> have;
  for (const KeptLayout& k : h.layouts) {
    have.push_back(CommittedLayout{k.record.id, k.record.layout_hash, k.fds.size()});
  }
  const uint64_t budget = FdBudget();
  const uint64_t kept = KeptFds();
  OffLoop<Result<LayoutKeepRound>>(
      loop_,
      [this, socket = h.socket, have = std::move(have), max_fds = budget > kept ? budget - kept : 0] {
        return keeper_.keep_layouts(socket, have, max_fds);
      },
      [this, alive = alive_, hp = &h, pid = h.pid, seq, first](Result<LayoutKeepRound> round) {
        // A holder that died (or was replaced) meanwhile: the answer is stale,
        // and the fds it brought close here.
        if (!*alive || hp->pid != pid || hp->keep_seq != seq) return;
        hp->keeping_layouts = false;
        OnLayoutsKept(*hp, std::move(round), first);
      });
}

void HolderSet::OnLayoutsKept(Holder& h, Result<LayoutKeepRound> round, bool first) {
  if (!round.ok()) {
    if (first) {
      h.last_error = "holder rank " + std::to_string(h.rank) + ": keeper round failed: " + round.error().message();
      Fire(h, ChildEvent::kKeepFailed, "keeper round failed: " + round.error().message());
      return;
    }
    spdlog::warn("holder rank {}: cannot keep its committed layouts now ({}); the next engine that reports its "
                 "weights tries again",
                 h.rank, round.error().message());
  } else {
    auto listed = [&](const LayoutRecord& r) {
      return std::any_of(round->committed.begin(), round->committed.end(), [&](const CommittedLayout& c) {
        return c.id == r.id && c.layout_hash == r.layout_hash;
      });
    };
    std::erase_if(h.layouts, [&](const KeptLayout& k) {
      if (listed(k.record)) return false;
      // A new holder that refused it says why in its log; its fds close here.
      spdlog::warn("holder rank {}: {} was kept, but the holder does not serve it (it refused to adopt it: see {}); "
                   "dropped, never attached: the next engine publishes it again",
                   h.rank, DescribeLayout(k.record.id, k.record.layout_hash), LogPath(h.rank));
      return true;
    });
    for (const std::string& why : round->skipped) {
      spdlog::warn("holder rank {}: {}; not kept: a holder crash loses it (raise the supervisor's open-file limit, "
                   "LimitNOFILE, if fds ran out)",
                   h.rank, why);
    }
    for (KeptLayout& k : round->fetched) {
      spdlog::info("holder rank {}: kept {} ({} tensors in {} allocations, {}); a holder crash no longer loses it",
                   h.rank, DescribeLayout(k.record.id, k.record.layout_hash), k.record.manifest.entries.size(),
                   k.fds.size(), k.record.fingerprint.Get("engine") + " " + k.record.fingerprint.Get("engine_version"));
      h.layouts.push_back(std::move(k));
    }
  }
  if (first) {
    const int64_t now = clock_.WallMs();
    RecordRestart(h, now);
    std::string what = std::to_string(h.layouts.size()) + " engine-made layouts kept";
    if (h.spawned_ms > 0) what += " (" + std::to_string(now - h.spawned_ms) + " ms after the spawn)";
    SaveState();
    Fire(h, ChildEvent::kKept, what);
  }
  if (h.keep_again && h.ready()) KeepLayoutsAsync(h, false);
}

void HolderSet::KeepKvPoolAsync(Holder& h) {
  if (cfg_.kv.pool_mib == 0) return;
  // A short blocking exchange, like the keeper's attach: off the loop.
  OffLoop<Result<KvPoolFds>>(
      loop_, [this, socket = h.socket] { return keeper_.fetch_kv_pool(socket); },
      [this, alive = alive_, hp = &h, pid = h.pid, seq = ++h.kv_pool_seq](Result<KvPoolFds> fetched) {
        // A holder that died (or was replaced) meanwhile: the answer is stale,
        // and the fds it brought close here.
        if (!*alive || hp->pid != pid || hp->kv_pool_seq != seq) return;
        OnKvPoolFetched(*hp, std::move(fetched));
      });
}

void HolderSet::OnKvPoolFetched(Holder& h, Result<KvPoolFds> fetched) {
  const std::string log = LogPath(h.rank);
  if (!fetched.ok()) {
    const bool none = fetched.error().code() == Code::kNotFound;
    spdlog::error("holder rank {}: cannot keep its KV pool: {}{}", h.rank, fetched.error().message(),
                  none ? "; a holder.command of its own must pass \"--kv-pool-mib\", \"{kv_pool_mib}\""
                       : "; see " + log);
    if (h.kv_pool) {
      spdlog::warn("holder rank {}: the KV pool {} kept before stays kept, for the next holder", h.rank,
                   h.kv_pool->pool.id);
    }
    return;
  }
  const uint64_t held = h.kv_pool ? h.kv_pool->fds.size() : 0;
  const uint64_t others = KeptFds() - held;
  if (others + fetched->fds.size() > FdBudget()) {
    spdlog::warn(
        "holder rank {}: KV pool {} has {} allocations, more fds than this supervisor may keep beside the "
        "{} it keeps ({}); not kept: a holder crash loses it (raise LimitNOFILE)",
        h.rank, fetched->pool.id, fetched->fds.size(), others, FdBudget());
    return;
  }
  if (h.kv_pool && h.kv_pool->pool.id != fetched->pool.id) {
    spdlog::error(
        "holder rank {}: the new holder serves KV pool {}, not the kept pool {} it was given (it refused "
        "it: see {}); keeping the new one, and what the old one held is lost once no engine maps it",
        h.rank, fetched->pool.id, h.kv_pool->pool.id, log);
  } else if (h.kv_pool) {
    spdlog::info("holder rank {}: serves the kept KV pool {} again ({} bytes)", h.rank, fetched->pool.id,
                 fetched->pool.bytes());
  } else {
    spdlog::info(
        "holder rank {}: kept KV pool {} ({} bytes in {} allocations, {}); a holder crash no longer "
        "loses it",
        h.rank, fetched->pool.id, fetched->pool.bytes(), fetched->fds.size(), fetched->pool.backend);
  }
  h.kv_pool = std::move(*fetched);
}

void HolderSet::OnExit(Holder& h, const ExitInfo& info) {
  if (h.watch) h.watch->Close();
  h.watch = nullptr;
  std::string how = "pid " + std::to_string(h.pid) + " " + info.Describe();
  if (!h.kill_reason.empty()) how += " (killed by the supervisor: " + h.kill_reason + ")";
  h.kill_reason.clear();
  if (!Stopping()) spdlog::error("holder rank {} {}", h.rank, how);
  h.pid = 0;
  SaveState();
  Fire(h, ChildEvent::kExited, how, info.known && !info.signal ? info.exit_code : -1);
  if (hooks_.exited) hooks_.exited();
}

void HolderSet::ScheduleRestart(Holder& h, int exit_code, const std::string& how) {
  if (Stopping()) return;
  // Engines keep serving from their mappings; a new holder serves the same
  // arena from the kept fds. Without kept fds (it died before it was kept)
  // it loads again.
  h.restart_reason = how;
  if (h.from_layouts && h.throttle.IsPermanent(exit_code)) {
    // It refused the layouts record as a whole: the next start goes without
    // it rather than never.
    spdlog::error("holder rank {} refused to start from its {} kept layouts ({}); dropping them: the next holder "
                  "starts empty and engines publish again",
                  h.rank, h.layouts.size(), how);
    h.layouts.clear();
    h.from_layouts = false;
    exit_code = -1;
  }
  RestartDecision d = h.throttle.OnExit(clock_.MonotonicMs(), exit_code);
  const std::string log = LogPath(h.rank);
  if (d.kind == RestartDecision::Kind::kPermanent) {
    h.down_reason = "holder rank " + std::to_string(h.rank) + " refused to serve (" + how +
                    ": it refuses the checkpoint or its configuration, and the same command would fail again); see " +
                    log;
    Fire(h, ChildEvent::kGiveUp, h.down_reason);
    return;
  }
  if (d.kind == RestartDecision::Kind::kGiveUp) {
    h.down_reason = "holder rank " + std::to_string(h.rank) + " failed " + std::to_string(d.recent) +
                    " times within supervisor.restart_window_ms (last: " + how + "); not restarting it; see " + log;
    Fire(h, ChildEvent::kGiveUp, h.down_reason);
    return;
  }
  Holder* hp = &h;
  spdlog::info("holder rank {}: {}", h.rank, d.Describe());
  h.restart_timer->Start(d.delay_ms, [this, hp] {
    if (hp->state == ChildState::kFailed && !Stopping()) Spawn(*hp);
  });
}

}  // namespace wsup
