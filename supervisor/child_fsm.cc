#include "supervisor/child_fsm.h"

namespace wsup {
namespace {

using K = ChildKind;
using S = ChildState;
using E = ChildEvent;
using A = ChildAction;

// The names, in the order of each enum's values (the logs' and tests' words).
constexpr EnumNames<K::kFront> kKindNames{"holder", "front"};
constexpr EnumNames<S::kStopped> kStateNames{"idle",   "starting", "keeping",  "ready",
                                             "failed", "down",     "stopping", "stopped"};
constexpr EnumNames<E::kStop> kEventNames{"spawn",     "adopt",  "up",      "kept", "keep_failed",
                                          "link_lost", "exited", "give_up", "stop"};
constexpr EnumNames<A::kReportDown> kActionNames{"none",        "attach_keeper",    "engines_may_start",
                                                 "push_routes", "reconnect",        "kill",
                                                 "terminate",   "schedule_restart", "report_down"};

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

const char* ChildKindName(ChildKind k) { return kKindNames(k); }
const char* ChildStateName(ChildState s) { return kStateNames(s); }
const char* ChildEventName(ChildEvent e) { return kEventNames(e); }
const char* ChildActionName(ChildAction a) { return kActionNames(a); }

std::optional<ChildTransition> NextChildTransition(ChildKind kind, ChildState state, ChildEvent event) {
  return FindRow(kTable, state, event, [kind](const ChildTransition& t) { return t.kind == kind; });
}

const ChildTransition* ChildTable(size_t* count) { return AllRows(kTable, count); }

bool ChildHasProcess(ChildState s) {
  return s == S::kStarting || s == S::kKeeping || s == S::kReady || s == S::kStopping;
}

}  // namespace wsup
