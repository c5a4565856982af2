// Supervisor::Impl: the node's one loop and everything on it. Internal to
// the supervisor; split by responsibility over several files:
//
//   supervisor.cc  start, preflight, stop, the loop's lifetime
//   adoption.cc    a restarted supervisor: adopt what runs, reconstruct
//                  what happened while none ran (the rules: reconstruct.h)
//   front_link.cc  FrontLink (front_link.h), the front's one owner: spawn,
//                  link, routes, restarts; nothing else touches the front
//   front_events.cc  what the front says (its messages), the hooks of
//                  FrontLink and SilenceWatch, the routes it is given
//   silence_watch.cc  SilenceWatch (silence_watch.h): the front's report of
//                  an engine that sends nothing, judged and acted on
//   holder_set.cc  HolderSet (holder_set.h), the weight holders' one owner:
//                  spawn, readiness, keeper attach, kept layouts and KV
//                  pool, restarts; the rest reaches them through its methods
//   engine_set.cc, engine_start.cc  EngineSet (engine_set.h), the engine
//                  slots' one owner: spawn, identity, status, probes, the
//                  table's moves and actions, exits, restarts, promotion,
//                  adoption; it reaches the rest through its hooks
//   failover.cc    Failover (failover.h), the failovers' one owner: the
//                  swap (a crash's, a drill's, a planned one with its
//                  drain), its ledger row and later times, the proof by the
//                  first correct answer through the front, its budget, the
//                  `wsup failover` callers; it reaches the rest through its
//                  hooks
//   promotion.cc   the hooks of EngineSet, Failover and KvPoolRoles, what
//                  follows an engine's move (SubscribeToEngines), promotion
//                  when no engine is active, answers once rows are on disk
//   front_probe.cc FrontProbe (front_probe.h): the semantic probe through
//                  the front, asked again until it passes
//   kv_pool_roles.cc  KvPoolRoles (kv_pool_roles.h), the KV pool's one
//                  owner: which engine maps it (kv_handover.h), the role
//                  requests, what engines say of their KV; it reaches the
//                  engines through its hooks
//   reload.cc      Reloader (reload.h): `wsup reload` and SIGHUP, the
//                  config read again, what can change applied at once
//                  (reload_plan.h), a new engine version handed to the
//                  rollout; it reaches the rest through its hooks
//   node_hooks.cc  the hooks of Rollout and Reloader
//   rollout.cc     Rollout (rollout.h), the rolling upgrade's one owner: its
//                  steps (rollout_fsm.h), budgets, ledger row and resume
//                  after a supervisor restart; it reaches the engines only
//                  through its hooks
//   control_surface.cc  ControlSurface (control_surface.h): the control
//                  socket (the CLI) and the admin listener, each request
//                  read and checked before the node's hooks act on it
//   control.cc     ControlSurface's hooks: status, what /metrics gathers
//   node_state.cc  state.json, and the hooks of NodeHealth (node_health.h):
//                  the node's own state, the status line, READY=1
//   node_ledger.cc NodeLedger (node_ledger.h): the ledger's one owner, failed
//                  writes kept for status, answers once rows are on disk
//
// Every state change of an engine, a holder, the front or a rollout goes
// through its table (engine_fsm.h, child_fsm.h, rollout_fsm.h, kv_handover.h):
// the Fire() of EngineSet, HolderSet, FrontLink, Rollout and KvPoolRoles
// looks the row up, logs it with its cause, and carries out its action. An
// engine's move is published once (engine_events.h) to the subscribers of
// SubscribeToEngines() (promotion.cc), the table's action and the Rollout
// among them, in the order their effects must happen.
//
// Threads: the loop thread only (HolderSet runs its keeper exchanges on
// libuv's thread pool, and they come back on the loop).
#pragma once

#include <uv.h>

