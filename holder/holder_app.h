// The wsup-holder program as a library: validates its configuration, builds
// the arena (from the checkpoint on disk, or adopted from inherited fds plus
// an arena record, reading nothing from disk), serves it on the holder
// socket until SIGTERM or SIGINT, and exits cleanly. With --layout engine
// it loads nothing and serves the layouts engines publish into it
// (holder/layout_store.h; host memfds, or VMM memory on --device with
// --backend cuda), up to --layout-max-bytes of them, starting with the
// committed layouts a supervisor kept (--adopt-layouts: each one that
// disagrees with its fds is refused and its fds closed, and the holder
// starts with the others). holder_main.cc only parses flags into a
// HolderConfig.
//
// Either kind of holder makes the node's KV pool for its rank at start
// (--kv-pool-mib N; holder/kv_pool.h), on its backend and device, or adopts
// the one a supervisor kept (--adopt-kv-pool). A kept pool that is refused
// (its record damaged, or disagreeing with its fds) is logged with the
// record and the fix, its fds are closed, and a fresh pool is made: the
// weights matter more than what the KV held, so that never stops a start.
// A pool that cannot be made (out of memory) does (exit 1).
//
// Readiness is proven, not assumed: with --ready-fd N the holder writes
// "ready <socket>\n" to fd N and closes it once the socket accepts, which a
// supervisor (or a test) tells apart from "spawned".
//
// Exit codes: 0 after SIGTERM/SIGINT; 1 a failure that may pass on a retry
// (I/O, no device, socket busy); 2 a usage error; 3 a permanent refusal (bad
// or refused checkpoint, inconsistent arena record): restarting will not help.
//
// RunHolder runs the libuv loop on the calling thread and installs signal
// watchers for SIGTERM and SIGINT; call it once per process.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "common/exit_codes.h"
#include "common/status.h"

namespace wsup {

// The holder's exit codes are the shared ones (common/exit_codes.h).
inline constexpr int kHolderExitOk = kExitOk;
inline constexpr int kHolderExitFailure = kExitFailure;
inline constexpr int kHolderExitUsage = kExitUsage;
inline constexpr int kHolderExitRefused = kExitRefused;

struct HolderConfig {
  // "checkpoint": one arena loaded from model_dir (or adopted); "engine":
  // no checkpoint, the layouts engines publish (wire/layout_protocol.h).
  std::string layout = "checkpoint";
  std::string model_dir;    // required unless adopting or layout "engine"
  std::string socket_path;  // required
  std::string backend;      // "host" or "cuda"; empty: host (or the adopted arena's)
  int device = 0;
  std::optional<int> tp_size;  // empty: 1 (or the adopted arena's)
  std::optional<int> tp_rank;
  // Expert parallelism: empty: 1 (or the adopted arena's). ep_size is 1 or
  // tp_size; the rank holds experts [ep_rank*E/ep_size, (ep_rank+1)*E/ep_size).
  std::optional<int> ep_size;
  std::optional<int> ep_rank;
  int ready_fd = -1;
  std::string deployment;
  std::string revision;
  std::string adopt_manifest;  // arena record (wire/protocol.h ArenaRecord)
  std::string adopt_fds;       // "3,4,...": inherited fds, one per allocation in order
  // --layout engine: the kept layouts to adopt (wire/layout_record.h; the
  // fds it names are inherited), and the cap on layout memory (0: none).
  std::string adopt_layouts;
  int64_t layout_max_bytes = 0;
  // The node's KV pool (holder/kv_pool.h): its size in MiB (0: none), and
  // the record of a kept pool to adopt (wire/kv_pool_record.h; the fds it
  // names are inherited). Either layout has one.
  int64_t kv_pool_mib = 0;
  std::string adopt_kv_pool;
  int read_threads = 4;
  int handshake_timeout_ms = 10'000;
  int idle_timeout_ms = 60'000;  // holder/server.h, "Limits"
  int max_connections = 1000;
};

// Usage errors (exit 2), each naming the flag and what to pass instead.
Status ValidateHolderConfig(const HolderConfig& cfg);

// "3,4,5" -> {3, 4, 5}; refuses anything but a list of fds >= 3.
Result<std::vector<int>> ParseFdList(const std::string& text);

// Serves until SIGTERM/SIGINT; returns the exit code. Logs every failure
// with the thing it concerns and the fix.
int RunHolder(const HolderConfig& cfg);

}  // namespace wsup
