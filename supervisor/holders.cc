// The weight holders (daemon mode, one per rank): spawned, awaited through
// their readiness line, kept (the supervisor takes the arena's manifest and
// fds, maps nothing), and restarted from those fds when they die, so no byte
// of the checkpoint is read again.
//
// A holder of engine-made layouts (weight_cache.layout = "engine") has no
// arena of its own; the supervisor keeps its committed layouts instead, one
// by one, whole or not at all (client/client.h KeepLayouts). A keep round
// asks the holder which layouts it has committed (never one being written)
// and takes the record and fds of each one not kept yet. Rounds run when
// the holder is up (that round makes it ready) and whenever an engine
// reports weights from the holders (it published, so a commit is new, or it
// attached, which costs a round that finds nothing new); one runs at a time
// per holder, and a trigger during a round asks for one more after it.
// When the holder dies the engines keep serving from their mappings, and
// the new holder is given every kept layout (--adopt-layouts: a layouts
// record at <runtime_dir>/holder-RANK.layouts.json naming the fds it
// inherits), so the next engine attaches them: no load, no publish. Its
// first round reconciles: a kept layout the new holder does not list (it
// refused it: see its log) is dropped and logged, never attached. A holder
// that refuses the whole record (a permanent exit) is started once more
// without kept layouts. Kept layouts are released at `wsup stop`.
//
// The node's KV pool ([kv] pool_mib > 0): each holder makes its rank's pool
// at start (--kv-pool-mib). Once a holder is ready, the supervisor fetches
// the pool (its description and one fd per allocation; nothing mapped) on
// the thread pool and keeps it in HolderSlot::kv_pool, as it keeps the
// weights. When the holder dies, the new one is given the kept fds and
// --adopt-kv-pool <runtime_dir>/holder-RANK.kvpool.json (wire/kv_pool_record.h)
// and serves the same pool under the same id; the fetch after it is ready
// checks that (a new id is logged as an error, and the new pool is kept:
// the holder refused the kept one, see its log). A restarted supervisor
// fetches the pool from the running holder as at a normal start. The kept
// fds close with the supervisor (`wsup stop`), which releases the pool once
// no engine maps it.
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>

#include "common/fs.h"
#include "common/log.h"
#include "supervisor/supervisor_impl.h"
#include "wire/kv_pool_record.h"

namespace wsup {

namespace {
constexpr int kKeeperTimeoutMs = 10'000;
// Open fds the supervisor itself needs beside what it keeps (sockets,
// pidfds, pipes, the ledger).
constexpr uint64_t kFdReserve = 512;
}  // namespace

bool Supervisor::Impl::AllHoldersReady() const {
  for (const auto& h : holders_) {
    if (!h->ready()) return false;
  }
  return true;
}

void Supervisor::Impl::FireHolder(HolderSlot& h, ChildEvent event, const std::string& cause, int exit_code) {
  auto t = NextChildTransition(ChildKind::kHolder, h.state, event);
  if (!t) {
    spdlog::debug("holder rank {}: event {} ignored in state {} ({})", h.rank, ChildEventName(event),
                  ChildStateName(h.state), cause);
    return;
  }
  spdlog::info("holder rank {}: {} --{}--> {} [{}] {}", h.rank, ChildStateName(t->from), ChildEventName(event),
               ChildStateName(t->to), ChildActionName(t->action), cause);
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
      if (AllHoldersReady()) StartEngines();
      break;
    case ChildAction::kKill:
      if (h.pid > 0) Logged(launcher_.Signal(h.pid, SIGKILL), "killing a holder");
      break;
    case ChildAction::kTerminate:
      if (h.pid > 0) Logged(launcher_.Signal(h.pid, SIGTERM), "stopping a holder");
      break;
    case ChildAction::kScheduleRestart:
      ScheduleHolderRestart(h, exit_code, cause);
      break;
    case ChildAction::kReportDown:
      SetDegraded(h.down_reason);
      break;
  }
}