#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "client/client.h"
#include "client/kv_pool.h"
#include "common/signals.h"
#include "common/status.h"
#include "common/unique_fd.h"
#include "http/client.h"
#include "http/server.h"
#include "probes/monitor.h"
#include "state/ledger.h"
#include "supervisor/child_fsm.h"
#include "supervisor/engine_events.h"
#include "supervisor/engine_fsm.h"
#include "supervisor/engine_version.h"
#include "supervisor/failover.h"
#include "supervisor/front_link.h"
#include "supervisor/front_probe.h"
#include "supervisor/holder_set.h"
#include "supervisor/control_surface.h"
#include "supervisor/engine_set.h"
#include "supervisor/engine_slot.h"
#include "supervisor/kv_pool_roles.h"
#include "supervisor/reload.h"
#include "supervisor/reload_plan.h"
#include "supervisor/rollout.h"
#include "supervisor/launcher.h"
#include "supervisor/loop_timer.h"
#include "supervisor/messages.h"
#include "supervisor/metrics.h"
#include "supervisor/node_health.h"
#include "supervisor/node_ledger.h"
#include "supervisor/notify.h"
#include "supervisor/process.h"
#include "supervisor/promotion_check.h"
#include "supervisor/restart_throttle.h"
#include "supervisor/runtime_state.h"
#include "supervisor/silence_watch.h"
#include "supervisor/supervisor.h"
#include "wire/json_socket.h"

namespace wsup {

class Supervisor::Impl {
 public:
  Impl(Config config, SupervisorOptions options);
  ~Impl();
  // Everything that can fail before a child is started. After it returns
  // OK, failures go through BeginStop() and Run() returns the exit code.
  Status Start();
  int Run();
  bool Step();
  int ExitCode() const { return exit_code_; }
  std::string StatusText() { return StatusJson().dump(); }

 private:
  // An engine slot ("a" or "b"), engine_slot.h.
  using Slot = EngineSlot;

  // supervisor.cc
  // CheckConfigPaths, as one InvalidArgument (exit 78).
  Status CheckPaths();
  Status PrepareDirs();
  Status Preflight(const std::optional<RuntimeState>& prev);
  void BeginStop(const std::string& why, int exit_code);
  void MaybeFinishStop();

  // adoption.cc
  Status AdoptOrStart(std::optional<RuntimeState> prev);
  void AdoptFront(const RuntimeState::Front& pf, int64_t epoch);
  // The engine recorded before the restart (engines_.Adopt); an adopted
  // active engine keeps the traffic. False when its process is gone.
  bool AdoptEngine(const RuntimeState::Engine& pe);
  void ReconcileWithFront(const RuntimeState& prev, const std::vector<RuntimeState::Engine>& dead);

  // front_events.cc (the front itself: front_link.h)
  // The hooks through which front_ tells and asks this node.
  FrontLink::Hooks FrontHooks();
  // The routes the front should have: the active and standby engines.
  FrontLink::Routes WantedRoutes();
  // Gives the front WantedRoutes() (a new epoch when they changed).
  void PushRoutes();
  void OnFrontMessage(const FrontMessage& m);
  // The hooks through which silence_ (SilenceWatch, silence_watch.h)
  // reaches the engines and the front.
  SilenceWatch::Hooks SilenceHooks();

  // supervisor.cc: the hooks through which holders_ tells this node.
  HolderSet::Hooks HolderHooks();

  // promotion.cc: the hooks through which engines_ tells and asks this
  // node (EngineSet, engine_set.h).
  EngineSet::Hooks EngineHooks();
  // Subscribes, once and in order, what follows a slot's move: its
  // recovery row, the KV pool, the table's action, the rollout, a
  // promotion, the front's routes, state.json and the status line.
  void SubscribeToEngines();
  // Promotes a slot as part of a swap (MaybePromote waits meanwhile); the
  // caller pushes the routes once.
  bool PromoteInSwap(Slot& s, const std::string& cause, std::string* unfit, std::string* note = nullptr);
  void MaybePromote();
  // The hooks through which front_probe_ (front_probe.h) reaches the front.
  FrontProbe::Hooks FrontProbeHooks();
  // The hooks through which failover_ reaches the engines, the front, the
  // ledger and the callers (promotion.cc).
  Failover::Hooks FailoverHooks();
  // The hooks through which kv_ (KvPoolRoles, kv_pool_roles.h) reaches the
  // engines and the node (promotion.cc).
  KvPoolRoles::Hooks KvPoolHooks();
  // The ledger's `fences` row of an engine killed for what it did, not for
  // how it failed (node_state.cc).
  void RecordFence(Slot& s, const std::string& why);

