// The node's owners built on one loop, the start's order, and the loop's
// lifetime (node.h).
#include "supervisor/node.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>

#include "common/fs.h"
#include "common/log.h"
#include "supervisor/preflight.h"

namespace wsup {

void LogFailure(const Status& st, const char* what) {
  if (!st.ok()) spdlog::warn("{}: {}", what, st.error().message());
}

Node::LoopBox::LoopBox(void* owner) {
  uv_loop_init(&loop);
  loop.data = owner;
}

Node::LoopBox::~LoopBox() {
  uv_walk(&loop, [](uv_handle_t* h, void*) { if (!uv_is_closing(h)) uv_close(h, nullptr); }, nullptr);
  uv_run(&loop, UV_RUN_DEFAULT);
  if (uv_loop_close(&loop) != 0) spdlog::warn("the supervisor's loop closed with handles still open");
}

Node::Node(Config config, SupervisorOptions options)
    : cfg_(std::move(config)),
      opts_(std::move(options)),
      clock_(*opts_.clock),
      loop_box_(this),
      timers_(opts_.timers ? *opts_.timers : own_timers_),
      launcher_(opts_.launcher ? *opts_.launcher : RealLauncher()),
      http_(std::make_unique<http::HttpClient>(&loop_)),
      stop_(timers_, StopHooks()),
      surface_(&loop_, metrics_, ControlHooks()),
      watchdog_(timers_.Make()),
      engines_(&loop_, launcher_, timers_, clock_, cfg_, *http_, metrics_, EngineHooks()),
      holders_(&loop_, launcher_, timers_, clock_, cfg_, opts_.bin_dir, HolderHooks()),
      front_(&loop_, launcher_, timers_, clock_, cfg_, opts_.bin_dir, FrontHooks()),
      silence_(timers_, SilenceHooks()),
      front_probe_(timers_, clock_, FrontProbeHooks()),
      promoter_(PromoterHooks()),
      adopter_(clock_, AdopterHooks()),
      failover_(timers_, clock_, FailoverHooks()),
      rollout_(timers_, clock_, cfg_, RolloutHooks()),
      reloader_(cfg_, clock_, ReloaderHooks()),
      kv_(cfg_, clock_, metrics_, KvPoolHooks()),
      health_(HealthHooks()) {
  SubscribeToEngines();
}

Node::~Node() {
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

Status Node::Start() {
  WSUP_RETURN_IF_ERROR(CheckNodePaths(cfg_, JoinPath(opts_.bin_dir, "wsup-holder")));
  WSUP_RETURN_IF_ERROR(PrepareNodeDirs(cfg_));
  if (cfg_.weight_cache.layout == CacheLayout::kEngine) RaiseOpenFileLimit();

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
  WSUP_RETURN_IF_ERROR(CheckEnginePorts(cfg_, prev));
  if (!(prev && prev->front && prev->front->proc.StillRunning())) {
    // Bound now and kept: the front starts on this socket, and a restarted
    // front on the same one.
    WSUP_RETURN_IF_ERROR(front_.Bind());
  }

  signals_.On(SIGTERM, [this](int) { stop_.Begin("SIGTERM", 0); });
  signals_.On(SIGINT, [this](int) { stop_.Begin("SIGINT", 0); });
  // A vanished peer is an error code on its socket, not a death.
  signals_.On(SIGPIPE, [](int) {});
  // systemd's reload (Type=notify-reload sends SIGHUP): as `wsup reload`.
  signals_.On(SIGHUP, [this](int) { reloader_.Reload(nullptr, "SIGHUP"); });

  int64_t wd = notifier_.WatchdogIntervalMs();
  if (wd > 0) watchdog_->Start(wd / 3, [this] { notifier_.Watchdog(); }, wd / 3);

  spdlog::info("wsup {}: state {}, runtime {}, control {}, admin {}", cfg_.node.name, cfg_.node.state_dir,
               cfg_.node.runtime_dir, cfg_.supervisor.control_socket, surface_.admin_port());
  // From here on a failure stops what was started instead of returning: a
  // failed start leaves nothing behind.
  AdoptOrStart(std::move(prev));
  return Status::Ok();
}

void Node::AdoptOrStart(std::optional<RuntimeState> prev) {
  if (prev && !prev->dropped.empty()) {
    spdlog::warn("{}: dropped as malformed: {}; the engines it names are adopted without it",
                 RuntimeState::PathIn(cfg_.node.runtime_dir), prev->dropped);
  }
  const bool engines_run =
      prev && std::any_of(prev->engines.begin(), prev->engines.end(),
                          [this](const RuntimeState::Engine& e) { return engines_.StillRuns(e.proc); });
  if (engines_run && prev->engine_version && !(*prev->engine_version == VersionOf(cfg_))) {
    // The engines go on with the version the node ran (a restart is not a
    // reload): a slot restarted now starts it too, never a third one, and
    // `wsup reload` rolls to the file's. (With none left running, the node
    // starts as from cold, with the file's; a roll that was running rolls
    // back to its old version: Rollout::Resume.)
    spdlog::warn("engine.command or engine.env in {} differs from what the node ran before this restart; the node "
                 "keeps its version until `wsup reload` rolls it to the file's",
                 cfg_.path);
    cfg_.engine.command = prev->engine_version->command;
    cfg_.engine.env = prev->engine_version->env;
  }
  // The front first: adopted when it still runs, else started on the
  // socket bound in Start(). Then the holders, then the engines.
  if (prev && prev->front && prev->front->proc.StillRunning()) {
    front_.Adopt(*prev->front, prev->epoch);
  } else {
    front_.Start();
  }
  if (stop_.stopping()) return;
  if (cfg_.weight_cache.mode == CacheMode::kDaemon) {
    holders_.Start(prev ? prev->holders : std::vector<RuntimeState::Holder>{});
    if (stop_.stopping()) return;
  }
  if (prev) adopter_.Adopt(std::move(*prev));
  if (holders_.AllReady()) engines_.Start();
  SaveState();
}

int Node::Run() {
  uv_run(&loop_, UV_RUN_DEFAULT);
  return stop_.exit_code();
}

bool Node::Step() {
  if (stop_.finished()) return false;
  uv_run(&loop_, UV_RUN_NOWAIT);
  return !stop_.finished();
}

}  // namespace wsup
