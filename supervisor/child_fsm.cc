#include "supervisor/child_fsm.h"

namespace wsup {
namespace {

using K = ChildKind;
using S = ChildState;
using E = ChildEvent;
using A = ChildAction;

// One row per transition; each (kind, from, event) appears at most once
// (checked by a test).
constexpr ChildTransition kTable[] = {
    // ---- holder
    {K::kHolder, S::kIdle, E::kSpawn, S::kStarting, A::kNone},
    {K::kHolder, S::kIdle, E::kAdopt, S::kKeeping, A::kAttachKeeper},
    {K::kHolder, S::kIdle, E::kStop, S::kStopped, A::kNone},

    {K::kHolder, S::kStarting, E::kUp, S::kKeeping, A::kAttachKeeper},
    // Its readiness line is not a holder's: the keeper could not reach it.
    {K::kHolder, S::kStarting, E::kKeepFailed, S::kFailed, A::kKill},
    {K::kHolder, S::kStarting, E::kExited, S::kFailed, A::kScheduleRestart},
    {K::kHolder, S::kStarting, E::kStop, S::kStopping, A::kTerminate},

    {K::kHolder, S::kKeeping, E::kKept, S::kReady, A::kEnginesMayStart},
    // Alive but its arena cannot be taken: it is of no use; kill and restart.
    {K::kHolder, S::kKeeping, E::kKeepFailed, S::kFailed, A::kKill},
    {K::kHolder, S::kKeeping, E::kExited, S::kFailed, A::kScheduleRestart},
    {K::kHolder, S::kKeeping, E::kStop, S::kStopping, A::kTerminate},

    // Engines keep their mappings; a new holder serves the kept fds.
    {K::kHolder, S::kReady, E::kExited, S::kFailed, A::kScheduleRestart},
    {K::kHolder, S::kReady, E::kStop, S::kStopping, A::kTerminate},

    {K::kHolder, S::kFailed, E::kExited, S::kFailed, A::kScheduleRestart},
    {K::kHolder, S::kFailed, E::kSpawn, S::kStarting, A::kNone},
    {K::kHolder, S::kFailed, E::kGiveUp, S::kDown, A::kReportDown},
    {K::kHolder, S::kFailed, E::kStop, S::kStopped, A::kNone},
    {K::kHolder, S::kFailed, E::kKeepFailed, S::kFailed, A::kNone},

    {K::kHolder, S::kDown, E::kStop, S::kStopped, A::kNone},
    {K::kHolder, S::kDown, E::kExited, S::kDown, A::kNone},

    {K::kHolder, S::kStopping, E::kExited, S::kStopped, A::kNone},
    {K::kHolder, S::kStopping, E::kStop, S::kStopping, A::kNone},
    {K::kHolder, S::kStopping, E::kKept, S::kStopping, A::kNone},
    {K::kHolder, S::kStopping, E::kKeepFailed, S::kStopping, A::kNone},
    {K::kHolder, S::kStopping, E::kUp, S::kStopping, A::kNone},
    {K::kHolder, S::kStopped, E::kStop, S::kStopped, A::kNone},

    // ---- front
    {K::kFront, S::kIdle, E::kSpawn, S::kStarting, A::kReconnect},
    {K::kFront, S::kIdle, E::kAdopt, S::kStarting, A::kReconnect},
    {K::kFront, S::kIdle, E::kStop, S::kStopped, A::kNone},

    {K::kFront, S::kStarting, E::kUp, S::kReady, A::kPushRoutes},
    // The front binds its control socket right after it starts: try again.
    {K::kFront, S::kStarting, E::kLinkLost, S::kStarting, A::kReconnect},
    {K::kFront, S::kStarting, E::kExited, S::kFailed, A::kScheduleRestart},
    {K::kFront, S::kStarting, E::kStop, S::kStopping, A::kTerminate},

    {K::kFront, S::kReady, E::kLinkLost, S::kStarting, A::kReconnect},
    {K::kFront, S::kReady, E::kExited, S::kFailed, A::kScheduleRestart},
    {K::kFront, S::kReady, E::kStop, S::kStopping, A::kTerminate},

    {K::kFront, S::kFailed, E::kSpawn, S::kStarting, A::kReconnect},
    {K::kFront, S::kFailed, E::kGiveUp, S::kDown, A::kReportDown},
    {K::kFront, S::kFailed, E::kStop, S::kStopped, A::kNone},
    {K::kFront, S::kFailed, E::kLinkLost, S::kFailed, A::kNone},

    {K::kFront, S::kDown, E::kStop, S::kStopped, A::kNone},

    {K::kFront, S::kStopping, E::kExited, S::kStopped, A::kNone},
    {K::kFront, S::kStopping, E::kStop, S::kStopping, A::kNone},
    {K::kFront, S::kStopping, E::kLinkLost, S::kStopping, A::kNone},
    {K::kFront, S::kStopping, E::kUp, S::kStopping, A::kNone},
    {K::kFront, S::kStopped, E::kStop, S::kStopped, A::kNone},
};

}  // namespace

const char* ChildKindName(ChildKind k) { return k == K::kHolder ? "holder" : "front"; }

const char* ChildStateName(ChildState s) {
  switch (s) {
    case S::kIdle: return "idle";
    case S::kStarting: return "starting";
    case S::kKeeping: return "keeping";
    case S::kReady: return "ready";
    case S::kFailed: return "failed";
    case S::kDown: return "down";
    case S::kStopping: return "stopping";
    case S::kStopped: return "stopped";
  }
  return "?";
}

const char* ChildEventName(ChildEvent e) {
  switch (e) {
    case E::kSpawn: return "spawn";
    case E::kAdopt: return "adopt";
    case E::kUp: return "up";
    case E::kKept: return "kept";
    case E::kKeepFailed: return "keep_failed";
    case E::kLinkLost: return "link_lost";
    case E::kExited: return "exited";
    case E::kGiveUp: return "give_up";
    case E::kStop: return "stop";
  }
  return "?";
}

const char* ChildActionName(ChildAction a) {
  switch (a) {
    case A::kNone: return "none";
    case A::kAttachKeeper: return "attach_keeper";
    case A::kEnginesMayStart: return "engines_may_start";
    case A::kPushRoutes: return "push_routes";
    case A::kReconnect: return "reconnect";
    case A::kKill: return "kill";
    case A::kTerminate: return "terminate";
    case A::kScheduleRestart: return "schedule_restart";
    case A::kReportDown: return "report_down";
  }
  return "?";
}

std::optional<ChildTransition> NextChildTransition(ChildKind kind, ChildState state, ChildEvent event) {
  for (const auto& t : kTable) {
    if (t.kind == kind && t.from == state && t.event == event) return t;
  }
  return std::nullopt;
}

const ChildTransition* ChildTable(size_t* count) {
  *count = sizeof(kTable) / sizeof(kTable[0]);
  return kTable;
}

bool ChildHasProcess(ChildState s) {
  switch (s) {
    case S::kStarting:
    case S::kKeeping:
    case S::kReady:
    case S::kStopping:
      return true;
    default:
      return false;
  }
}

}  // namespace wsup
