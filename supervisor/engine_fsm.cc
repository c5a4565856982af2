#include "supervisor/engine_fsm.h"

namespace wsup {
namespace {

using S = SlotState;
using E = SlotEvent;
using A = SlotAction;

// The lifecycle, one row per transition. Order does not matter; each
// (from, event) pair appears at most once (checked by a test).
constexpr SlotTransition kTable[] = {
    {S::kIdle, E::kSpawn, S::kStarting, A::kNone},
    {S::kIdle, E::kAdopt, S::kStandby, A::kStartProbing},
    {S::kIdle, E::kStop, S::kStopped, A::kNone},

    {S::kStarting, E::kEngineReady, S::kWarming, A::kStartProbing},
    // An engine without /wsup/status can still pass the semantic probe.
    {S::kStarting, E::kProbePass, S::kStandby, A::kNone},
    {S::kStarting, E::kStartTimeout, S::kFailed, A::kKillGroup},
    {S::kStarting, E::kExited, S::kFailed, A::kScheduleRestart},
    {S::kStarting, E::kStop, S::kStopping, A::kTerminate},
    // It maps the node's KV pool, which no one gave it: another engine may
    // write there too, so it is killed at once (supervisor/kv_pool.cc,
    // CheckPoolTrespass). The same in every live state below.
    {S::kStarting, E::kKvTrespass, S::kFailed, A::kKillGroup},

    {S::kWarming, E::kProbePass, S::kStandby, A::kNone},
    // A warming engine that answers wrongly is never promoted.
    {S::kWarming, E::kProbeTrip, S::kFailed, A::kKillGroup},
    {S::kWarming, E::kStartTimeout, S::kFailed, A::kKillGroup},
    {S::kWarming, E::kExited, S::kFailed, A::kScheduleRestart},
    {S::kWarming, E::kDying, S::kFailed, A::kKillGroup},
    {S::kWarming, E::kStop, S::kStopping, A::kTerminate},
    {S::kWarming, E::kKvTrespass, S::kFailed, A::kKillGroup},

    {S::kStandby, E::kPromote, S::kActive, A::kRouteHere},
    {S::kStandby, E::kProbeTrip, S::kFailed, A::kKillGroup},
    {S::kStandby, E::kExited, S::kFailed, A::kScheduleRestart},
    {S::kStandby, E::kDying, S::kFailed, A::kKillGroup},
    {S::kStandby, E::kStop, S::kStopping, A::kTerminate},
    // Found stopped or silent when it was about to take the traffic: it is
    // not promoted, and it is replaced.
    {S::kStandby, E::kUnfit, S::kFailed, A::kKillGroup},
    // It keeps the node's KV pool after it was asked to let it go: killed,
    // its exit frees the pool for the active engine.
    {S::kStandby, E::kKvStuck, S::kFailed, A::kKillGroup},
    {S::kStandby, E::kKvTrespass, S::kFailed, A::kKillGroup},
    {S::kStandby, E::kProbePass, S::kStandby, A::kNone},
    {S::kStandby, E::kEngineReady, S::kStandby, A::kNone},

    {S::kActive, E::kExited, S::kFailed, A::kFailover},
    // The lifeline closes before the exit completes (a killed GPU process
    // takes tens of ms more to be reaped): fail over at once.
    {S::kActive, E::kDying, S::kFailed, A::kFailover},
    {S::kActive, E::kProbeTrip, S::kFailed, A::kFailover},
    // An active engine that maps the pool while the engine before it may
    // still write there: two writers of one pool serve wrong tokens, so
    // even the active one is failed (its standby takes over).
    {S::kActive, E::kKvTrespass, S::kFailed, A::kFailover},
    {S::kActive, E::kDemote, S::kDraining, A::kRouteAway},
    {S::kActive, E::kStop, S::kStopping, A::kTerminate},
    {S::kActive, E::kProbePass, S::kActive, A::kNone},
    {S::kActive, E::kEngineReady, S::kActive, A::kNone},

    {S::kDraining, E::kDrained, S::kStandby, A::kNone},
    // The active engine failed while this one, the one it replaced, still
    // drained: proven and serving until moments ago, it takes the traffic
    // back at once instead of leaving the node without an engine until the
    // failed slot restarts.
    {S::kDraining, E::kPromote, S::kActive, A::kRouteHere},
    // Found stopped or silent when it was about to take the traffic back.
    {S::kDraining, E::kUnfit, S::kFailed, A::kKillGroup},
    {S::kDraining, E::kExited, S::kFailed, A::kScheduleRestart},
    {S::kDraining, E::kDying, S::kFailed, A::kKillGroup},
    {S::kDraining, E::kProbeTrip, S::kFailed, A::kKillGroup},
    {S::kDraining, E::kStop, S::kStopping, A::kTerminate},
    {S::kDraining, E::kProbePass, S::kDraining, A::kNone},
    {S::kDraining, E::kKvStuck, S::kFailed, A::kKillGroup},
    {S::kDraining, E::kKvTrespass, S::kFailed, A::kKillGroup},

    // kKillGroup from a live state leads here first; the exit then arrives.
    {S::kFailed, E::kExited, S::kFailed, A::kScheduleRestart},
    {S::kFailed, E::kSpawn, S::kStarting, A::kNone},
    {S::kFailed, E::kStop, S::kStopped, A::kNone},
    {S::kFailed, E::kProbeTrip, S::kFailed, A::kNone},
    {S::kFailed, E::kDying, S::kFailed, A::kNone},
    {S::kFailed, E::kProbePass, S::kFailed, A::kNone},

    {S::kStopping, E::kExited, S::kStopped, A::kNone},
    {S::kStopping, E::kStop, S::kStopping, A::kNone},
    {S::kStopping, E::kProbeTrip, S::kStopping, A::kNone},
    {S::kStopping, E::kDying, S::kStopping, A::kNone},
    {S::kStopping, E::kProbePass, S::kStopping, A::kNone},

    {S::kStopped, E::kSpawn, S::kStarting, A::kNone},
    {S::kStopped, E::kStop, S::kStopped, A::kNone},
};

}  // namespace

const char* SlotStateName(SlotState s) {
  switch (s) {
    case S::kIdle: return "idle";
    case S::kStarting: return "starting";
    case S::kWarming: return "warming";
    case S::kStandby: return "standby";
    case S::kActive: return "active";
    case S::kDraining: return "draining";
    case S::kFailed: return "failed";
    case S::kStopping: return "stopping";
    case S::kStopped: return "stopped";
  }
  return "?";
}

const char* SlotEventName(SlotEvent e) {
  switch (e) {
    case E::kSpawn: return "spawn";
    case E::kEngineReady: return "engine_ready";
    case E::kProbePass: return "probe_pass";
    case E::kProbeTrip: return "probe_trip";
    case E::kStartTimeout: return "start_timeout";
    case E::kPromote: return "promote";
    case E::kDemote: return "demote";
    case E::kDrained: return "drained";
    case E::kExited: return "exited";
    case E::kDying: return "dying";
    case E::kStop: return "stop";
    case E::kAdopt: return "adopt";
    case E::kUnfit: return "unfit";
    case E::kKvStuck: return "kv_stuck";
    case E::kKvTrespass: return "kv_trespass";
  }
  return "?";
}

const char* SlotActionName(SlotAction a) {
  switch (a) {
    case A::kNone: return "none";
    case A::kStartProbing: return "start_probing";
    case A::kRouteHere: return "route_here";
    case A::kRouteAway: return "route_away";
    case A::kKillGroup: return "kill_group";
    case A::kTerminate: return "terminate";
    case A::kScheduleRestart: return "schedule_restart";
    case A::kFailover: return "failover";
  }
  return "?";
}

const char* FailoverTriggerName(FailoverTrigger t) {
  switch (t) {
    case FailoverTrigger::kCrash: return "crash";
    case FailoverTrigger::kProbe: return "probe";
    case FailoverTrigger::kDrill: return "drill";
  }
  return "?";
}

FailoverTrigger TriggerFor(SlotEvent event, bool drill) {
  if (drill) return FailoverTrigger::kDrill;
  // A trespass is the supervisor's verdict on a live engine, as a probe's is.
  return event == E::kProbeTrip || event == E::kUnfit || event == E::kKvTrespass ? FailoverTrigger::kProbe
                                                                                 : FailoverTrigger::kCrash;
}

std::optional<SlotTransition> NextTransition(SlotState state, SlotEvent event) {
  for (const auto& t : kTable) {
    if (t.from == state && t.event == event) return t;
  }
  return std::nullopt;
}

const SlotTransition* SlotTable(size_t* count) {
  *count = sizeof(kTable) / sizeof(kTable[0]);
  return kTable;
}

bool IsLive(SlotState s) {
  switch (s) {
    case S::kStarting:
    case S::kWarming:
    case S::kStandby:
    case S::kActive:
    case S::kDraining:
    case S::kStopping:
      return true;
    default:
      return false;
  }
}

}  // namespace wsup
