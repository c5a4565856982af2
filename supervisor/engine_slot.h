// EngineSlot: one of the node's two engine slots ("a" or "b"): the process
// started for it, what its probes and its /wsup/status say, its recovery
// bookkeeping and its restart budget. The slot outlives its processes: a
// restart is a new process in the same slot, and what must survive the
// process (the resume totals, a wrong answer, the throttle) stays here.
//
// Its state moves only through the engine table (engine_fsm.h); the owners
// that act on a slot (EngineSet, engine_set.h; the KV pool's
// roles in kv_pool_roles.h, failover and rollout through their hooks) take
// it by reference and check `pid` against the one they acted on, since an
// answer may come back after the process it was asked of has gone.
//
// Threads: the loop thread only.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "common/timer.h"
#include "probes/hysteresis.h"
#include "probes/monitor.h"
#include "supervisor/engine_fsm.h"
#include "supervisor/engine_version.h"
#include "supervisor/metrics.h"
#include "supervisor/process.h"
#include "supervisor/restart_throttle.h"

namespace wsup {

struct EngineSlot {
  EngineSlot(TimerSource& timers, std::string n, RestartPolicy policy)
      : name(std::move(n)),
        poll(timers.Make()),
        stop_timer(timers.Make()),
        restart_timer(timers.Make()),
        status_timer(timers.Make()),
        throttle(std::move(policy)) {}

  // A new process now runs in the slot: what was known of the last one is
  // forgotten (readiness, probes, identity logs, KV, memory, the cache
  // row), what belongs to the slot is kept.
  void BeginProcess(pid_t new_pid, uint64_t new_start_time, std::string new_nonce, std::string new_token,
                    int new_port, int64_t wall_ms, int64_t mono_ms);
  // Stops watching its process (exit, lifeline, death word, ready line).
  void CloseWatches();
  // Its process is gone: the watches, timers and probes stop, and what the
  // process said goes with it. The resume totals stay with the slot
  // (counters); the next process starts its own.
  void EndProcess();
  // A serving engine's /wsup/status (an object): its resume counts (added
  // to the slot's totals as they grow, in metrics), its communicator and
  // its memory (gauges, in metrics). Its `kv` is the pool's to judge first
  // (kv_pool_roles.h), so it is not read here.
  void TakeServingStatus(const nlohmann::json& st, Metrics& metrics);

  std::string name;
  SlotState state = SlotState::kIdle;

  // Identity: the process started for this slot, known by its pid (and
  // start time, against pid reuse), its per-start nonce, and the port it
  // must be the one listening on.
  pid_t pid = 0;
  uint64_t start_time = 0;
  std::string nonce;
  // The secret of its control routes, fresh at every start (WSUP_CONTROL_TOKEN,
  // http/control_auth.h); sent with every /wsup/status and /wsup/role
  // request, never shown.
  std::string control_token;
  int port = 0;
  bool adopted = false;
  bool identity_logged = false;  // "port answered by someone else" said once per start
  bool status_logged = false;    // "its /wsup/status cannot be read" said once per start

  ProcessWatch* watch = nullptr;
  HangupWatch* lifeline = nullptr;  // EOF: the process is being torn down
  DeathWatch* death = nullptr;      // its death word was marked: it is exiting (first)
  LineWatch* ready_line = nullptr;  // {ready_fd}: the engine says when it is up
  int64_t spawned_ms = 0;           // wall
  int64_t spawned_mono = 0;         // monotonic, for the start budget
  std::unique_ptr<Timer> poll;           // status polling while starting
  std::unique_ptr<Timer> stop_timer;     // SIGKILL after the stop budget
  std::unique_ptr<Timer> restart_timer;  // backoff
  std::unique_ptr<Timer> status_timer;   // its /wsup/status while it serves (KV, memory)

  // What the probes and the engine say.
  std::unique_ptr<HealthMonitor> monitor;
  bool semantic_ready = false;
  // Its latest probe trip was silence (the front's report, or probes that
  // timed out), not a wrong answer: a failover it causes is a "hang".
  bool tripped_hung = false;
  bool comm_warm = false;
  nlohmann::json last_status;  // the engine's /wsup/status
  std::string last_probe_reason;
  // The slot's last probe answered, wrongly, with a well-formed
  // completion (supervisor/expectation_check.h); none after any other
  // outcome. Kept across a restart: the answer of the model, whichever
  // process of the slot gave it.
  std::optional<ProbeAnswer> wrong_answer;
  int64_t last_probe_ms = 0;       // latency of the last probe
  int64_t last_ok_mono = 0;        // when a probe last passed (0: never, this start)
  int64_t last_ok_wall = 0;        // ... the same, wall time: where a probe trip's fault is put
  int64_t traffic_last_ms = 0;     // the front's last byte from it (wall), from a `silent` report
  // The node's KV pool: what the engine last said of its KV and memory,
  // and whether it takes the pool at all (false once it answered that it
  // keeps a private cache, or has no /wsup/role).
  nlohmann::json kv;
  nlohmann::json memory;
  nlohmann::json resume;  // its /wsup/status "resume": streams resumed from a dead engine's KV
  // Its process's resume and token counts as last added to the slot's
  // totals (metrics.engine_resume, metrics.engine_tokens); zero for a new
  // process.
  std::map<std::string, uint64_t> resume_seen;
  // Adds what each of `keys` in `counts` (this process's counters) grew by
  // since last seen to `totals`.
  void AddGrowth(const nlohmann::json& counts, std::initializer_list<const char*> keys,
                 std::map<std::string, uint64_t>& totals);
  bool kv_capable = true;

  // Recovery bookkeeping for the next time this slot becomes ready.
  std::optional<int64_t> recovery_failover_id;
  int64_t recovery_fault_ms = 0;
  std::string recovery_cause;  // "" when this start is not a recovery
  // The next ready is a recovery of `cause` from fault_ms, and belongs to
  // failover `id` when one is given (else to the one it belonged to).
  void NoteRecovery(const std::string& cause, int64_t fault_ms, std::optional<int64_t> id) {
    recovery_cause = cause;
    recovery_fault_ms = fault_ms;
    if (id) recovery_failover_id = *id;
  }
  bool cache_recorded = false;
  std::string cache_result;    // "hit" | "miss" | "off"
  std::string cache_reason;

  RestartThrottle throttle;
  bool permanent_failure = false;
  std::string failure_reason;

  // Fault injected by a drill: the exit that follows is the drill's.
  bool drill_kill = false;
  int64_t drill_fault_ms = 0;

  // A rollout's engine version for this slot's next starts (its command
  // and env), instead of the node's; none outside a rollout.
  std::optional<EngineVersion> version;
  // What its process (the last one started or adopted) was started with;
  // none for an engine adopted from an older wsup's state.json.
  std::optional<EngineVersion> runs;
  std::string version_text;  // the same, as EngineVersionText shows it
};

}  // namespace wsup
