// EngineFsm: the life of one supervised engine slot as an explicit
// state x event table.
//
// Every transition is one row of kTable (engine_fsm.cc): reading the table is
// reading the lifecycle, and each row is tested. The FSM is pure: it decides
// the next state and the action for the supervisor to carry out (spawn, kill,
// promote, ...); it never touches processes, sockets or time itself, so tests
// drive it directly.
//
//   idle --spawn--> starting --engine_ready--> warming --probe_pass--> standby
//   standby --promote--> active --demote--> draining --drained--> standby
//   draining --promote--> active (the active that replaced it failed first)
//   standby --unfit--> failed (the check before a promotion: stopped, silent)
//   standby | draining --kv_stuck--> failed (it would not let the KV pool go)
//   starting | warming | standby | draining --kv_trespass--> failed (it maps
//     the KV pool, which the supervisor did not give it: killed at once)
//   active --kv_trespass--> failed [failover]
//   any live state --exited / dying / probe_trip / start_timeout--> failed
//   failed --restart--> starting (after backoff; the supervisor decides when)
//   any state --stop--> stopping --exited--> stopped
//
// Thread-safety: none; owned by the supervisor's loop thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "common/state_table.h"

namespace wsup {

enum class SlotState {
  kIdle,      // no process; never started
  kStarting,  // spawned; the engine is loading, attaching, building communicators
  kWarming,   // the engine says it is up; the semantic probe has not passed yet
  kStandby,   // proven by the probe; ready to take traffic; not serving
  kActive,    // the front sends traffic here
  kDraining,  // planned swap: no new traffic; in-flight requests finish
  kFailed,    // exited, hung, or never became ready; waiting to be restarted
  kStopping,  // asked to stop (SIGTERM sent); waiting for the exit
  kStopped,   // exited after a stop; terminal until spawned again
};

enum class SlotEvent {
  kSpawn,         // the supervisor started the process
  kEngineReady,   // the engine's /wsup/status says ready
  kProbePass,     // the probe's hysteresis says healthy
  kProbeTrip,     // the probe's hysteresis says unhealthy (hung or wrong answers)
  kStartTimeout,  // not ready within the start budget
  kPromote,       // the supervisor makes this slot the active one
  kDemote,        // planned swap away from this slot
  kDrained,       // no request in flight any more (or the drain budget ran out)
  kExited,        // the process exited (any cause)
  kDying,         // its lifeline closed after it was ready: the kernel is tearing it down
  kStop,          // the supervisor is shutting the slot down
  kAdopt,         // a restarted supervisor found this engine running and proven
  kUnfit,         // the check before a promotion found it stopped, gone or silent
  kKvStuck,       // it holds the node's KV pool and did not let it go when asked
  kKvTrespass,    // it says it maps the node's KV pool, which is not its to map
};

// What the supervisor must do after a transition.
enum class SlotAction {
  kNone,
  kStartProbing,   // begin semantic probes
  kRouteHere,      // point the front at this slot
  kRouteAway,      // the front must stop sending new requests here
  kKillGroup,      // SIGKILL the process group (hung or failed while alive)
  kTerminate,      // SIGTERM, then SIGKILL after the stop budget
  kScheduleRestart,
  kFailover,       // this slot was active and is gone: promote the standby
};

// Why an active slot failed over, from the event that failed it.
// Why traffic moved (the ledger's `trigger`, the failovers metric's label):
// crash (the engine died), probe (it answered wrongly, or failed another
// check while alive), hang (it stopped answering: the front saw it silent,
// or its probes timed out), drill (a deliberate `wsup failover --drill`),
// rollout (a rolling upgrade's planned swap).
enum class FailoverTrigger { kCrash, kProbe, kDrill, kHang, kRollout };
const char* FailoverTriggerName(FailoverTrigger t);  // "crash" | "probe" | "drill" | "hang" | "rollout"
// kExited and kDying are crashes, kProbeTrip a probe verdict (a hang when
// `hung`: what tripped it was silence, not a wrong answer); a drill is known
// to the caller, not to the event.
FailoverTrigger TriggerFor(SlotEvent event, bool drill, bool hung = false);
// Whether a probe's trip cause is a timeout (the probe's "timeout after N
// ms"): the engine hung rather than answered wrongly.
bool IsHangCause(const std::string& cause);

const char* SlotStateName(SlotState s);
const char* SlotEventName(SlotEvent e);
const char* SlotActionName(SlotAction a);
inline constexpr TableNames<SlotState, SlotEvent, SlotAction> kSlotNames{SlotStateName, SlotEventName,
                                                                         SlotActionName};

using SlotTransition = TableRow<SlotState, SlotEvent, SlotAction>;

// Looks the (state, event) pair up in the table. nullopt means the event is
// not meaningful in that state (for example kPromote while kStarting); the
// caller logs it and ignores it rather than guessing.
std::optional<SlotTransition> NextTransition(SlotState state, SlotEvent event);

// The whole table, for tests and for `wsup status --explain`.
const SlotTransition* SlotTable(size_t* count);

// Serving states: a process exists and is expected to be alive.
bool IsLive(SlotState s);

}  // namespace wsup
