// The supervisor's start, preflight and stop, and the loop's lifetime. The
// rest of Supervisor::Impl is in the files named in supervisor_impl.h.
#include "supervisor/supervisor.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <initializer_list>

#include "common/fs.h"
#include "common/log.h"
#include "supervisor/preflight.h"
#include "supervisor/supervisor_impl.h"

namespace wsup {

using nlohmann::json;

std::string HostPortString(const std::string& host, int port) {
  return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

RestartPolicy HolderRestartPolicy(const Config& cfg) {
  RestartPolicy p = EngineRestartPolicy(cfg);
  // The holder refuses a checkpoint it cannot serve (3), bad flags (2) and
  // a configuration that cannot work (78): the same command fails again.
  p.permanent_exit_codes = {kExitUsage, kExitRefused, kExitConfig};
  return p;
}

RestartPolicy FrontRestartPolicy(const Config& cfg) {
  RestartPolicy p = EngineRestartPolicy(cfg);
  // Nothing is served without a front: a crash loop is throttled and
  // reported, never left down, unless the front says its configuration
  // cannot work.
  p.give_up = false;
  p.permanent_exit_codes = {kExitUsage, kExitConfig};
  return p;
}

Supervisor::Impl::LoopBox::LoopBox(void* owner) {
  uv_loop_init(&loop);
  loop.data = owner;
}

Supervisor::Impl::LoopBox::~LoopBox() {
  uv_walk(&loop, [](uv_handle_t* h, void*) { if (!uv_is_closing(h)) uv_close(h, nullptr); }, nullptr);
  uv_run(&loop, UV_RUN_DEFAULT);
  if (uv_loop_close(&loop) != 0) spdlog::warn("the supervisor's loop closed with handles still open");
}

Supervisor::Impl::Impl(Config config, SupervisorOptions options)
    : cfg_(std::move(config)),
      opts_(std::move(options)),
      clock_(*opts_.clock),
      loop_box_(this),
      timers_(opts_.timers ? *opts_.timers : own_timers_),
      launcher_(opts_.launcher ? *opts_.launcher : RealLauncher()),
      http_(std::make_unique<http::HttpClient>(&loop_)),
      surface_(&loop_, metrics_, ControlHooks()),
      watchdog_(timers_.Make()),
      engines_(&loop_, launcher_, timers_, clock_, cfg_, *http_, metrics_, EngineHooks()),
      holders_(&loop_, launcher_, timers_, clock_, cfg_, opts_.bin_dir, HolderHooks()),
      front_(&loop_, launcher_, timers_, clock_, cfg_, opts_.bin_dir, FrontHooks()),
      silence_(timers_, SilenceHooks()),
      front_probe_(timers_, clock_, FrontProbeHooks()),
      failover_(timers_, clock_, FailoverHooks()),
      rollout_(timers_, clock_, cfg_, RolloutHooks()),
      reloader_(cfg_, clock_, ReloaderHooks()),
      kv_(cfg_, clock_, metrics_, KvPoolHooks()),
      health_(HealthHooks()) {
  SubscribeToEngines();
}

HolderSet::Hooks Supervisor::Impl::HolderHooks() {
  HolderSet::Hooks h;
  h.stopping = [this] { return stopping_; };
  h.fatal = [this](const std::string& why, int exit_code) { BeginStop(why, exit_code); };
  h.save_state = [this] { SaveState(); };
  h.all_ready = [this] { engines_.Start(); };
  h.restarted = [this](const HolderRestartRecord& rec) {
    ledger_.Check(ledger_.ledger().RecordHolderRestart(rec), "holder restart");
    metrics_.holder_restarts++;
  };
  h.down = [this](const std::string& why) { health_.SetDegraded(why); };
  h.store_fds = [this](const std::string& name, const std::vector<int>& fds) {
    Logged(notifier_.StoreFds(name, fds), "storing the arena fds");
  };
  h.exited = [this] {
    if (stopping_) MaybeFinishStop();
  };
  return h;
}

void Supervisor::Impl::After(int64_t ms, std::function<void()> cb) {
  later_.After(ms, std::move(cb));
}

Supervisor::Impl::~Impl() {
  // Stop watching processes (they keep running: stop or crash, that is the
  // contract) and release every handle owner while the loop can still run
  // their close callbacks.
  engines_.Close();
  kv_.Close();
  holders_.Detach();
  front_.Detach("supervisor exiting");
  surface_.Close();
  if (http_) http_->CancelAll();
  watchdog_->Stop();
  // Still open in a supervisor destroyed without a stop (a test that drives its loop).
  signals_.Close();
  uv_run(&loop_, UV_RUN_DEFAULT);
  surface_.Release();
  http_.reset();
  uv_run(&loop_, UV_RUN_NOWAIT);
  ledger_.Close();
}

Status Supervisor::Impl::PrepareDirs() {
  // Checked before (CheckConfigPaths); a folder that still cannot be made
  // (another process changed it meanwhile) is a configuration that cannot
  // work all the same: exit 78, located at its key, never a restart loop.
  auto located = [this](const char* key, const Status& st) -> Status {
    if (st.ok()) return st;
    auto where = cfg_.where.find(key);
    return InvalidArgument((where == cfg_.where.end() ? cfg_.path + ":1:1" : where->second) + ": " + key + ": " +
                           st.error().message() + "; choose a folder this user can write");
  };
  // The ledger and the logs hold what the node did (and engine.env's names):
  // no other local user may read them.
  const std::string logs = JoinPath(cfg_.node.state_dir, "logs");
  for (const auto& [dir, what] : {std::pair{cfg_.node.state_dir, std::string("node.state_dir")},
                                  std::pair{logs, std::string("node.state_dir (its logs folder)")}}) {
    auto tightened = MakePrivateDir(dir, what);
    if (!tightened.ok()) return located("node.state_dir", Status(tightened.error()));
    if (*tightened) spdlog::warn("{} {}: other users could read it; made it private (mode 0700)", what, dir);
  }
  WSUP_RETURN_IF_ERROR(located("node.runtime_dir", MakeDirs(cfg_.node.runtime_dir, 0700)));
  if (::chmod(cfg_.node.runtime_dir.c_str(), 0700) != 0) {
    return located("node.runtime_dir",
                   ErrnoError(cfg_.node.runtime_dir + ": cannot make it private (chmod 0700)", errno));
  }
  return Status::Ok();
}

Status Supervisor::Impl::CheckPaths() {
  // What the config names on this machine: a missing model folder or engine
  // program, a tp the model cannot be split by, an unusable state folder
  // is a configuration that cannot work, said once, located, before
  // anything is made or started.
  auto problems = CheckConfigPaths(cfg_, JoinPath(opts_.bin_dir, "wsup-holder"));
  if (problems.empty()) return Status::Ok();
  std::string all;
  for (const auto& e : problems) all += (all.empty() ? "" : "\n") + e.message();
  return InvalidArgument(all);
}

Status Supervisor::Impl::Start() {
  WSUP_RETURN_IF_ERROR(CheckPaths());
  WSUP_RETURN_IF_ERROR(PrepareDirs());
  if (cfg_.weight_cache.layout == CacheLayout::kEngine) {
    // Kept layouts are up to 4096 fds each, and a holder restart passes
    // each one twice at once: the hard limit is ours to take.
    rlimit lim{};
    if (::getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
      lim.rlim_cur = lim.rlim_max;
      if (::setrlimit(RLIMIT_NOFILE, &lim) != 0) {
        spdlog::warn("cannot raise the open-file limit ({}); fewer engine-made layouts can be kept across a "
                     "holder crash",
                     strerror(errno));
      }
    }
  }

  // What a predecessor left: a live supervisor refuses this start; live
  // children are adopted; their ports are ours, not in the way.
  std::string path = RuntimeState::PathIn(cfg_.node.runtime_dir);
  std::optional<RuntimeState> prev;
  auto loaded = RuntimeState::Load(path);
  if (loaded.ok()) {
    prev = std::move(*loaded);
  } else {
    spdlog::warn("{}; starting clean", loaded.error().message());
  }
  if (prev && prev->supervisor.pid != ::getpid() && prev->supervisor.StillRunning()) {
    return Refused("another supervisor (pid " + std::to_string(prev->supervisor.pid) + ") runs node '" +
                   cfg_.node.name + "' from " + path + "; stop it with `wsup stop` first");
  }

  WSUP_RETURN_IF_ERROR(ledger_.Open(cfg_.node.state_dir));

  WSUP_RETURN_IF_ERROR(surface_.ListenControl(cfg_.supervisor.control_socket));
  Status as = surface_.ListenAdmin(cfg_.admin.listen.host, cfg_.admin.listen.port);
  if (!as.ok()) return as.error().With("admin.listen " + cfg_.admin.listen.ToString());

  // Ports another process holds, before anything is started: a clash is a
  // configuration error (another node's engines, say), not a crash loop.
  WSUP_RETURN_IF_ERROR(Preflight(prev));

  signals_.On(SIGTERM, [this](int) { BeginStop("SIGTERM", 0); });
  signals_.On(SIGINT, [this](int) { BeginStop("SIGINT", 0); });
  // A vanished peer is an error code on its socket, not a death.
  signals_.On(SIGPIPE, [](int) {});
  // systemd's reload (Type=notify-reload sends SIGHUP): as `wsup reload`.
  signals_.On(SIGHUP, [this](int) { reloader_.Reload(nullptr, "SIGHUP"); });

  int64_t wd = notifier_.WatchdogIntervalMs();
  if (wd > 0) watchdog_->Start(wd / 3, [this] { notifier_.Watchdog(); }, wd / 3);

  spdlog::info("wsup {}: state {}, runtime {}, control {}, admin {}", cfg_.node.name, cfg_.node.state_dir,
               cfg_.node.runtime_dir, cfg_.supervisor.control_socket, surface_.admin_port());
  // From here on a failure stops what was started (BeginStop) instead of
  // returning: a failed start leaves nothing behind.
  Status st = AdoptOrStart(std::move(prev));
  if (!st.ok()) {
    spdlog::error("{}", st.error().message());
    BeginStop(st.error().message(), kExitConfig);
  }
  return Status::Ok();
}

Status Supervisor::Impl::Preflight(const std::optional<RuntimeState>& prev) {
  // Ports held by this node's own live processes (about to be adopted).
  std::vector<int> ours;
  if (prev) {
    for (const auto& e : prev->engines) {
      if (e.proc.StillRunning()) ours.push_back(e.port);
    }
  }
  std::vector<PortClaim> claims;
  if (cfg_.engine.primary_port != 0) claims.push_back({"engine.primary_port", cfg_.engine.host, cfg_.engine.primary_port});
  if (cfg_.engine.standby_port != 0) claims.push_back({"engine.standby_port", cfg_.engine.host, cfg_.engine.standby_port});
  bool front_adoptable = prev && prev->front && prev->front->proc.StillRunning();
  WSUP_RETURN_IF_ERROR(CheckPortsFree(claims, ours));
  if (!front_adoptable) {
    // Bound now and kept: the front starts on this socket, and a restarted
    // front on the same one.
    WSUP_RETURN_IF_ERROR(front_.Bind());
  }
  return Status::Ok();
}

// ------------------------------------------------------------------ stop

void Supervisor::Impl::BeginStop(const std::string& why, int exit_code) {
  if (stopping_) return;
  stopping_ = true;
  exit_code_ = exit_code;
  spdlog::info("stopping: {}", why);
  notifier_.Stopping();
  rollout_.Abort("the node is stopping: " + why);
  for (Slot* s : engines_.slots()) {
    s->restart_timer->Stop();
    engines_.Fire(*s, SlotEvent::kStop, why);
  }
  front_.Stop(why);
  holders_.Stop(why);
  MaybeFinishStop();
}

void Supervisor::Impl::MaybeFinishStop() {
  if (!stopping_) return;
  if (engines_.AnyProcess() || front_.has_process() || holders_.AnyProcess()) return;
  // A clean stop leaves nothing to adopt.
  std::string state_path = RuntimeState::PathIn(cfg_.node.runtime_dir);
  if (::unlink(state_path.c_str()) != 0 && errno != ENOENT) {
    spdlog::warn("{}: cannot remove ({}); the next start finds nothing of it running and starts clean", state_path,
                 strerror(errno));
  }
  for (auto& c : stop_waiters_) {
    if (c->alive()) c->Send(json{{"type", "stop"}, {"ok", true}});
  }
  stop_waiters_.clear();
  // Everything below closes handles; the loop ends when the last is closed.
  After(20, [this] {
    ledger_.Close();
    http_->CancelAll();
    surface_.Close();
    front_.CloseLink("stopping");
    watchdog_->Stop();
    signals_.Close();
    engines_.StopProbing();
    kv_.Close();
    holders_.ReleaseKept();  // the holders have stopped
    finished_ = true;
    uv_stop(&loop_);
  });
}

int Supervisor::Impl::Run() {
  uv_run(&loop_, UV_RUN_DEFAULT);
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
bool Supervisor::Step() { return impl_->Step(); }
int Supervisor::ExitCode() const { return impl_->ExitCode(); }
std::string Supervisor::StatusJson() const { return impl_->StatusText(); }

bool Supervisor::Impl::Step() {
  if (finished_) return false;
  uv_run(&loop_, UV_RUN_NOWAIT);
  return !finished_;
}

}  // namespace wsup
