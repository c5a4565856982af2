#include "supervisor/supervisor.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uv.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <map>
#include <optional>

#include <nlohmann/json.hpp>

#include "client/client.h"
#include "client/protocol.h"
#include "common/fs.h"
#include "common/json_limits.h"
#include "common/log.h"
#include "common/unique_fd.h"
#include "http/client.h"
#include "http/server.h"
#include "probes/monitor.h"
#include "probes/probe.h"
#include "state/ledger.h"
#include "supervisor/engine_fsm.h"
#include "supervisor/json_socket.h"
#include "supervisor/loop_timer.h"
#include "supervisor/metrics.h"
#include "supervisor/notify.h"
#include "supervisor/process.h"
#include "supervisor/runtime_state.h"

namespace wsup {

using nlohmann::json;

namespace {

constexpr int64_t kStatusPollMs = 25;       // while an engine starts
constexpr int64_t kFrontConnectRetryMs = 20;
constexpr int kKeeperTimeoutMs = 10'000;
constexpr int64_t kDrainBudgetMs = 30'000;
constexpr int64_t kDrainPollMs = 20;

// Binds a TCP listening socket for the front; the supervisor keeps it so a
// restarted front serves the same socket (connections wait in the backlog).
Result<UniqueFd> BindListen(const ListenAddress& addr, int* bound_port) {
  bool v6 = addr.ipv6();
  UniqueFd fd(::socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return ErrnoError("socket for front.listen " + addr.ToString(), errno);
  int one = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_storage ss{};
  socklen_t len = 0;
  std::string host = addr.host == "localhost" ? (v6 ? "::1" : "127.0.0.1") : addr.host;
  if (v6) {
    auto* s6 = reinterpret_cast<sockaddr_in6*>(&ss);
    if (uv_ip6_addr(host.c_str(), addr.port, s6) != 0) {
      return InvalidArgument("front.listen " + addr.ToString() + ": not an IPv6 address; use an address literal");
    }
    len = sizeof *s6;
  } else {
    auto* s4 = reinterpret_cast<sockaddr_in*>(&ss);
    if (uv_ip4_addr(host.c_str(), addr.port, s4) != 0) {
      return InvalidArgument("front.listen " + addr.ToString() + ": not an IPv4 address; use an address literal");
    }
    len = sizeof *s4;
  }
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&ss), len) != 0) {
    return ErrnoError("front.listen " + addr.ToString() + ": cannot bind (is another process using the port?)", errno);
  }
  if (::listen(fd.get(), 1024) != 0) return ErrnoError("front.listen " + addr.ToString() + ": listen", errno);
  sockaddr_storage got{};
  socklen_t glen = sizeof got;
  ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&got), &glen);
  *bound_port = ntohs(v6 ? reinterpret_cast<sockaddr_in6*>(&got)->sin6_port
                         : reinterpret_cast<sockaddr_in*>(&got)->sin_port);
  return fd;
}

// A free loopback port for an engine whose configured port is 0. The engine
// binds it a moment later; the window is small and a clash only costs a
// restart.
Result<int> PickFreePort(const std::string& host) {
  ListenAddress a{host, 0};
  int port = 0;
  WSUP_ASSIGN_OR_RETURN(UniqueFd fd, BindListen(a, &port));
  return port;
}

std::string Addr(const std::string& host, int port) {
  return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

}  // namespace

// ------------------------------------------------------------------ Impl

class Supervisor::Impl {
 public:
  Impl(Config config, SupervisorOptions options);
  ~Impl();
  Status Start();
  int Run();

 private:
  // ---- engines
  struct Slot {
    explicit Slot(uv_loop_t* loop, std::string n) : name(std::move(n)), poll(loop), stop_timer(loop), restart_timer(loop) {}
    std::string name;
    SlotState state = SlotState::kIdle;
    pid_t pid = 0;
    uint64_t start_time = 0;
    ExitWatch* watch = nullptr;
    HangupWatch* lifeline = nullptr;  // EOF: the process is being torn down
    int port = 0;
    int64_t spawned_ms = 0;      // wall
    int64_t spawned_mono = 0;    // monotonic, for the start budget
    LoopTimer poll;              // status polling while starting
    LoopTimer stop_timer;        // SIGKILL after the stop budget
    LoopTimer restart_timer;     // backoff
    std::unique_ptr<HealthMonitor> monitor;
    bool semantic_ready = false;
    bool comm_warm = false;
    json last_status;            // the engine's /wsup/status
    std::string last_probe_reason;
    int64_t last_probe_ms = 0;
    // Recovery bookkeeping for the next time this slot becomes ready.
    std::optional<int64_t> recovery_failover_id;
    int64_t recovery_fault_ms = 0;
    std::string recovery_cause;  // "" when this start is not a recovery
    bool cache_recorded = false;
    std::string cache_result;    // "hit" | "miss" | "off"
    std::string cache_reason;
    // Restart throttle.
    std::deque<int64_t> restarts;  // monotonic ms of recent restarts
    int64_t backoff_ms = 0;
    bool permanent_failure = false;
    std::string failure_reason;
    // Fault injected by a drill: the exit that follows is the drill's.
    bool drill_kill = false;
    int64_t drill_fault_ms = 0;
    bool adopted = false;
  };

  // ---- holders
  struct HolderSlot {
    explicit HolderSlot(uv_loop_t* loop) : restart_timer(loop) {}
    int rank = 0;
    pid_t pid = 0;
    uint64_t start_time = 0;
    ExitWatch* watch = nullptr;
    std::string socket;
    std::string record_path;
    std::optional<KeptArena> kept;
    uv_pipe_t* ready_pipe = nullptr;
    std::string ready_buf;
    bool ready = false;
    int64_t spawned_ms = 0;
    std::string restart_reason;  // set while a restart is in progress
    bool from_fds = false;
    LoopTimer restart_timer;
    int restarts = 0;
  };

  // ---- pending failover (its first good answer through the front)
  struct PendingFailover {
    int64_t id = 0;
    std::string from, to;
    int64_t fault_ms = 0, detected_ms = 0, swapped_ms = 0;
    std::vector<std::shared_ptr<JsonConn>> waiters;  // `wsup failover` callers
    bool drill = false;
  };

  Slot* SlotByName(const std::string& name);
  Slot* Other(Slot* s) { return s == &a_ ? &b_ : &a_; }
  Slot* Active();

  // Lifecycle of the node.
  Status PrepareDirs();
  Status AdoptOrStart();
  void StartFront(bool restart);
  void ConnectFront();
  void OnFrontExit(const ExitInfo& info);
  void SpawnHolder(HolderSlot& h);
  void OnHolderReadyLine(HolderSlot& h);
  void OnHolderExit(HolderSlot& h, const ExitInfo& info);
  bool AllHoldersReady() const;
  void StartEngines();
  void SpawnEngine(Slot& s);
  void PollStatus(Slot& s);
  void OnEngineStatus(Slot& s, const json& status);
  void RecordCache(Slot& s, const json& weights);
  void StartProbing(Slot& s);
  void Fire(Slot& s, SlotEvent event, const std::string& cause);
  void Apply(Slot& s, SlotAction action, const std::string& cause);
  void OnEngineExit(Slot& s, const ExitInfo& info);
  void OnEngineDying(Slot& s, pid_t pid);
  void Failover(Slot& failed, const std::string& trigger, const std::string& reason, int64_t fault_ms, bool drill);
  void ScheduleRestart(Slot& s);
  void MaybePromote();
  void PushRoutes();
  void ProbeThroughFront(std::function<void(bool ok, int64_t at_ms)> done, int attempts_left);
  void CompletePending(int64_t first_ok_ms);
  void SaveState();
  void WriteStateAsync();
  RuntimeState BuildState();
  void UpdateStatusLine();
  std::string NodeState() const;

  // Control socket.
  void OnControl(const std::shared_ptr<JsonConn>& c, const json& msg);
  json StatusJson();
  void Drill(const std::shared_ptr<JsonConn>& c, bool kill);
  void FinishDrain(Slot& old, std::shared_ptr<JsonConn> c, int64_t started_mono);

  // Metrics.
  void OnAdmin(std::shared_ptr<http::ResponseWriter> w);

  void BeginStop(const std::string& why, int exit_code);
  void MaybeFinishStop();

