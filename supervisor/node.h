// Node: the supervisor's composition root. It builds the node's owners on
// one loop, wires each one's hooks to the others, and assembles what the
// node shows (`wsup status`, state.json) from their parts; the rules
// themselves live in the owners, each tested on fakes:
//
//   node.cc          the owners' construction, the start's order (paths,
//                    folders, the ledger, the control surfaces, the ports,
//                    then adopt or start), and the loop's lifetime
//   node_stop.h      NodeStop: the stop, from its first cause to the loop's end
//   adopter.h        Adopter: a restarted supervisor takes over its
//                    predecessor's engines and dates the dead ones
//                    (the rules: reconstruct.h)
//   promoter.h       Promoter: when the front gets the routes, and who is
//                    promoted when no engine is active
//   front_link.h     FrontLink, the front's one owner: spawn, link, routes,
//                    restarts
//   silence_watch.h  SilenceWatch: the front's report of an engine that
//                    sends nothing, judged and acted on
//   holder_set.h     HolderSet, the weight holders' one owner
//   engine_set.h     EngineSet, the engine slots' one owner: spawn,
//                    identity, status, probes, the table's moves and
//                    actions, exits, restarts, promotion, adoption
//   failover.h       Failover, the failovers' one owner: the swap, its
//                    ledger row and later times, its proof through the front
//   front_probe.h    FrontProbe: the semantic probe through the front
//   kv_pool_roles.h  KvPoolRoles, the KV pool's one owner
//   reload.h         Reloader: `wsup reload` and SIGHUP
//   rollout.h        Rollout, the rolling upgrade's one owner
//   control_surface.h  ControlSurface: the control socket and the admin
//                    listener
//   node_health.h    NodeHealth: the node's own state, the status line, READY=1
//   node_ledger.h    NodeLedger: the ledger's one owner
//
// The hooks are built in node_wiring.cc (engines, failover, KV pool,
// promotion, adoption, stop), node_front.cc (the front, its messages, the
// silence watch, the probe through it) and node_hooks.cc (rollout, reload,
// control, health, holders); node_state.cc assembles state.json and the
// status.
//
// Every state change of an engine, a holder, the front or a rollout goes
// through its table (engine_fsm.h, child_fsm.h, rollout_fsm.h, kv_handover.h):
// the Fire() of EngineSet, HolderSet, FrontLink, Rollout and KvPoolRoles
// looks the row up, logs it with its cause, and carries out its action. An
// engine's move is published once (engine_events.h) to the subscribers of
// SubscribeToEngines() (node_wiring.cc), the table's action and the Rollout
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
#include "supervisor/adopter.h"
#include "supervisor/node_stop.h"
#include "supervisor/promoter.h"
#include "common/one_shots.h"
#include "supervisor/supervisor.h"
#include "wire/json_socket.h"

namespace wsup {

class Node {
 public:
  Node(Config config, SupervisorOptions options);
  ~Node();
  // Everything that can fail before a child is started. After it returns
  // OK, failures stop the node (NodeStop) and Run() returns the exit code.
  Status Start();
  int Run();
  bool Step();
  int ExitCode() const { return stop_.exit_code(); }
  std::string StatusText() { return StatusJson().dump(); }

 private:
  // An engine slot ("a" or "b"), engine_slot.h.
  using Slot = EngineSlot;

  // node.cc: what a predecessor left is adopted, the rest started, in order.
  void AdoptOrStart(std::optional<RuntimeState> prev);

  // node_front.cc: the hooks through which front_, silence_ and
  // front_probe_ reach the node.
  FrontLink::Hooks FrontHooks();
  // The routes the front should have: the active and standby engines.
  FrontLink::Routes WantedRoutes();
  // Each message of the front to the owner it concerns.
  void OnFrontMessage(const FrontMessage& m);
  SilenceWatch::Hooks SilenceHooks();
  FrontProbe::Hooks FrontProbeHooks();

  // node_wiring.cc: the hooks of the engines, the failover, the KV pool,
  // the promoter, the adopter and the stop.
  EngineSet::Hooks EngineHooks();
  // Subscribes, once and in order, what follows a slot's move: its
  // recovery row, the KV pool, the table's action, the rollout, a
  // promotion, the front's routes, state.json and the status line.
  void SubscribeToEngines();
  Failover::Hooks FailoverHooks();
  KvPoolRoles::Hooks KvPoolHooks();
  Promoter::Hooks PromoterHooks();
  Adopter::Hooks AdopterHooks();
  NodeStop::Hooks StopHooks();

  // node_hooks.cc
  HolderSet::Hooks HolderHooks();
  Rollout::Hooks RolloutHooks();
  Reloader::Hooks ReloaderHooks();
  ControlSurface::Hooks ControlHooks();
  NodeHealth::Hooks HealthHooks();

  // node_state.cc: state.json and `wsup status`, from the owners' parts.
  void SaveState();
  RuntimeState BuildState();
  nlohmann::json StatusJson();

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
  // Work moved off the current call.
  OneShots later_{timers_};
  // The ledger, its failed writes, and the callers waiting on its rows
  // (node_ledger.h).
  NodeLedger ledger_{timers_, clock_};
  std::unique_ptr<http::HttpClient> http_;
  Notifier notifier_;
  Metrics metrics_;
  // The node's stop (node_stop.h).
  NodeStop stop_;
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
  // When the front gets the routes; promotion with no active engine.
  Promoter promoter_;
  // The engines a predecessor left (adopter.h).
  Adopter adopter_;
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
};

// A best-effort action whose failure must be seen (a signal, an fd store).
void LogFailure(const Status& st, const char* what);

}  // namespace wsup