void Supervisor::Impl::SpawnHolder(HolderSlot& h) {
  if (stopping_) return;
  std::string default_bin = JoinPath(opts_.bin_dir, "wsup-holder");
  auto argv = HolderArgv(cfg_, h.rank, default_bin);
  if (!argv.ok()) {
    BeginStop(argv.error().message(), kExitConfig);
    return;
  }
  ChildSpec spec;
  spec.argv = std::move(*argv);
  int pfd[2];
  if (::pipe2(pfd, O_CLOEXEC) != 0) {
    BeginStop("pipe for the holder's readiness: " + std::string(strerror(errno)), 1);
    return;
  }
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
  spec.log_path = JoinPath(cfg_.node.state_dir, "logs/holder-" + std::to_string(h.rank) + ".log");
  // The holder binds a fresh socket; drop the old keeper link first so its EOF
  // does not confuse the new holder's accounting.
  if (h.kept) h.kept->channel.Close();
  auto pid = launcher_.Spawn(spec);
  if (!pid.ok()) {
    BeginStop(pid.error().message(), kExitConfig);
    return;
  }
  h.pid = *pid;
  auto st = launcher_.StartTime(h.pid);
  h.start_time = st.ok() ? *st : 0;
  h.spawned_ms = clock_.WallMs();
  wr.Reset();
  SaveState();
  HolderSlot* hp = &h;
  auto w = launcher_.WatchExit(&loop_, h.pid, [this, hp](const ExitInfo& info) { OnHolderExit(*hp, info); });
  if (w.ok()) {
    h.watch = *w;
  } else {
    spdlog::error("holder rank {} pid {}: {}; its death will not be seen", h.rank, h.pid, w.error().message());
  }
  WatchReadyLine(h, std::move(rd));
  FireHolder(h, ChildEvent::kSpawn,
             "started pid " + std::to_string(h.pid) + (h.from_fds ? " from kept fds" : ""));
}

void Supervisor::Impl::WatchReadyLine(HolderSlot& h, UniqueFd read_end) {
  if (h.ready_line) h.ready_line->Close();
  h.ready_line = nullptr;
  HolderSlot* hp = &h;
  const pid_t pid = h.pid;
  auto w = LineWatch::Start(&loop_, std::move(read_end), [this, hp, pid](Result<std::string> line) {
    hp->ready_line = nullptr;
    if (hp->pid != pid) return;
    // No line: the holder exited before it was ready; its exit says why.
    if (line.ok()) FireHolder(*hp, ChildEvent::kUp, "readiness line: " + line->substr(0, 200));
  });
  if (w.ok()) {
    h.ready_line = *w;
  } else {
    spdlog::error("holder rank {}: {}; it will not be seen ready", h.rank, w.error().message());
  }
}

void Supervisor::Impl::AttachKeeperAsync(HolderSlot& h) {
  if (cfg_.weight_cache.layout == CacheLayout::kEngine) {
    KeepLayoutsAsync(h, true);
    return;
  }
  // The keeper's attach is a short blocking exchange; run it off the loop.
  struct Work {
    uv_work_t req;
    Impl* self;
    HolderSlot* h;
    pid_t pid;
    std::string socket;
    std::optional<Result<KeptArena>> result;
  };
  auto* w = new Work{{}, this, &h, h.pid, h.socket, std::nullopt};
  w->req.data = w;
  uv_queue_work(
      &loop_, &w->req,
      [](uv_work_t* r) {
        auto* w = static_cast<Work*>(r->data);
        w->result.emplace(AttachKeeper(w->socket, "wsup-supervisor", kKeeperTimeoutMs));
      },
      [](uv_work_t* r, int) {
        std::unique_ptr<Work> w(static_cast<Work*>(r->data));
        // A holder that died (or was replaced) meanwhile: the answer is stale.
        if (w->h->pid != w->pid) return;
        w->self->OnKept(*w->h, std::move(*w->result));
      });
}