  // Initialised first, so every member below can put handles on it.
  struct LoopBox {
    explicit LoopBox(void* owner) {
      uv_loop_init(&loop);
      loop.data = owner;
    }
    // Destroyed last: every member declared after it has closed its handles
    // by now; run their close callbacks, then close the loop.
    ~LoopBox() {
      uv_walk(&loop, [](uv_handle_t* h, void*) { if (!uv_is_closing(h)) uv_close(h, nullptr); }, nullptr);
      uv_run(&loop, UV_RUN_DEFAULT);
      if (uv_loop_close(&loop) != 0) spdlog::warn("the supervisor's loop closed with handles still open");
    }
    uv_loop_t loop{};
  };

  Config cfg_;
  SupervisorOptions opts_;
  const Clock& clock_;
  LoopBox loop_box_;
  uv_loop_t& loop_ = loop_box_.loop;
  std::unique_ptr<Ledger> ledger_;
  std::unique_ptr<http::HttpClient> http_;
  std::unique_ptr<JsonServer> control_;
  std::unique_ptr<http::HttpServer> admin_;
  Notifier notifier_;
  Metrics metrics_;
  LoopTimer watchdog_;
  uv_signal_t sigterm_{}, sigint_{}, sigpipe_{};

  Slot a_, b_;
  std::vector<std::unique_ptr<HolderSlot>> holders_;
  bool engines_started_ = false;
  bool adopting_ = false;

  // Front.
  UniqueFd front_listen_;
  int front_port_ = 0;
  pid_t front_pid_ = 0;
  uint64_t front_start_time_ = 0;
  ExitWatch* front_watch_ = nullptr;
  std::string front_control_path_;
  std::shared_ptr<JsonConn> front_link_;
  LoopTimer front_retry_;
  int front_restarts_ = 0;
  int64_t epoch_ = 0;
  std::string routed_active_, routed_standby_;

  std::optional<std::string> pending_state_;  // runtime state not yet written
  bool state_write_in_flight_ = false;
  bool state_removed_ = false;
  std::optional<PendingFailover> pending_;
  bool ready_notified_ = false;
  bool degraded_ = false;
  std::string degraded_reason_;
  bool stopping_ = false;
  int exit_code_ = 0;
  std::vector<std::shared_ptr<JsonConn>> stop_waiters_;
};

Supervisor::Impl::Impl(Config config, SupervisorOptions options)
    : cfg_(std::move(config)),
      opts_(std::move(options)),
      clock_(*opts_.clock),
      loop_box_(this),
      watchdog_(&loop_),
      a_(&loop_, "a"),
      b_(&loop_, "b"),
      front_retry_(&loop_) {}

Supervisor::Impl::~Impl() {
  // Stop watching processes (they keep running: stop or crash, that is the
  // contract) and release every handle owner while the loop can still run
  // their close callbacks.
  for (Slot* s : {&a_, &b_}) {
    if (s->watch) s->watch->Close();
    s->watch = nullptr;
    if (s->lifeline) s->lifeline->Close();
    s->lifeline = nullptr;
    s->monitor.reset();
  }
  for (auto& h : holders_) {
    if (h->watch) h->watch->Close();
    h->watch = nullptr;
    if (h->ready_pipe) {
      uv_close(reinterpret_cast<uv_handle_t*>(h->ready_pipe),
               [](uv_handle_t* p) { delete reinterpret_cast<uv_pipe_t*>(p); });
      h->ready_pipe = nullptr;
    }
  }
  if (front_watch_) front_watch_->Close();
  front_watch_ = nullptr;
  if (front_link_) front_link_->Close("supervisor exiting");
  front_link_.reset();
  if (control_) control_->Close();
  if (admin_) admin_->Close();
  if (http_) http_->CancelAll();
  uv_run(&loop_, UV_RUN_DEFAULT);
  control_.reset();
  admin_.reset();
  http_.reset();
  uv_run(&loop_, UV_RUN_NOWAIT);
  if (ledger_) ledger_->Close();
}

Supervisor::Impl::Slot* Supervisor::Impl::SlotByName(const std::string& name) {
  if (name == "a") return &a_;
  if (name == "b") return &b_;
  return nullptr;
}

Supervisor::Impl::Slot* Supervisor::Impl::Active() {
  if (a_.state == SlotState::kActive) return &a_;
  if (b_.state == SlotState::kActive) return &b_;
  return nullptr;
}

std::string Supervisor::Impl::NodeState() const {
  if (stopping_) return "stopping";
  if (degraded_) return "degraded";
  bool active = a_.state == SlotState::kActive || b_.state == SlotState::kActive;
  if (active) return "serving";
  // Served before and has no active engine now: degraded until one is proven.
  return ready_notified_ ? "degraded" : "starting";
}

Status Supervisor::Impl::PrepareDirs() {
  WSUP_RETURN_IF_ERROR(MakeDirs(cfg_.node.state_dir, 0700));
  WSUP_RETURN_IF_ERROR(MakeDirs(cfg_.node.runtime_dir, 0700));
  ::chmod(cfg_.node.runtime_dir.c_str(), 0700);
  WSUP_RETURN_IF_ERROR(MakeDirs(JoinPath(cfg_.node.state_dir, "logs"), 0700));
  return Status::Ok();
}

Status Supervisor::Impl::Start() {
  WSUP_RETURN_IF_ERROR(PrepareDirs());
  auto ledger = Ledger::Open(Ledger::PathIn(cfg_.node.state_dir));
  if (!ledger.ok()) return ledger.error();
  ledger_ = std::move(*ledger);
  http_ = std::make_unique<http::HttpClient>(&loop_);

  control_ = std::make_unique<JsonServer>(
      &loop_, cfg_.supervisor.control_socket,
      [this](const std::shared_ptr<JsonConn>& c, const json& m) { OnControl(c, m); });
  WSUP_RETURN_IF_ERROR(control_->Listen());

  http::ServerOptions ao;
  ao.host = cfg_.admin.listen.host;
  ao.port = cfg_.admin.listen.port;
  admin_ = std::make_unique<http::HttpServer>(&loop_, ao,
                                              [this](std::shared_ptr<http::ResponseWriter> w) { OnAdmin(std::move(w)); });
  Status as = admin_->Listen();
  if (!as.ok()) return as.error().With("admin.listen " + cfg_.admin.listen.ToString());

  uv_signal_init(&loop_, &sigterm_);
  uv_signal_init(&loop_, &sigint_);
  uv_signal_init(&loop_, &sigpipe_);
  sigterm_.data = sigint_.data = this;
  uv_signal_start(&sigterm_, [](uv_signal_t* h, int) {
    static_cast<Impl*>(h->data)->BeginStop("SIGTERM", 0);
  }, SIGTERM);
  uv_signal_start(&sigint_, [](uv_signal_t* h, int) {
    static_cast<Impl*>(h->data)->BeginStop("SIGINT", 0);
  }, SIGINT);
  uv_signal_start(&sigpipe_, [](uv_signal_t*, int) {}, SIGPIPE);

  int64_t wd = notifier_.WatchdogIntervalMs();
  if (wd > 0) watchdog_.Start(wd / 3, [this] { notifier_.Watchdog(); }, wd / 3);

  spdlog::info("wsup {}: state {}, runtime {}, control {}, admin {}", cfg_.node.name, cfg_.node.state_dir,
               cfg_.node.runtime_dir, cfg_.supervisor.control_socket, admin_->port());
  return AdoptOrStart();
}

// ------------------------------------------------------------------ adoption

