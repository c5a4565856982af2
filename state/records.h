// The rows of the ledger, as the supervisor hands them over and as reports
// read them back. One struct per table; docs/state.md documents each column.
//
// Times named *_ms with a point in time are milliseconds since the Unix
// epoch (wall clock, so rows from different processes and restarts line
// up); durations are named after what they measure (attach_ms, restart_ms)
// or derived by SQLite from the time columns (detect_ms, recovery_ms, ...).
//
// Thread-safety: plain values.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace wsup {

// One switch of traffic from one engine slot to another.
struct FailoverRecord {
  int64_t id = 0;        // assigned by Ledger::RecordFailover
  std::string trigger;   // "crash" | "probe" | "hang" | "drill" | "rollout" (supervisor/engine_fsm.h)
  std::string reason;    // e.g. "exit signal 9", "3 probe failures: timeout after 800 ms"
  bool drill = false;    // a deliberate fault (wsup drill), not a real one
  std::string from_slot;
  std::string to_slot;
  int64_t fault_ms = 0;     // when the fault happened (or was injected)
  int64_t detected_ms = 0;  // when the supervisor knew
  int64_t swapped_ms = 0;   // when the front pointed at to_slot
  std::optional<int64_t> first_ok_ms;  // first good answer through the front after the swap
  // When the failed engine's process was seen to exit (its pidfd), and,
  // with a node KV pool, when the promoted engine had the pool mapped (its
  // full KV capacity back), which is never before gone_ms.
  std::optional<int64_t> gone_ms;
  std::optional<int64_t> kv_full_ms;
  // Happened while no supervisor ran; recorded by the next one from what it
  // could prove (the front's own log of its switch, the last saved state).
  bool reconstructed = false;

  // Derived by SQLite; filled when read back, ignored when written.
  int64_t detect_ms = 0;    // detected - fault
  int64_t swap_ms = 0;      // swapped - detected
  int64_t failover_ms = 0;  // swapped - fault
  std::optional<int64_t> outage_ms;  // first_ok - fault
  std::optional<int64_t> kv_back_ms; // kv_full - fault
};

// One weight-cache lookup by an engine (per rank when tp > 1).
struct CacheEventRecord {
  int64_t id = 0;
  int64_t time_ms = 0;
  std::string slot;
  std::optional<int64_t> rank;
  std::string result;       // "hit" | "miss"
  std::string mode;         // weight_cache.mode: "daemon" | "client" | "off"
  std::string miss_reason;  // "" on a hit; e.g. "fingerprint", "cold", "holder unreachable"
  std::string diff_json;    // "" on a hit; JSON array of {"field","ours","theirs"}
  std::optional<int64_t> attach_ms;  // hit: time to attach and map
  std::optional<int64_t> load_ms;    // miss: time of the fallback load from disk
};

// One engine becoming ready again after a fault (a new standby, or a restart).
struct RecoveryRecord {
  int64_t id = 0;
  std::optional<int64_t> failover_id;  // the failover that made it necessary, if any
  std::string slot;
  std::string cause;         // e.g. "crash", "probe", "drill", "holder", "cold start"
  int64_t fault_ms = 0;
  int64_t ready_ms = 0;
  std::string cache_result;  // "hit" | "miss" | "off"
  std::string cache_reason;  // the miss reason, "" otherwise
  std::string phases_json = "{}";  // the engine's /wsup/status phases (JSON object)

  int64_t recovery_ms = 0;   // derived: ready - fault
};

// One restart of a weight holder.
struct HolderRestartRecord {
  int64_t id = 0;
  int64_t time_ms = 0;  // when the restarted holder was ready
  int rank = 0;
  std::string reason;
  bool from_fds = false;  // adopted the kept fds (no disk read)
  int64_t restart_ms = 0;
};

// One change of an engine's health verdict (probes/hysteresis.h).
struct ProbeTransitionRecord {
  int64_t id = 0;
  int64_t time_ms = 0;
  std::string slot;
  std::string from_state;  // "unknown" | "healthy" | "unhealthy"
  std::string to_state;
  std::string cause;
};

// A rolling upgrade of the engines (`wsup reload`): written when it
// begins (outcome "running") and again, whole, when it ends.
struct RolloutRecord {
  int64_t id = 0;  // assigned by Ledger::RecordRollout
  int64_t started_ms = 0;
  std::optional<int64_t> ended_ms;
  std::string outcome;  // "running" | "done" | "rolled_back" | "refused" | "failed" | "interrupted"
  std::string reason;   // why it was rolled back, refused or failed; "" when done
  std::string command_before;  // the engine version (command and env) before
  std::string command_after;   // and the one it rolled to
  std::string steps_json;      // [{"step": "starting_new", "slot": "b", "at_ms": ...}, ...]
};

// An engine the supervisor killed for what it did rather than for how it
// failed: it mapped the node's KV pool, which was not its to map
// (supervisor/kv_pool.cc, CheckPoolTrespass).
struct FenceRecord {
  int64_t id = 0;  // assigned by Ledger::RecordFence
  int64_t time_ms = 0;
  std::string slot;
  int64_t pid = 0;
  std::string slot_state;  // the engine table's state when it was fenced ("standby", "active", ...)
  std::string kind;        // "kv_pool"
  std::string pool_owner;  // the slot the pool was the owner's of ("" when none)
  std::string reason;
};

}  // namespace wsup