void Supervisor::Impl::RecordHolderRestart(HolderSlot& h, int64_t now) {
  if (h.restart_reason.empty()) return;
  HolderRestartRecord rec;
  rec.time_ms = now;
  rec.rank = h.rank;
  rec.reason = h.restart_reason;
  rec.from_fds = h.from_fds;
  rec.restart_ms = now - h.spawned_ms;
  LedgerResult(ledger_->RecordHolderRestart(rec), "holder restart");
  metrics_.holder_restarts++;
  h.restart_reason.clear();
}

uint64_t Supervisor::Impl::KeptFds() const {
  uint64_t n = 0;
  for (const auto& h : holders_) {
    if (h->kept) n += h->kept->fds.size();
    for (const KeptLayout& k : h->layouts) n += k.fds.size();
    if (h->kv_pool) n += h->kv_pool->fds.size();
  }
  return n;
}

uint64_t Supervisor::Impl::FdBudget() const {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY) return 1u << 20;
  uint64_t cur = lim.rlim_cur;
  return cur > kFdReserve ? (cur - kFdReserve) / 2 : 0;
}

void Supervisor::Impl::KeepLayoutsEverywhere() {
  for (auto& h : holders_) {
    if (h->ready()) KeepLayoutsAsync(*h, false);
  }
}

void Supervisor::Impl::KeepLayoutsAsync(HolderSlot& h, bool first) {
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
  struct Work {
    uv_work_t req;
    Impl* self;
    HolderSlot* h;
    pid_t pid;
    uint64_t seq;
    bool first;
    std::string socket;
    std::vector<CommittedLayout> have;
    uint64_t max_fds;
    std::optional<Result<LayoutKeepRound>> result;
  };
  auto* w = new Work{{}, this, &h, h.pid, seq, first, h.socket, std::move(have), budget > kept ? budget - kept : 0,
                     std::nullopt};
  w->req.data = w;
  uv_queue_work(
      &loop_, &w->req,
      [](uv_work_t* r) {
        auto* w = static_cast<Work*>(r->data);
        w->result.emplace(KeepLayouts(w->socket, "wsup-supervisor", kKeeperTimeoutMs, w->have, w->max_fds));
      },
      [](uv_work_t* r, int) {
        std::unique_ptr<Work> w(static_cast<Work*>(r->data));
        // A holder that died (or was replaced) meanwhile: the answer is stale,
        // and the fds it brought close here.
        if (w->h->pid != w->pid || w->h->keep_seq != w->seq) return;
        w->h->keeping_layouts = false;
        w->self->OnLayoutsKept(*w->h, std::move(*w->result), w->first);
      });
}

void Supervisor::Impl::OnLayoutsKept(HolderSlot& h, Result<LayoutKeepRound> round, bool first) {
  if (!round.ok()) {
    if (first) {
      FireHolder(h, ChildEvent::kKeepFailed, "keeper round failed: " + round.error().message());
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
                   h.rank, DescribeLayout(k.record.id, k.record.layout_hash),
                   JoinPath(cfg_.node.state_dir, "logs/holder-" + std::to_string(h.rank) + ".log"));
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
    int64_t now = clock_.WallMs();
    RecordHolderRestart(h, now);
    std::string what = std::to_string(h.layouts.size()) + " engine-made layouts kept";
    if (h.spawned_ms > 0) what += " (" + std::to_string(now - h.spawned_ms) + " ms after the spawn)";
    SaveState();
    FireHolder(h, ChildEvent::kKept, what);
  }
  if (h.keep_again && h.ready()) KeepLayoutsAsync(h, false);
}