Status Supervisor::Impl::AdoptOrStart() {
  std::string path = RuntimeState::PathIn(cfg_.node.runtime_dir);
  auto loaded = RuntimeState::Load(path);
  std::optional<RuntimeState> prev;
  if (loaded.ok()) {
    prev = std::move(*loaded);
  } else {
    spdlog::warn("{}; starting clean", loaded.error().message());
  }
  if (prev && prev->supervisor.pid != ::getpid() && prev->supervisor.StillRunning()) {
    return Refused("another supervisor (pid " + std::to_string(prev->supervisor.pid) + ") runs node '" +
                   cfg_.node.name + "' from " + path + "; stop it with `wsup stop` first");
  }

  // Front: adopt when it still runs and answers; it hands back its listening
  // socket, which the supervisor keeps for the next front restart.
  if (prev && prev->front && prev->front->proc.StillRunning()) {
    front_pid_ = prev->front->proc.pid;
    front_start_time_ = prev->front->proc.start_time;
    front_control_path_ = prev->front->control_socket;
    epoch_ = prev->epoch;
    // Take the listening socket back for the next front restart: from the
    // service manager's fd store, else from the front itself (it serves on
    // fd 3, as this supervisor's predecessor started it).
    bool got_fd = false;
    for (auto& [name, fd] : Notifier::ReceivedFds()) {
      if (name == "front-listen" && !got_fd) {
        front_listen_.Reset(fd);
        got_fd = true;
      }
    }
    if (!got_fd) {
      auto fd = TakeFdFrom(front_pid_, 3);
      if (fd.ok()) {
        front_listen_ = std::move(*fd);
        got_fd = true;
      } else {
        spdlog::warn("{}", fd.error().message());
      }
    }
    auto port_pos = prev->front->listen.rfind(':');
    front_port_ = port_pos == std::string::npos ? 0 : std::atoi(prev->front->listen.c_str() + port_pos + 1);
    auto w = ExitWatch::Start(&loop_, front_pid_, [this](const ExitInfo& info) { OnFrontExit(info); });
    if (w.ok()) front_watch_ = *w;
    spdlog::info("adopted front pid {} on {}{}", front_pid_, prev->front->listen,
                 got_fd ? "" : " (its listening socket could not be taken back; a front crash will rebind)");
    ConnectFront();
  } else {
    StartFront(false);
  }

  // Holders.
  if (cfg_.weight_cache.mode == CacheMode::kDaemon) {
    for (int r = 0; r < std::max(1, cfg_.parallel.tp); ++r) {
      auto h = std::make_unique<HolderSlot>(&loop_);
      h->rank = r;
      h->socket = HolderSocket(cfg_, r);
      h->record_path = JoinPath(cfg_.node.runtime_dir, "holder-" + std::to_string(r) + ".arena.json");
      holders_.push_back(std::move(h));
    }
    for (auto& h : holders_) {
      const RuntimeState::Holder* ph = nullptr;
      if (prev) {
        for (const auto& x : prev->holders) {
          if (x.rank == h->rank) ph = &x;
        }
      }
      if (ph && ph->proc.StillRunning()) {
        h->pid = ph->proc.pid;
        h->start_time = ph->proc.start_time;
        HolderSlot* hp = h.get();
        auto w = ExitWatch::Start(&loop_, h->pid, [this, hp](const ExitInfo& info) { OnHolderExit(*hp, info); });
        if (w.ok()) h->watch = *w;
        auto kept = AttachKeeper(h->socket, "wsup-supervisor", kKeeperTimeoutMs);
        if (kept.ok()) {
          h->kept = std::move(*kept);
          h->ready = true;
          spdlog::info("adopted holder rank {} pid {} ({} allocations kept)", h->rank, h->pid, h->kept->fds.size());
          continue;
        }
        spdlog::warn("holder rank {} pid {} does not answer ({}); restarting it", h->rank, h->pid,
                     kept.error().message());
        if (h->watch) h->watch->Close();
        h->watch = nullptr;
        SignalGroup(h->pid, SIGKILL).ok();
        h->pid = 0;
      }
      SpawnHolder(*h);
    }
  }

  // Engines: adopt those that still run and answer; the one the front routes
  // to as active stays active.
  if (prev) {
    // The engine the front routed to stays active: adopt it first, and keep
    // MaybePromote() from choosing while the others are adopted.
    std::stable_sort(prev->engines.begin(), prev->engines.end(),
                     [](const RuntimeState::Engine& x, const RuntimeState::Engine& y) {
                       return (x.role == "active") > (y.role == "active");
                     });
    adopting_ = true;
    for (const auto& pe : prev->engines) {
      Slot* s = SlotByName(pe.slot);
      if (!s || !pe.proc.StillRunning()) continue;
      s->pid = pe.proc.pid;
      s->start_time = pe.proc.start_time;
      s->port = pe.port;
      s->spawned_ms = pe.started_ms;
      s->cache_result = pe.cache_result;
      s->cache_recorded = true;
      s->adopted = true;
      Slot* sp = s;
      auto w = ExitWatch::Start(&loop_, s->pid, [this, sp](const ExitInfo& info) { OnEngineExit(*sp, info); });
      if (w.ok()) s->watch = *w;
      Fire(*s, SlotEvent::kAdopt, "adopted after a supervisor restart (pid " + std::to_string(s->pid) + ")");
      if (pe.role == "active") Fire(*s, SlotEvent::kPromote, "was active before the supervisor restart");
      spdlog::info("adopted engine {} pid {} port {} as {}", s->name, s->pid, s->port, pe.role);
    }
    adopting_ = false;
    MaybePromote();
    ready_notified_ = Active() != nullptr;
    if (ready_notified_) notifier_.Ready("serving (re-adopted)");
  }
  if (AllHoldersReady()) StartEngines();
  SaveState();
  return Status::Ok();
}

// ------------------------------------------------------------------ front

void Supervisor::Impl::StartFront(bool restart) {
  if (!front_listen_.valid()) {
    auto fd = BindListen(cfg_.front.listen, &front_port_);
    if (!fd.ok()) {
      spdlog::error("{}", fd.error().message());
      BeginStop(fd.error().message(), kExitConfig);
      return;
    }
    front_listen_ = std::move(*fd);
  }
  front_control_path_ = JoinPath(cfg_.node.runtime_dir, "front.sock");
  ChildSpec spec;
  spec.argv = {JoinPath(opts_.bin_dir, "wsup-front"), "--listen-fd", "3", "--control", front_control_path_,
               "--queue-timeout-ms", std::to_string(cfg_.front.queue_timeout_ms), "--max-queued",
               std::to_string(cfg_.front.max_queued), "--epoch", std::to_string(epoch_)};
  if (!routed_active_.empty()) {
    spec.argv.push_back("--active");
    spec.argv.push_back(routed_active_);
  }
  if (!routed_standby_.empty()) {
    spec.argv.push_back("--standby");
    spec.argv.push_back(routed_standby_);
  }
  spec.pass_fds = {front_listen_.get()};
  if (!restart) notifier_.StoreFds("front-listen", {front_listen_.get()}).ok();
  spec.log_path = JoinPath(cfg_.node.state_dir, "logs/front.log");
  auto pid = SpawnChild(spec);
  if (!pid.ok()) {
    spdlog::error("{}", pid.error().message());
    BeginStop(pid.error().message(), kExitConfig);
    return;
  }
  front_pid_ = *pid;
  front_start_time_ = ProcessStartTime(front_pid_).ok() ? *ProcessStartTime(front_pid_) : 0;
  if (restart) ++front_restarts_;
  metrics_.front_restarts = front_restarts_;
  spdlog::info("{} front pid {} on {}", restart ? "restarted" : "started", front_pid_,
               Addr(cfg_.front.listen.host, front_port_));
  auto w = ExitWatch::Start(&loop_, front_pid_, [this](const ExitInfo& info) { OnFrontExit(info); });
  if (w.ok()) front_watch_ = *w;
  SaveState();
  ConnectFront();
}

void Supervisor::Impl::OnFrontExit(const ExitInfo& info) {
  if (stopping_) {
    spdlog::info("front (pid {}) {}", front_pid_, info.Describe());
  } else {
    spdlog::error("front (pid {}) {}", front_pid_, info.Describe());
  }
  if (front_watch_) front_watch_->Close();
  front_watch_ = nullptr;
  if (front_link_) front_link_->Close("front exited");
  front_link_.reset();
  front_pid_ = 0;
  if (!stopping_) {
    StartFront(true);
  } else {
    MaybeFinishStop();
  }
}

void Supervisor::Impl::ConnectFront() {
  if (stopping_ || front_pid_ == 0) return;
  JsonConn::Connect(&loop_, front_control_path_, 1 << 20, [this](Result<std::shared_ptr<JsonConn>> r) {
    if (!r.ok()) {
      // The front binds its control socket right after it starts; retry briefly.
      front_retry_.Start(kFrontConnectRetryMs, [this] { ConnectFront(); });
      return;
    }
    front_link_ = *r;
    front_link_->Start(
        [this](const std::shared_ptr<JsonConn>&, const json& m) {
          std::string type = m.value("type", "");
          if (type == "event" && m.value("kind", "") == "switched") {
            spdlog::warn("front switched on its own from {} to {}: {}", m.value("from", ""), m.value("to", ""),
                         m.value("reason", ""));
            metrics_.front_self_switches++;
          } else if (type == "event" && m.value("kind", "") == "first_ok") {
            if (pending_ && m.value("backend", "") == routed_active_) {
              CompletePending(m.value("at_ms", clock_.WallMs()));
            }
          } else if (m.contains("ok") && m.contains("epoch")) {
            // Routes acknowledged: the swap is done.
            if (pending_ && pending_->swapped_ms == 0) pending_->swapped_ms = clock_.WallMs();
          }
        },
        [this](const std::string& why) {
          spdlog::debug("front control link closed: {}", why);
          front_link_.reset();
          if (!stopping_ && front_pid_ > 0 && ProcessAlive(front_pid_)) {
            front_retry_.Start(kFrontConnectRetryMs, [this] { ConnectFront(); });
          }
        });
    PushRoutes();
  });
}

