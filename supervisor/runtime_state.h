// RuntimeState: what a running supervisor has started, written to
// <runtime_dir>/state.json after every change, so that a supervisor started
// after a crash finds the front, the holders and the engines and re-adopts
// them instead of starting new ones.
//
// A process is identified by its pid AND its start time (from /proc), so a
// recycled pid is never mistaken for the engine it once was. Adoption then
// asks each process (holder info, engine status, front status) before it is
// trusted: the file says where to look, the processes say what is true.
//
// It also holds the engine version each engine runs and, while a rollout
// runs, the rollout's step and both versions, so that a restarted supervisor
// can leave both slots on one version (supervisor/rollout_fsm.h). A version
// holds engine.env's values, which may be secrets: the file is written with
// mode 0600, in node.runtime_dir (0700).
//
// The file is written under a temporary name and renamed, so a reader sees
// the old or the new state, never half of one. It is not fsynced: it only
// has to survive the supervisor's own death (the page cache outlives a
// process), and after a power loss or a reboot nothing it names runs any
// more. That makes a write cheap enough (tens of microseconds) to happen on
// the loop right after every spawn, so no child is ever running unrecorded.
//
// Thread-safety: plain values; Save/Load on any thread.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "supervisor/engine_version.h"

namespace wsup {

struct ProcessRef {
  pid_t pid = 0;
  uint64_t start_time = 0;  // /proc/PID/stat field 22
  // True when a process with this pid exists and started at start_time.
  bool StillRunning() const;
  // Reference to a live process (reads its start time).
  static Result<ProcessRef> Of(pid_t pid);
};

struct RuntimeState {
  static constexpr int kVersion = 1;

  std::string config_path;
  std::string node_name;
  ProcessRef supervisor;
  int64_t epoch = 0;  // route epoch last sent to the front
  // Wall time of this snapshot: the last moment the writing supervisor knew
  // the processes below to be in the roles written. A restarted supervisor
  // dates what happened while none ran from it.
  int64_t saved_ms = 0;

  struct Front {
    ProcessRef proc;
    std::string control_socket;
    std::string listen;  // "host:port" actually bound
  };
  std::optional<Front> front;

  struct Holder {
    int rank = 0;
    ProcessRef proc;
    std::string socket;
    std::string record_path;  // the keeper's arena record (manifest + fingerprint)
  };
  std::vector<Holder> holders;

  struct Engine {
    std::string slot;  // "a" | "b"
    ProcessRef proc;
    int port = 0;
    std::string role;  // "active" | "standby" | "starting"
    int64_t started_ms = 0;
    std::string cache_result;  // "hit" | "miss" | "off" | ""
    std::string nonce;         // the per-start nonce the engine was given (WSUP_ENGINE_NONCE)
    std::optional<EngineVersion> version;  // what it was started with (none: written by an older wsup)
    // The secret of its control routes (WSUP_CONTROL_TOKEN, http/control_auth.h):
    // kept here, in a 0600 file, so that a restarted supervisor can still ask
    // the engine its status and set its role.
    std::string control_token;
  };
  std::vector<Engine> engines;
  // The engine slot that may map the node's KV pool ("" when none): a
  // restarted supervisor must not give the pool to another before that one
  // let it go or is gone (supervisor/kv_handover.h).
  std::string kv_pool_owner;
  // The version the node starts engines with (its engine.command and env;
  // a config file edited since takes effect at the next `wsup reload`).
  std::optional<EngineVersion> engine_version;

  // A rollout in progress (supervisor/rollout_fsm.h): what a restarted
  // supervisor needs to end it and leave both slots on one version.
  struct Rollout {
    int64_t id = 0;            // its ledger row
    std::string step;          // RollStateName()
    std::string new_slot, old_slot;
    int64_t started_ms = 0;
    EngineVersion from, to;    // the node's version before, and the one it rolls to
    bool new_proven = false;   // the new version passed its probe on new_slot
    bool rolling_back = false; // the roll was being rolled back
    std::string cause;         // why it was being rolled back
    std::string command_before, command_after;  // the row's texts (EngineVersionText)
    std::string steps_json;    // the row's steps so far
  };
  std::optional<Rollout> rollout;
  // What reading the file dropped as malformed (a version, the rollout),
  // for the caller to log; "" when nothing was.
  std::string dropped;

  std::string ToJson() const;
  static Result<RuntimeState> FromJson(const std::string& text, const std::string& path);

  static std::string PathIn(const std::string& runtime_dir);
  Status Save(const std::string& path) const;
  // nullopt when there is no file (a clean start).
  static Result<std::optional<RuntimeState>> Load(const std::string& path);
};

// `wsup stop` when no supervisor answers: what a node left behind (a
// supervisor that was killed, or died during a failed start) is found
// through <runtime_dir>/state.json. Each recorded process that still runs
// as recorded (pid and start time) gets SIGTERM to its group, then SIGKILL
// after timeout_ms; the file is removed once nothing it names runs. Returns
// one line per process stopped (empty: nothing was running). Refuses while
// the recorded supervisor itself still runs: it is hung, not gone, and
// must be dealt with first.
Result<std::vector<std::string>> StopLeftovers(const std::string& runtime_dir, int64_t timeout_ms);

}  // namespace wsup