void Supervisor::Impl::KeepKvPoolAsync(HolderSlot& h) {
  if (cfg_.kv.pool_mib == 0) return;
  // A short blocking exchange, like the keeper's attach: off the loop.
  struct Work {
    uv_work_t req;
    Impl* self;
    HolderSlot* h;
    pid_t pid;
    uint64_t seq;
    std::string socket;
    std::optional<Result<KvPoolFds>> result;
  };
  auto* w = new Work{{}, this, &h, h.pid, ++h.kv_pool_seq, h.socket, std::nullopt};
  w->req.data = w;
  uv_queue_work(
      &loop_, &w->req,
      [](uv_work_t* r) {
        auto* w = static_cast<Work*>(r->data);
        w->result.emplace(FetchKvPool(w->socket, kKeeperTimeoutMs));
      },
      [](uv_work_t* r, int) {
        std::unique_ptr<Work> w(static_cast<Work*>(r->data));
        // A holder that died (or was replaced) meanwhile: the answer is stale,
        // and the fds it brought close here.
        if (w->h->pid != w->pid || w->h->kv_pool_seq != w->seq) return;
        w->self->OnKvPoolFetched(*w->h, std::move(*w->result));
      });
}

void Supervisor::Impl::OnKvPoolFetched(HolderSlot& h, Result<KvPoolFds> fetched) {
  const std::string log = JoinPath(cfg_.node.state_dir, "logs/holder-" + std::to_string(h.rank) + ".log");
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
  h.kv_pool = std::move(fetched).value();
}

nlohmann::json Supervisor::Impl::KvPoolStatus(const HolderSlot& h) const {
  if (!h.kv_pool) return nullptr;
  return {{"id", h.kv_pool->pool.id}, {"bytes", h.kv_pool->pool.bytes()}};
}

void Supervisor::Impl::OnKept(HolderSlot& h, Result<KeptArena> kept) {
  if (!kept.ok()) {
    FireHolder(h, ChildEvent::kKeepFailed, "keeper attach failed: " + kept.error().message());
    return;
  }
  h.kept = std::move(*kept);
  int64_t now = clock_.WallMs();
  std::vector<int> fds;
  for (auto& f : h.kept->fds) fds.push_back(f.get());
  Logged(notifier_.StoreFds("arena-" + std::to_string(h.rank), fds), "storing the arena fds");
  RecordHolderRestart(h, now);
  std::string what = std::to_string(h.kept->record.manifest.entries.size()) + " tensors in " +
                     std::to_string(h.kept->fds.size()) + " allocations kept";
  if (h.spawned_ms > 0) what += " (" + std::to_string(now - h.spawned_ms) + " ms after the spawn)";
  SaveState();
  FireHolder(h, ChildEvent::kKept, what);
}

void Supervisor::Impl::OnHolderExit(HolderSlot& h, const ExitInfo& info) {
  if (h.watch) h.watch->Close();
  h.watch = nullptr;
  std::string how = "pid " + std::to_string(h.pid) + " " + info.Describe();
  if (!stopping_) spdlog::error("holder rank {} {}", h.rank, how);
  h.pid = 0;
  SaveState();
  FireHolder(h, ChildEvent::kExited, how, info.known && !info.signal ? info.exit_code : -1);
  if (stopping_) MaybeFinishStop();
}

void Supervisor::Impl::ScheduleHolderRestart(HolderSlot& h, int exit_code, const std::string& how) {
  if (stopping_) return;
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
  std::string log = JoinPath(cfg_.node.state_dir, "logs/holder-" + std::to_string(h.rank) + ".log");
  if (d.kind == RestartDecision::Kind::kPermanent) {
    h.down_reason = "holder rank " + std::to_string(h.rank) + " refused to serve (" + how +
                    ": it refuses the checkpoint or its configuration, and the same command would fail again); see " +
                    log;
    FireHolder(h, ChildEvent::kGiveUp, h.down_reason);
    return;
  }
  if (d.kind == RestartDecision::Kind::kGiveUp) {
    h.down_reason = "holder rank " + std::to_string(h.rank) + " failed " + std::to_string(d.recent) +
                    " times within supervisor.restart_window_ms (last: " + how + "); not restarting it; see " + log;
    FireHolder(h, ChildEvent::kGiveUp, h.down_reason);
    return;
  }
  HolderSlot* hp = &h;
  spdlog::info("holder rank {}: {}", h.rank, d.Describe());
  h.restart_timer->Start(d.delay_ms, [this, hp] {
    if (hp->state == ChildState::kFailed && !stopping_) SpawnHolder(*hp);
  });
}

}  // namespace wsup