void Supervisor::Impl::PushRoutes() {
  Slot* act = Active();
  Slot* stby = nullptr;
  for (Slot* s : {&a_, &b_}) {
    if (s != act && s->state == SlotState::kStandby) stby = s;
  }
  std::string na = act ? Addr(cfg_.engine.host, act->port) : "";
  std::string ns = stby ? Addr(cfg_.engine.host, stby->port) : "";
  if (na != routed_active_ || ns != routed_standby_) {
    ++epoch_;
    routed_active_ = na;
    routed_standby_ = ns;
    SaveState();
  }
  if (!front_link_) return;
  json m{{"type", "set_routes"}, {"epoch", epoch_}};
  m["active"] = na.empty() ? json(nullptr) : json(na);
  m["standby"] = ns.empty() ? json(nullptr) : json(ns);
  front_link_->Send(m);
}

// ------------------------------------------------------------------ holders

bool Supervisor::Impl::AllHoldersReady() const {
  for (const auto& h : holders_) {
    if (!h->ready) return false;
  }
  return true;
}

void Supervisor::Impl::SpawnHolder(HolderSlot& h) {
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
  spec.pass_fds.push_back(wr.get());
  spec.argv.insert(spec.argv.end(), {"--ready-fd", std::to_string(3 + spec.pass_fds.size() - 1)});
  spec.log_path = JoinPath(cfg_.node.state_dir, "logs/holder-" + std::to_string(h.rank) + ".log");
  // The holder binds a fresh socket; drop the old keeper link first so its EOF
  // does not confuse the new holder's accounting.
  if (h.kept) h.kept->channel.Close();
  auto pid = SpawnChild(spec);
  if (!pid.ok()) {
    BeginStop(pid.error().message(), kExitConfig);
    return;
  }
  h.pid = *pid;
  h.start_time = ProcessStartTime(h.pid).ok() ? *ProcessStartTime(h.pid) : 0;
  h.spawned_ms = clock_.WallMs();
  h.ready = false;
  h.ready_buf.clear();
  wr.Reset();
  HolderSlot* hp = &h;
  auto w = ExitWatch::Start(&loop_, h.pid, [this, hp](const ExitInfo& info) { OnHolderExit(*hp, info); });
  if (w.ok()) h.watch = *w;
  h.ready_pipe = new uv_pipe_t;
  uv_pipe_init(&loop_, h.ready_pipe, 0);
  h.ready_pipe->data = hp;
  uv_pipe_open(h.ready_pipe, rd.Release());
  uv_read_start(
      reinterpret_cast<uv_stream_t*>(h.ready_pipe),
      [](uv_handle_t*, size_t n, uv_buf_t* b) {
        b->base = new char[n];
        b->len = n;
      },
      [](uv_stream_t* s, ssize_t n, const uv_buf_t* b) {
        std::unique_ptr<char[]> owned(b->base);
        auto* hs = static_cast<HolderSlot*>(s->data);
        if (n > 0) hs->ready_buf.append(b->base, static_cast<size_t>(n));
        if (n < 0 || hs->ready_buf.find('\n') != std::string::npos) {
          uv_close(reinterpret_cast<uv_handle_t*>(s), [](uv_handle_t* h) { delete reinterpret_cast<uv_pipe_t*>(h); });
          hs->ready_pipe = nullptr;
          // The supervisor pointer travels through the loop's data slot.
          auto* self = static_cast<Impl*>(s->loop->data);
          if (n > 0 || hs->ready_buf.find('\n') != std::string::npos) self->OnHolderReadyLine(*hs);
        }
      });
  spdlog::info("started holder rank {} pid {}{}", h.rank, h.pid, h.from_fds ? " from kept fds" : "");
  SaveState();
}

void Supervisor::Impl::OnHolderReadyLine(HolderSlot& h) {
  // The keeper's attach is a short blocking exchange; run it off the loop.
  struct Work {
    uv_work_t req;
    Impl* self;
    HolderSlot* h;
    std::string socket;
    std::optional<Result<KeptArena>> result;
  };
  auto* w = new Work{{}, this, &h, h.socket, std::nullopt};
  w->req.data = w;
  uv_queue_work(
      &loop_, &w->req,
      [](uv_work_t* r) {
        auto* w = static_cast<Work*>(r->data);
        w->result.emplace(AttachKeeper(w->socket, "wsup-supervisor", kKeeperTimeoutMs));
      },
      [](uv_work_t* r, int) {
        std::unique_ptr<Work> w(static_cast<Work*>(r->data));
        Impl* self = w->self;
        HolderSlot& h = *w->h;
        if (!w->result->ok()) {
          spdlog::error("holder rank {}: keeper attach failed: {}", h.rank, w->result->error().message());
          if (h.pid > 0) SignalGroup(h.pid, SIGKILL).ok();
          return;
        }
        h.kept = std::move(w->result->value());
        h.ready = true;
        int64_t now = self->clock_.WallMs();
        spdlog::info("holder rank {} ready: {} tensors in {} allocations kept ({} ms)", h.rank,
                     h.kept->record.manifest.entries.size(), h.kept->fds.size(), now - h.spawned_ms);
        std::vector<int> fds;
        for (auto& f : h.kept->fds) fds.push_back(f.get());
        self->notifier_.StoreFds("arena-" + std::to_string(h.rank), fds).ok();
        if (!h.restart_reason.empty()) {
          HolderRestartRecord rec;
          rec.time_ms = now;
          rec.rank = h.rank;
          rec.reason = h.restart_reason;
          rec.from_fds = h.from_fds;
          rec.restart_ms = now - h.spawned_ms;
          self->ledger_->RecordHolderRestart(rec).ok();
          self->metrics_.holder_restarts++;
          h.restart_reason.clear();
        }
        self->SaveState();
        if (self->AllHoldersReady()) self->StartEngines();
      });
}

void Supervisor::Impl::OnHolderExit(HolderSlot& h, const ExitInfo& info) {
  if (h.watch) h.watch->Close();
  h.watch = nullptr;
  if (!stopping_) spdlog::error("holder rank {} (pid {}) {}", h.rank, h.pid, info.Describe());
  h.pid = 0;
  h.ready = false;
  if (stopping_) {
    MaybeFinishStop();
    return;
  }
  // Engines keep serving from their mappings; a new holder serves the same
  // arena from the kept fds. Without kept fds (it died before ready) it
  // loads again, throttled.
  h.restart_reason = info.Describe();
  ++h.restarts;
  if (!h.kept && info.known && (info.exit_code == 3 || info.exit_code == kExitConfig)) {
    // The holder refused the checkpoint or its configuration: retrying the
    // same command cannot help.
    degraded_ = true;
    degraded_reason_ = "holder rank " + std::to_string(h.rank) + " refused to serve (" + info.Describe() +
                       "); see " + JoinPath(cfg_.node.state_dir, "logs/holder-" + std::to_string(h.rank) + ".log");
    spdlog::error("{}", degraded_reason_);
    UpdateStatusLine();
    return;
  }
  int64_t delay = h.kept ? 0 : std::min<int64_t>(cfg_.supervisor.restart_backoff_ms * h.restarts,
                                                 cfg_.supervisor.restart_backoff_max_ms);
  if (!h.kept && h.restarts > cfg_.supervisor.max_restarts) {
    degraded_ = true;
    degraded_reason_ = "holder rank " + std::to_string(h.rank) + " failed " + std::to_string(h.restarts) +
                       " times before it was ready (last: " + info.Describe() + "); see " +
                       JoinPath(cfg_.node.state_dir, "logs/holder-" + std::to_string(h.rank) + ".log");
    spdlog::error("{}", degraded_reason_);
    UpdateStatusLine();
    return;
  }
  HolderSlot* hp = &h;
  h.restart_timer.Start(delay, [this, hp] { SpawnHolder(*hp); });
}

// ------------------------------------------------------------------ engines

