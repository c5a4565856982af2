// ChildFsm: the lives of the supervisor's other children, the weight holders
// and the front, as state x event tables like the engines' (engine_fsm.h).
//
// Holder (one per rank):
//   idle --spawn--> starting --up--> keeping --kept--> ready
//   idle --adopt--> keeping              (a restarted supervisor found it)
//   starting | keeping --keep_failed--> failed [kill]  (alive, but its
//                   readiness line is refused or its arena cannot be kept)
//   starting | keeping | ready --exited--> failed [schedule_restart]
//   failed --spawn--> starting;  failed --give_up--> down
//
// Front:
//   idle --spawn--> starting --up--> ready     (its control link is connected)
//   idle --adopt--> starting                   (a restarted supervisor found it)
//   ready --link_lost--> starting [reconnect]  (the process lives; link again)
//   starting | ready --exited--> failed [schedule_restart]
//   failed --spawn--> starting;  failed --give_up--> down
//
// Both: any state with a process --stop--> stopping [terminate]
//       --exited--> stopped; without one --stop--> stopped.
//
// "up" means: the holder wrote its readiness line; the front's control
// socket accepted the supervisor's link. Restart timing is not the table's
// business: schedule_restart asks the one RestartThrottle
// (restart_throttle.h), which engines use too.
//
// Pure: no processes, sockets or time. Loop thread only.
#pragma once

#include <cstddef>
#include <optional>

#include "common/state_table.h"

namespace wsup {

enum class ChildKind { kHolder, kFront };

enum class ChildState {
  kIdle,      // never started
  kStarting,  // spawned (or adopted front), not up yet
  kKeeping,   // holder up; the supervisor's keeper attach is in flight
  kReady,     // holder: its fds kept; front: linked and steered
  kFailed,    // exited (or being killed); a restart may follow
  kDown,      // given up on: crash loop or a permanent-failure exit
  kStopping,  // asked to stop; waiting for the exit
  kStopped,   // exited after a stop
};

enum class ChildEvent {
  kSpawn,       // the supervisor started the process
  kAdopt,       // a restarted supervisor found it running
  kUp,          // holder: readiness line; front: control link connected
  kKept,        // holder: the keeper attach returned the arena fds
  kKeepFailed,  // holder: alive but cannot be kept (bad readiness line, failed keeper attach)
  kLinkLost,    // front: the control link closed while the process lives
  kExited,      // the process exited (any cause)
  kGiveUp,      // the restart throttle says stop trying
  kStop,        // the node is stopping
};

enum class ChildAction {
  kNone,
  kAttachKeeper,     // holder: take its manifest and fds (off the loop)
  kEnginesMayStart,  // holder: every holder ready -> start the engines
  kPushRoutes,       // front: send it the routes
  kReconnect,        // front: connect the control link again
  kKill,             // SIGKILL the process group; its exit follows
  kTerminate,        // SIGTERM, SIGKILL after the stop budget
  kScheduleRestart,  // ask the restart throttle
  kReportDown,       // the node is degraded: say why
};

const char* ChildKindName(ChildKind k);
const char* ChildStateName(ChildState s);
const char* ChildEventName(ChildEvent e);
const char* ChildActionName(ChildAction a);
inline constexpr TableNames<ChildState, ChildEvent, ChildAction> kChildNames{ChildStateName, ChildEventName,
                                                                             ChildActionName};

// A TableRow with the kind of child it is about: one array holds both tables.
struct ChildTransition {
  ChildKind kind;
  ChildState from;
  ChildEvent event;
  ChildState to;
  ChildAction action;
};

// nullopt: the event means nothing in that state (logged and ignored).
std::optional<ChildTransition> NextChildTransition(ChildKind kind, ChildState state, ChildEvent event);

// The whole table (both kinds), for tests.
const ChildTransition* ChildTable(size_t* count);

// True while a process is expected to exist.
bool ChildHasProcess(ChildState s);

}  // namespace wsup