  // node_hooks.cc: the hooks through which rollout_ (rollout.h) and
  // reloader_ (reload.h) reach the engines and the node.
  Rollout::Hooks RolloutHooks();
  Reloader::Hooks ReloaderHooks();
  // Starts the slot (off the current call) with its version for the next
  // start, as a recovery of `cause`.
  void RollSpawn(Slot& s, const std::string& cause);
  // A version as EngineVersionText shows it.
  std::string VersionText(const EngineVersion& v) const;

  // control.cc: the hooks through which surface_ (ControlSurface,
  // control_surface.h) reaches the node.
  ControlSurface::Hooks ControlHooks();
  nlohmann::json StatusJson();

  // node_state.cc
  void SaveState();
  RuntimeState BuildState();
  // The hooks through which health_ (node_health.h) reads the engines and
  // the front and tells systemd.
  NodeHealth::Hooks HealthHooks();
  // Runs cb once after ms on the timer source (real or a test's).
  void After(int64_t ms, std::function<void()> cb);
  // A best-effort action whose failure must be seen (a signal, an fd store).
  void Logged(const Status& st, const char* what);

  // Initialised first, so every member below can put handles on it.
  struct LoopBox {
    explicit LoopBox(void* owner);
    // Destroyed last: every member declared after it has closed its handles
    // by now; run their close callbacks, then close the loop.
    ~LoopBox();
    uv_loop_t loop{};
  };

  Config cfg_;
  SupervisorOptions opts_;
  const Clock& clock_;
  LoopBox loop_box_;
  uv_loop_t& loop_ = loop_box_.loop;
  LoopTimerSource own_timers_{&loop_};
  TimerSource& timers_;    // opts_.timers, else own_timers_
  Launcher& launcher_;     // opts_.launcher, else RealLauncher()
  // What After() runs later.
  OneShots later_{timers_};
  // The ledger, its failed writes, and the callers waiting on its rows
  // (node_ledger.h).
  NodeLedger ledger_{timers_, clock_};
  std::unique_ptr<http::HttpClient> http_;
  Notifier notifier_;
  Metrics metrics_;
  // The control socket and the admin listener (control_surface.h).
  ControlSurface surface_;
  std::unique_ptr<Timer> watchdog_;
  // SIGTERM and SIGINT stop the node, SIGHUP reloads it, SIGPIPE is an
  // error on its socket.
  Signals signals_{&loop_};

  // The engine slots and their lives (engine_set.h); every move of a
  // slot's table is published on engines_.events() to the subscribers of
  // SubscribeToEngines().
  EngineSet engines_;
  HolderSet holders_;
  FrontLink front_;
  // The front's `silent` reports (silence_watch.h).
  SilenceWatch silence_;
  // The probe through the front (front_probe.h).
  FrontProbe front_probe_;
  bool adopting_ = false;   // MaybePromote() waits while adopted engines take their roles
  bool swapping_ = false;   // a planned swap is moving roles: MaybePromote() waits

  // The failover in progress, its proof and its later times (failover.h).
  Failover failover_;
  // The rolling upgrade (rollout.h): its state and steps; told of the
  // engines' moves as a subscriber of engines_.events().
  Rollout rollout_;
  // `wsup reload` and SIGHUP (reload.h).
  Reloader reloader_;
  // The node's KV pool: who maps it (kv_pool_roles.h).
  KvPoolRoles kv_;
  // The node's own state, and systemd's READY=1 (node_health.h).
  NodeHealth health_;
  bool stopping_ = false;
  bool finished_ = false;  // every handle closed: the loop has nothing left
  int exit_code_ = 0;
  std::vector<std::shared_ptr<JsonConn>> stop_waiters_;
};

}  // namespace wsup