void Supervisor::Impl::StartEngines() {
  if (engines_started_ || stopping_) return;
  engines_started_ = true;
  for (Slot* s : {&a_, &b_}) {
    if (s->state == SlotState::kIdle) {
      s->recovery_cause = "cold start";
      s->recovery_fault_ms = clock_.WallMs();
      SpawnEngine(*s);
    }
  }
}

void Supervisor::Impl::SpawnEngine(Slot& s) {
  if (stopping_) return;
  int port = &s == &a_ ? cfg_.engine.primary_port : cfg_.engine.standby_port;
  if (port == 0) {
    auto p = PickFreePort(cfg_.engine.host);
    if (!p.ok()) {
      spdlog::error("{}", p.error().message());
      ScheduleRestart(s);
      return;
    }
    port = *p;
  }
  auto argv = EngineArgv(cfg_, port);
  if (!argv.ok()) {
    BeginStop(argv.error().message(), kExitConfig);
    return;
  }
  ChildSpec spec;
  spec.argv = std::move(*argv);
  spec.env_set = cfg_.engine.env;
  spec.log_path = JoinPath(cfg_.node.state_dir, "logs/engine-" + s.name + ".log");
  // The engine inherits the write end of its lifeline as fd 3 (before it
  // opens anything of its own, so it is among the first files closed when
  // it dies). Without a pipe the pidfd alone still sees the exit.
  auto line = Lifeline::Make();
  if (line.ok()) spec.pass_fds.push_back(line->write_end.get());
  auto pid = SpawnChild(spec);
  if (line.ok()) line->write_end.Reset();
  if (!pid.ok()) {
    spdlog::error("engine {}: {}", s.name, pid.error().message());
    s.permanent_failure = true;
    s.failure_reason = pid.error().message();
    degraded_ = true;
    degraded_reason_ = pid.error().message();
    UpdateStatusLine();
    return;
  }
  s.pid = *pid;
  s.start_time = ProcessStartTime(s.pid).ok() ? *ProcessStartTime(s.pid) : 0;
  s.port = port;
  s.spawned_ms = clock_.WallMs();
  s.spawned_mono = clock_.MonotonicMs();
  s.semantic_ready = false;
  s.comm_warm = false;
  s.last_status = json();
  s.cache_recorded = false;
  s.cache_result.clear();
  s.cache_reason.clear();
  s.drill_kill = false;
  s.adopted = false;
  Slot* sp = &s;
  auto w = ExitWatch::Start(&loop_, s.pid, [this, sp](const ExitInfo& info) { OnEngineExit(*sp, info); });
  if (w.ok()) s.watch = *w;
  if (s.lifeline) s.lifeline->Close();
  s.lifeline = nullptr;
  if (line.ok()) {
    const pid_t child = s.pid;
    auto hw = HangupWatch::Start(&loop_, std::move(line->read_end), [this, sp, child] { OnEngineDying(*sp, child); });
    if (hw.ok()) s.lifeline = *hw;
  }
  Fire(s, SlotEvent::kSpawn, "started pid " + std::to_string(s.pid) + " on port " + std::to_string(port));
  s.poll.Start(kStatusPollMs, [this, sp] { PollStatus(*sp); });
  SaveState();
}

void Supervisor::Impl::PollStatus(Slot& s) {
  if (s.state != SlotState::kStarting) return;
  if (clock_.MonotonicMs() - s.spawned_mono > cfg_.engine.ready_timeout_ms) {
    Fire(s, SlotEvent::kStartTimeout,
         "not ready within engine.ready_timeout_ms = " + std::to_string(cfg_.engine.ready_timeout_ms) + " ms");
    return;
  }
  http::ClientRequest req;
  req.method = "GET";
  req.target = "/wsup/status";
  req.timeout_ms = 1000;
  Slot* sp = &s;
  int64_t pid = s.pid;
  http_->Send(cfg_.engine.host, s.port, std::move(req), [this, sp, pid](Result<http::HttpResponse> r) {
    Slot& s = *sp;
    if (s.pid != pid || s.state != SlotState::kStarting) return;
    if (r.ok() && r->status == 200) {
      try {
        auto parsed = ParseJsonChecked(r->body, "the engine's /wsup/status", "it is not a wsup engine's status");
        if (!parsed.ok()) throw std::runtime_error(parsed.error().message());  // caught below, as a parse error was
        json st = std::move(parsed).value();
        OnEngineStatus(s, st);
        if (st.value("state", "") == "ready") {
          Fire(s, SlotEvent::kEngineReady, "engine reports ready");
          return;
        }
      } catch (const std::exception&) {
        // Not our engine's status: let the semantic probe decide.
        Fire(s, SlotEvent::kEngineReady, "engine answers HTTP (status is not wsup JSON)");
        return;
      }
    } else if (r.ok() && r->status == 404) {
      // An engine without /wsup/status: it answers, so probe it.
      Fire(s, SlotEvent::kEngineReady, "engine answers HTTP (no /wsup/status)");
      return;
    }
    s.poll.Start(kStatusPollMs, [this, sp] { PollStatus(*sp); });
  });
}

void Supervisor::Impl::OnEngineStatus(Slot& s, const json& st) {
  s.last_status = st;
  if (st.contains("comm") && st["comm"].is_object()) s.comm_warm = st["comm"].value("warm", false);
  if (st.value("state", "") == "ready" && st.contains("weights") && st["weights"].is_object() && !s.cache_recorded) {
    RecordCache(s, st["weights"]);
  }
}

void Supervisor::Impl::RecordCache(Slot& s, const json& weights) {
  s.cache_recorded = true;
  std::string mode = weights.value("mode", CacheModeName(cfg_.weight_cache.mode));
  std::string source = weights.value("source", "");
  if (mode == "off") {
    s.cache_result = "off";
    return;
  }
  CacheEventRecord rec;
  rec.time_ms = clock_.WallMs();
  rec.slot = s.name;
  rec.mode = mode;
  if (source == "holder") {
    rec.result = "hit";
    if (weights.contains("ms") && weights["ms"].is_number()) rec.attach_ms = weights["ms"].get<int64_t>();
  } else {
    rec.result = "miss";
    rec.miss_reason = weights.value("miss_reason", "unknown");
    if (weights.contains("diffs")) rec.diff_json = weights["diffs"].dump();
    if (weights.contains("ms") && weights["ms"].is_number()) rec.load_ms = weights["ms"].get<int64_t>();
  }
  s.cache_result = rec.result;
  s.cache_reason = rec.miss_reason;
  metrics_.cache_lookups[rec.result]++;
  ledger_->RecordCacheEvent(rec).ok();
}

void Supervisor::Impl::StartProbing(Slot& s) {
  Slot* sp = &s;
  int64_t pid = s.pid;
  auto probe = MakeProbeFromConfig(cfg_, s.port, *http_, clock_);
  s.monitor = std::make_unique<HealthMonitor>(
      &loop_, std::move(probe), HysteresisFromConfig(cfg_, s.name == "a" ? 1 : 2), clock_,
      [this, sp, pid](const HealthTransition& t) {
        Slot& s = *sp;
        if (s.pid != pid) return;
        ProbeTransitionRecord rec;
        rec.time_ms = t.at_ms;
        rec.slot = s.name;
        rec.from_state = HealthName(t.from);
        rec.to_state = HealthName(t.to);
        rec.cause = t.cause;
        ledger_->RecordProbeTransition(rec).ok();
        if (t.to == Health::kHealthy) {
          s.semantic_ready = true;
          Fire(s, SlotEvent::kProbePass, t.cause);
        } else if (t.to == Health::kUnhealthy) {
          s.semantic_ready = false;
          Fire(s, SlotEvent::kProbeTrip, t.cause);
        }
      },
      [this, sp, pid](const ProbeOutcome& o) {
        Slot& s = *sp;
        if (s.pid != pid) return;
        s.last_probe_reason = o.reason;
        s.last_probe_ms = o.latency_ms;
        metrics_.ObserveProbe(s.name, o.ok, o.latency_ms);
      });
  s.monitor->Start();
}

