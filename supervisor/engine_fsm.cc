#include "supervisor/engine_fsm.h"

namespace wsup {
namespace {

using S = SlotState;
using E = SlotEvent;
using A = SlotAction;

// The names, in the order of each enum's values (the logs' and tests' words).
constexpr EnumNames<S::kStopped> kStateNames{"idle",     "starting", "warming",  "standby", "active",
                                             "draining", "failed",   "stopping", "stopped"};
constexpr EnumNames<E::kKvTrespass> kEventNames{"spawn",         "engine_ready", "probe_pass", "probe_trip",
                                                "start_timeout", "promote",      "demote",     "drained",
                                                "exited",        "dying",        "stop",       "adopt",
                                                "unfit",         "kv_stuck",     "kv_trespass"};
constexpr EnumNames<A::kFailover> kActionNames{
    "none",       "start_probing", "route_here",       "route_away",
    "kill_group", "terminate",     "schedule_restart", "failover"};
constexpr EnumNames<FailoverTrigger::kRollout> kTriggerNames{"crash", "probe", "drill", "hang", "rollout"};

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
    // write there too, so it is killed at once (supervisor/kv_pool_roles.cc,
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

const char* SlotStateName(SlotState s) { return kStateNames(s); }
const char* SlotEventName(SlotEvent e) { return kEventNames(e); }
const char* SlotActionName(SlotAction a) { return kActionNames(a); }
const char* FailoverTriggerName(FailoverTrigger t) { return kTriggerNames(t); }

FailoverTrigger TriggerFor(SlotEvent event, bool drill, bool hung) {
  if (drill) return FailoverTrigger::kDrill;
  if (hung && event == E::kProbeTrip) return FailoverTrigger::kHang;
  // A trespass is the supervisor's verdict on a live engine, as a probe's is.
  return event == E::kProbeTrip || event == E::kUnfit || event == E::kKvTrespass ? FailoverTrigger::kProbe
                                                                                 : FailoverTrigger::kCrash;
}

std::optional<SlotTransition> NextTransition(SlotState state, SlotEvent event) {
  return FindRow(kTable, state, event);
}

const SlotTransition* SlotTable(size_t* count) { return AllRows(kTable, count); }

bool IsLive(SlotState s) {
  return s == S::kStarting || s == S::kWarming || s == S::kStandby || s == S::kActive || s == S::kDraining ||
         s == S::kStopping;
}

bool IsHangCause(const std::string& cause) { return cause.find("timeout after") != std::string::npos; }

}  // namespace wsup