void Supervisor::Impl::Fire(Slot& s, SlotEvent event, const std::string& cause) {
  auto t = NextTransition(s.state, event);
  if (!t) {
    spdlog::debug("engine {}: event {} ignored in state {} ({})", s.name, SlotEventName(event),
                  SlotStateName(s.state), cause);
    return;
  }
  spdlog::info("engine {}: {} --{}--> {} [{}] {}", s.name, SlotStateName(t->from), SlotEventName(event),
               SlotStateName(t->to), SlotActionName(t->action), cause);
  s.state = t->to;
  Apply(s, t->action, cause);
  if (s.state == SlotState::kStandby && !s.recovery_cause.empty()) {
    // Proven ready again: one recovery row with the engine's own phases.
    RecoveryRecord rec;
    rec.failover_id = s.recovery_failover_id;
    rec.slot = s.name;
    rec.cause = s.recovery_cause;
    rec.fault_ms = s.recovery_fault_ms;
    rec.ready_ms = clock_.WallMs();
    rec.cache_result = s.cache_result.empty() ? (cfg_.weight_cache.mode == CacheMode::kOff ? "off" : "miss")
                                              : s.cache_result;
    rec.cache_reason = s.cache_reason;
    if (s.last_status.contains("phases")) rec.phases_json = s.last_status["phases"].dump();
    ledger_->RecordRecovery(rec).ok();
    metrics_.ObserveRecovery((rec.ready_ms - rec.fault_ms) / 1000.0);
    s.recovery_cause.clear();
    s.recovery_failover_id.reset();
  }
  MaybePromote();
  PushRoutes();
  SaveState();
  UpdateStatusLine();
}

void Supervisor::Impl::Apply(Slot& s, SlotAction action, const std::string& cause) {
  switch (action) {
    case SlotAction::kNone:
      break;
    case SlotAction::kStartProbing:
      s.poll.Stop();
      StartProbing(s);
      break;
    case SlotAction::kRouteHere:
    case SlotAction::kRouteAway:
      PushRoutes();
      break;
    case SlotAction::kKillGroup:
      s.poll.Stop();
      if (s.monitor) s.monitor->Stop();
      if (s.pid > 0) SignalGroup(s.pid, SIGKILL).ok();
      break;
    case SlotAction::kTerminate:
      s.poll.Stop();
      if (s.monitor) s.monitor->Stop();
      if (s.pid > 0) {
        SignalGroup(s.pid, SIGTERM).ok();
        pid_t pid = s.pid;
        s.stop_timer.Start(cfg_.engine.stop_timeout_ms, [pid] { SignalGroup(pid, SIGKILL).ok(); });
      }
      break;
    case SlotAction::kScheduleRestart:
      ScheduleRestart(s);
      break;
    case SlotAction::kFailover: {
      if (s.monitor) s.monitor->Stop();
      bool drill = s.drill_kill;
      int64_t fault = drill ? s.drill_fault_ms : clock_.WallMs();
      std::string trigger = drill ? "drill" : (cause.find("probe") != std::string::npos ||
                                                       cause.find("failure") != std::string::npos
                                                   ? "probe"
                                                   : "crash");
      if (s.pid > 0 && ProcessAlive(s.pid)) SignalGroup(s.pid, SIGKILL).ok();
      Failover(s, trigger, cause, fault, drill);
      break;
    }
  }
}

void Supervisor::Impl::OnEngineDying(Slot& s, pid_t pid) {
  if (s.lifeline) s.lifeline->Close();
  s.lifeline = nullptr;
  if (s.pid != pid) return;
  if (s.state == SlotState::kStarting) {
    // Not ready yet: the engine may have closed inherited fds itself. Its
    // exit, when it comes, is still seen through the pidfd.
    spdlog::info("engine {}: pid {} closed its lifeline while starting; its exit will be seen when it is reaped",
                 s.name, pid);
    return;
  }
  s.semantic_ready = false;
  s.comm_warm = false;
  Fire(s, SlotEvent::kDying, "pid " + std::to_string(pid) + " is exiting (its lifeline closed)");
}

void Supervisor::Impl::OnEngineExit(Slot& s, const ExitInfo& info) {
  if (s.watch) s.watch->Close();
  s.watch = nullptr;
  if (s.lifeline) s.lifeline->Close();
  s.lifeline = nullptr;
  s.semantic_ready = false;
  s.comm_warm = false;
  s.poll.Stop();
  s.stop_timer.Stop();
  if (s.monitor) s.monitor->Stop();
  std::string why = "pid " + std::to_string(s.pid) + " " + info.Describe();
  if (info.known && info.exit_code == kExitConfig) {
    s.permanent_failure = true;
    s.failure_reason = "engine " + s.name + " exited with " + std::to_string(kExitConfig) +
                       " (configuration cannot work); see " +
                       JoinPath(cfg_.node.state_dir, "logs/engine-" + s.name + ".log");
  }
  s.pid = 0;
  Fire(s, SlotEvent::kExited, why);
  SaveState();
  if (stopping_) MaybeFinishStop();
}

void Supervisor::Impl::ScheduleRestart(Slot& s) {
  if (stopping_ || s.state != SlotState::kFailed) return;
  if (s.pid > 0) return;  // wait for the exit; OnEngineExit calls back here
  int64_t now = clock_.MonotonicMs();
  while (!s.restarts.empty() && now - s.restarts.front() > cfg_.supervisor.restart_window_ms) s.restarts.pop_front();
  if (s.permanent_failure || static_cast<int>(s.restarts.size()) >= cfg_.supervisor.max_restarts) {
    degraded_ = true;
    degraded_reason_ = s.permanent_failure
                           ? s.failure_reason
                           : "engine " + s.name + " failed " + std::to_string(s.restarts.size()) + " times in " +
                                 std::to_string(cfg_.supervisor.restart_window_ms / 1000) +
                                 " s; not restarting it (see its log in " +
                                 JoinPath(cfg_.node.state_dir, "logs/engine-" + s.name + ".log") + ")";
    spdlog::error("{}", degraded_reason_);
    UpdateStatusLine();
    return;
  }
  // The first restart after a quiet period is immediate: that is the re-arm
  // of a standby after a failover. Repeated failures back off.
  s.backoff_ms = s.restarts.empty() ? 0
                                    : std::min<int64_t>(std::max<int64_t>(cfg_.supervisor.restart_backoff_ms,
                                                                          s.backoff_ms * 2),
                                                        cfg_.supervisor.restart_backoff_max_ms);
  s.restarts.push_back(now);
  if (s.recovery_cause.empty()) {
    s.recovery_cause = "restart";
    s.recovery_fault_ms = clock_.WallMs();
  }
  Slot* sp = &s;
  spdlog::info("engine {}: restarting in {} ms", s.name, s.backoff_ms);
  s.restart_timer.Start(s.backoff_ms, [this, sp] {
    if (sp->state == SlotState::kFailed) SpawnEngine(*sp);
  });
}

void Supervisor::Impl::Failover(Slot& failed, const std::string& trigger, const std::string& reason,
                                int64_t fault_ms, bool drill) {
  int64_t detected = clock_.WallMs();
  Slot* to = Other(&failed);
  std::string to_name = to->state == SlotState::kStandby ? to->name : "";
  if (to->state == SlotState::kStandby) {
    auto t = NextTransition(to->state, SlotEvent::kPromote);
    spdlog::info("engine {}: {} --promote--> {} (failover from {})", to->name, SlotStateName(to->state),
                 SlotStateName(t->to), failed.name);
    to->state = t->to;
  }
  PushRoutes();
  int64_t swapped = clock_.WallMs();
  FailoverRecord rec;
  rec.trigger = trigger;
  rec.reason = reason;
  rec.drill = drill;
  rec.from_slot = failed.name;
  rec.to_slot = to_name.empty() ? "none" : to_name;
  rec.fault_ms = fault_ms;
  rec.detected_ms = detected;
  rec.swapped_ms = swapped;
  auto id = ledger_->RecordFailover(rec);
  metrics_.failovers[trigger]++;
  failed.recovery_cause = trigger;
  failed.recovery_fault_ms = fault_ms;
  if (id.ok()) failed.recovery_failover_id = *id;
  spdlog::warn("failover {} -> {} ({}: {}): detected {} ms after the fault, swapped {} ms later", failed.name,
               rec.to_slot, trigger, reason, detected - fault_ms, swapped - detected);
  if (to_name.empty()) {
    spdlog::error("no proven standby to take over; requests wait in the front until an engine is ready");
  }
  // Re-arm: a new standby in the failed slot. A hung engine is being killed;
  // its exit event schedules the restart instead.
  if (failed.pid == 0) ScheduleRestart(failed);
  std::vector<std::shared_ptr<JsonConn>> waiters;
  if (pending_) waiters = std::move(pending_->waiters);
  pending_ = PendingFailover{id.ok() ? *id : 0, failed.name, to_name, fault_ms, detected, swapped, std::move(waiters),
                             drill};
  if (!to_name.empty()) {
    ProbeThroughFront([this](bool ok, int64_t at) {
      if (ok) CompletePending(at);
    }, 200);
  }
}

void Supervisor::Impl::CompletePending(int64_t first_ok_ms) {
  if (!pending_) return;
  PendingFailover p = std::move(*pending_);
  pending_.reset();
  if (p.id) ledger_->SetFailoverFirstOk(p.id, first_ok_ms).ok();
  json reply{{"type", "failover"},
             {"ok", true},
             {"from_slot", p.from},
             {"to_slot", p.to},
             {"fault_ms", p.fault_ms},
             {"swap_ms", p.swapped_ms - p.fault_ms},
             {"first_ok_ms", first_ok_ms - p.fault_ms},
             {"failover_id", p.id}};
  for (auto& c : p.waiters) {
    if (c->alive()) c->Send(reply);
  }
}

void Supervisor::Impl::ProbeThroughFront(std::function<void(bool, int64_t)> done, int attempts_left) {
  SemanticProbeSpec spec;
  spec.prompt = cfg_.probe.prompt;
  spec.expect = cfg_.probe.expect;
  spec.expect_token_ids = cfg_.probe.expect_token_ids;
  spec.max_tokens = cfg_.probe.max_tokens;
  spec.timeout_ms = std::max<int64_t>(cfg_.probe.timeout_ms, 1000);
  http::ClientRequest req;
  req.method = "POST";
  req.target = "/v1/completions";
  req.headers.push_back({"Content-Type", "application/json"});
  req.body = SemanticRequestBody(spec);
  req.timeout_ms = spec.timeout_ms + cfg_.front.queue_timeout_ms;
  int64_t start = clock_.MonotonicMs();
  std::string host = cfg_.front.listen.host == "0.0.0.0" ? "127.0.0.1"
                     : cfg_.front.listen.host == "::"    ? "::1"
                                                         : cfg_.front.listen.host;
  http_->Send(host, front_port_, std::move(req),
              [this, spec, start, done = std::move(done), attempts_left](Result<http::HttpResponse> r) mutable {
                int64_t lat = clock_.MonotonicMs() - start;
                ProbeOutcome o = EvaluateCompletion(spec, r, lat);
                if (o.ok) {
                  done(true, clock_.WallMs());
                  return;
                }
                if (attempts_left <= 1 || stopping_) {
                  spdlog::warn("probe through the front failed: {}", o.reason);
                  done(false, 0);
                  return;
                }
                auto* t = new LoopTimer(&loop_);
                t->Start(10, [this, t, done = std::move(done), attempts_left]() mutable {
                  ProbeThroughFront(std::move(done), attempts_left - 1);
                  // Deleting the timer inside its own callback is safe: the
                  // handle is freed in its close callback.
                  delete t;
                });
              });
}

void Supervisor::Impl::MaybePromote() {
  if (stopping_ || adopting_ || Active()) return;
  // Pending failovers promote in Failover(); here: the first proven engine
  // at start, or the re-armed one after a failover that had no standby.
  for (Slot* s : {&a_, &b_}) {
    if (s->state == SlotState::kStandby) {
      auto t = NextTransition(s->state, SlotEvent::kPromote);
      spdlog::info("engine {}: standby --promote--> active (no active engine)", s->name);
      s->state = t->to;
      PushRoutes();
      if (pending_ && pending_->to.empty()) {
        pending_->to = s->name;
        pending_->swapped_ms = clock_.WallMs();
      }
      ProbeThroughFront(
          [this](bool ok, int64_t at) {
            if (!ok) return;
            if (pending_) CompletePending(at);
            if (!ready_notified_) {
              ready_notified_ = true;
              notifier_.Ready("serving: active engine proven through the front");
              spdlog::info("serving: the active engine answered the probe through the front");
            }
            UpdateStatusLine();
          },
          200);
      return;
    }
  }
}

// ------------------------------------------------------------------ state

void Supervisor::Impl::SaveState() {
  // The file is for a restarted supervisor; writing it (with an fsync) must
  // never sit between a fault and the swap. Snapshot now, write on the
  // thread pool, one write at a time, the latest snapshot winning.
  pending_state_ = BuildState().ToJson();
  if (state_write_in_flight_) return;
  WriteStateAsync();
}

void Supervisor::Impl::WriteStateAsync() {
  if (!pending_state_) return;
  struct Work {
    uv_work_t req;
    Impl* self;
    std::string path;
    std::string text;
    Status status;
  };
  auto* w = new Work{{}, this, RuntimeState::PathIn(cfg_.node.runtime_dir), std::move(*pending_state_), {}};
  pending_state_.reset();
  state_write_in_flight_ = true;
  w->req.data = w;
  uv_queue_work(
      &loop_, &w->req,
      [](uv_work_t* r) {
        auto* w = static_cast<Work*>(r->data);
        w->status = WriteFileAtomic(w->path, w->text, 0600);
      },
      [](uv_work_t* r, int) {
        std::unique_ptr<Work> w(static_cast<Work*>(r->data));
        if (!w->status.ok()) spdlog::error("{}", w->status.error().message());
        w->self->state_write_in_flight_ = false;
        if (w->self->stopping_ && w->self->state_removed_) {
          ::unlink(w->path.c_str());
          return;
        }
        w->self->WriteStateAsync();
      });
}

RuntimeState Supervisor::Impl::BuildState() {
  RuntimeState st;
  st.config_path = cfg_.path;
  st.node_name = cfg_.node.name;
  st.supervisor = ProcessRef{::getpid(), ProcessStartTime(::getpid()).ok() ? *ProcessStartTime(::getpid()) : 0};
  st.epoch = epoch_;
  if (front_pid_ > 0) {
    st.front = RuntimeState::Front{ProcessRef{front_pid_, front_start_time_}, front_control_path_,
                                   Addr(cfg_.front.listen.host, front_port_)};
  }
  for (const auto& h : holders_) {
    if (h->pid > 0) st.holders.push_back({h->rank, ProcessRef{h->pid, h->start_time}, h->socket, h->record_path});
  }
  for (Slot* s : {&a_, &b_}) {
    if (s->pid <= 0) continue;
    std::string role = s->state == SlotState::kActive    ? "active"
                       : s->state == SlotState::kStandby ? "standby"
                                                         : SlotStateName(s->state);
    st.engines.push_back({s->name, ProcessRef{s->pid, s->start_time}, s->port, role, s->spawned_ms, s->cache_result});
  }
  return st;
}

void Supervisor::Impl::UpdateStatusLine() {
  Slot* act = Active();
  std::string line = NodeState();
  line += act ? ": active " + act->name : ": no active engine";
  for (Slot* s : {&a_, &b_}) line += ", " + s->name + " " + SlotStateName(s->state);
  if (degraded_) line += " (" + degraded_reason_ + ")";
  notifier_.Status(line);
  metrics_.SetSlots(a_.name, SlotStateName(a_.state), a_.semantic_ready, b_.name, SlotStateName(b_.state),
                    b_.semantic_ready);
}

// ------------------------------------------------------------------ control

json Supervisor::Impl::StatusJson() {
  json j;
  j["type"] = "status";
  j["node"] = cfg_.node.name;
  j["state"] = NodeState();
  if (degraded_) j["degraded_reason"] = degraded_reason_;
  Slot* act = Active();
  j["active"] = act ? json(act->name) : json(nullptr);
  j["engines"] = json::array();
  for (Slot* s : {&a_, &b_}) {
    std::string role = s->state == SlotState::kActive    ? "active"
                       : s->state == SlotState::kStandby ? "standby"
                                                         : "none";
    json e{{"slot", s->name},
           {"role", role},
           {"state", SlotStateName(s->state)},
           {"pid", s->pid},
           {"port", s->port},
           {"semantic_ready", s->semantic_ready},
           {"comm_warm", s->comm_warm},
           {"cache", s->cache_result},
           {"last_probe_ms", s->last_probe_ms},
           {"last_probe_error", s->last_probe_reason},
           {"restarts", s->restarts.size()}};
    if (s->permanent_failure) e["failure"] = s->failure_reason;
    j["engines"].push_back(e);
  }
  j["holders"] = json::array();
  for (const auto& h : holders_) {
    j["holders"].push_back({{"rank", h->rank},
                            {"pid", h->pid},
                            {"socket", h->socket},
                            {"ready", h->ready},
                            {"kept_fds", h->kept ? h->kept->fds.size() : 0},
                            {"restarts", h->restarts}});
  }
  j["front"] = {{"listen", Addr(cfg_.front.listen.host, front_port_)},
                {"pid", front_pid_},
                {"restarts", front_restarts_},
                {"epoch", epoch_}};
  j["state_dir"] = cfg_.node.state_dir;
  j["ledger"] = ledger_->path();
  j["admin"] = Addr(cfg_.admin.listen.host, admin_ ? admin_->port() : 0);
  return j;
}

void Supervisor::Impl::OnControl(const std::shared_ptr<JsonConn>& c, const json& msg) {
  std::string type = msg.value("type", "");
  if (type == "status") {
    c->Send(StatusJson());
  } else if (type == "failover") {
    if (!msg.value("drill", false)) {
      c->Send(json{{"type", "error"},
                   {"message", "only drills can be asked for: send {\"type\":\"failover\",\"drill\":true}"}});
      return;
    }
    Drill(c, msg.value("kill", false));
  } else if (type == "stop") {
    stop_waiters_.push_back(c);
    BeginStop("wsup stop", 0);
  } else {
    c->Send(json{{"type", "error"},
                 {"message", "unknown request type '" + type + "'; use status, failover or stop"}});
  }
}

void Supervisor::Impl::Drill(const std::shared_ptr<JsonConn>& c, bool kill) {
  Slot* act = Active();
  Slot* stby = act ? Other(act) : nullptr;
  if (!act || stby->state != SlotState::kStandby || pending_) {
    c->Send(json{{"type", "failover"},
                 {"ok", false},
                 {"error", !act ? "no active engine to fail over from"
                           : pending_ ? "a failover is still in progress; try again when it completes"
                                      : "the standby (" + stby->name + ") is " + SlotStateName(stby->state) +
                                            ", not proven ready; wait for `wsup status` to show it semantically ready"}});
    return;
  }
  if (kill) {
    act->drill_kill = true;
    act->drill_fault_ms = clock_.WallMs();
    pending_ = PendingFailover{};
    pending_->waiters.push_back(c);
    pending_->drill = true;
    // The exit event drives the failover exactly as a real crash would.
    SignalGroup(act->pid, SIGKILL).ok();
    // Failover() replaces pending_ but keeps its waiters.
    return;
  }
  // Planned: the standby takes new traffic at once; the old active drains,
  // then becomes the standby.
  int64_t fault = clock_.WallMs();
  auto pt = NextTransition(stby->state, SlotEvent::kPromote);
  stby->state = pt->to;
  Fire(*act, SlotEvent::kDemote, "planned drill");
  int64_t swapped = clock_.WallMs();
  FailoverRecord rec;
  rec.trigger = "drill";
  rec.reason = "planned swap";
  rec.drill = true;
  rec.from_slot = act->name;
  rec.to_slot = stby->name;
  rec.fault_ms = fault;
  rec.detected_ms = fault;
  rec.swapped_ms = swapped;
  auto id = ledger_->RecordFailover(rec);
  metrics_.failovers["drill"]++;
  pending_ = PendingFailover{id.ok() ? *id : 0, act->name, stby->name, fault, fault, swapped, {c}, true};
  ProbeThroughFront([this](bool ok, int64_t at) {
    if (ok) CompletePending(at);
  }, 200);
  FinishDrain(*act, c, clock_.MonotonicMs());
}

void Supervisor::Impl::FinishDrain(Slot& old, std::shared_ptr<JsonConn> c, int64_t started_mono) {
  if (old.state != SlotState::kDraining) return;
  Slot* op = &old;
  std::string addr = Addr(cfg_.engine.host, old.port);
  auto decide = [this, op, c, started_mono, addr](int64_t inflight) {
    if (inflight == 0 || clock_.MonotonicMs() - started_mono > kDrainBudgetMs) {
      Fire(*op, SlotEvent::kDrained,
           inflight == 0 ? "no request in flight" : "drain budget of 30 s ran out with requests in flight");
      return;
    }
    auto* t = new LoopTimer(&loop_);
    t->Start(kDrainPollMs, [this, t, op, c, started_mono] {
      FinishDrain(*op, c, started_mono);
      delete t;
    });
  };
  if (!front_link_) {
    decide(0);
    return;
  }
  // Ask the front how many requests it still has on the old engine.
  JsonConn::Connect(&loop_, front_control_path_, 1 << 20, [decide, addr](Result<std::shared_ptr<JsonConn>> r) {
    if (!r.ok()) {
      decide(0);
      return;
    }
    auto conn = *r;
    conn->Start(
        [decide, addr](const std::shared_ptr<JsonConn>& self, const json& m) {
          if (m.value("type", "") == "event") return;
          int64_t n = 0;
          if (m.contains("inflight") && m["inflight"].is_object()) n = m["inflight"].value(addr, int64_t{0});
          self->Close("done");
          decide(n);
        },
        [](const std::string&) {});
    conn->Send(json{{"type", "status"}});
  });
}

// ------------------------------------------------------------------ metrics

void Supervisor::Impl::OnAdmin(std::shared_ptr<http::ResponseWriter> w) {
  const auto& req = w->request();
  if (req.path == "/metrics") {
    auto resp = http::HttpResponse::Text(200, metrics_.Render());
    for (auto& h : resp.headers) {
      if (http::HeaderNameEquals(h.name, "Content-Type")) h.value = "text/plain; version=0.0.4";
    }
    w->Send(std::move(resp));
  } else if (req.path == "/status") {
    w->Send(http::HttpResponse::Json(200, StatusJson().dump()));
  } else {
    w->Send(http::HttpResponse::Json(404, http::ErrorJson("no such path; try /metrics or /status", "not_found")));
  }
}

// ------------------------------------------------------------------ stop

void Supervisor::Impl::BeginStop(const std::string& why, int exit_code) {
  if (stopping_) return;
  stopping_ = true;
  exit_code_ = exit_code;
  spdlog::info("stopping: {}", why);
  notifier_.Stopping();
  for (Slot* s : {&a_, &b_}) {
    s->restart_timer.Stop();
    Fire(*s, SlotEvent::kStop, why);
  }
  if (front_pid_ > 0) SignalGroup(front_pid_, SIGTERM).ok();
  for (auto& h : holders_) {
    h->restart_timer.Stop();
    if (h->pid > 0) SignalGroup(h->pid, SIGTERM).ok();
  }
  MaybeFinishStop();
}

void Supervisor::Impl::MaybeFinishStop() {
  if (!stopping_) return;
  if (a_.pid > 0 || b_.pid > 0 || front_pid_ > 0) return;
  for (auto& h : holders_) {
    if (h->pid > 0) return;
  }
  // A clean stop leaves nothing to adopt.
  state_removed_ = true;
  pending_state_.reset();
  ::unlink(RuntimeState::PathIn(cfg_.node.runtime_dir).c_str());
  for (auto& c : stop_waiters_) {
    if (c->alive()) c->Send(json{{"type", "stop"}, {"ok", true}});
  }
  stop_waiters_.clear();
  // Everything below closes handles; the loop ends when the last is closed.
  auto* t = new LoopTimer(&loop_);
  t->Start(20, [this, t] {
    delete t;
    ledger_->Close();
    http_->CancelAll();
    if (control_) control_->Close();
    if (admin_) admin_->Close();
    if (front_link_) front_link_->Close("stopping");
    watchdog_.Stop();
    uv_close(reinterpret_cast<uv_handle_t*>(&sigterm_), nullptr);
    uv_close(reinterpret_cast<uv_handle_t*>(&sigint_), nullptr);
    uv_close(reinterpret_cast<uv_handle_t*>(&sigpipe_), nullptr);
    for (Slot* s : {&a_, &b_}) s->monitor.reset();
    for (auto& h : holders_) h->kept.reset();
    uv_stop(&loop_);
  });
}

int Supervisor::Impl::Run() {
  uv_run(&loop_, UV_RUN_DEFAULT);
  // Close whatever is left (timers owned by slots are closed by destructors
  // below through LoopTimer; run the loop once more for their callbacks).
  return exit_code_;
}

// ------------------------------------------------------------------ facade

Supervisor::Supervisor(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Supervisor::~Supervisor() = default;

Result<std::unique_ptr<Supervisor>> Supervisor::Create(Config config, SupervisorOptions options) {
  auto impl = std::make_unique<Impl>(std::move(config), std::move(options));
  Status st = impl->Start();
  if (!st.ok()) return st.error();
  return std::unique_ptr<Supervisor>(new Supervisor(std::move(impl)));
}

int Supervisor::Run() { return impl_->Run(); }

}  // namespace wsup
