// Failover drills against a target, for wsup-bench-failover and the CI drill
// test (tests/drills).
//
// A DrillTarget knows how to tell that the pair of engines behind a proxy is
// ready for the next drill, how to crash its active engine (SIGKILL of the
// engine's process group, by pid, timed here) or swap it in a planned way,
// and how to see the moment the proxy stopped sending new requests to the
// old engine (the swap):
//
//   WsupTarget     the wsup front; the supervisor's control socket gives the
//                  engines' pids and readiness and runs planned drills
//                  ({"type":"failover","drill":true}); the front's control
//                  socket shows its routes (polled) and its own switches
//                  (`switched` events) and counts resumed/retried requests.
//   HaproxyTarget  HAProxy with server `primary` and `backup` on the same
//                  engines (bench/failover.sh writes the config); the stats
//                  socket shows the servers' state and retries; a planned
//                  drill drains the primary (`set server ... state drain`)
//                  and readies it again before the next drill. The engines'
//                  pids come from the wsup supervisor, which restarts a
//                  killed engine on its port.
//
// RunDrills takes crash, planned and hang drills in turn under a LoadGenerator.
// Threads: a target is used by one thread at a time.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "testkit/control_client.h"
#include "testkit/failover_load.h"
#include "common/status.h"

namespace wsup::test {

class DrillTarget {
 public:
  virtual ~DrillTarget() = default;
  virtual std::string name() const = 0;
  // Blocks until the next drill can run: both engines proven and routed.
  virtual Status WaitReady(std::chrono::milliseconds limit) = 0;
  // Runs one drill; fills t0_us, swap_us and swap_source.
  virtual Status Crash(DrillRecord* d) = 0;
  virtual Status Planned(DrillRecord* d) = 0;
  // SIGSTOP of the active engine's process group: a hang, not a death.
  // Whoever swaps it away must also end it (wsup's supervisor kills the
  // engine it fails over from).
  virtual Status Hang(DrillRecord* d) = 0;
  // Counters of resumed and retried requests so far (cumulative).
  virtual Status Counters(int64_t* resumed, int64_t* retried) = 0;
  // Undo what a planned drill changed, before the next drill.
  virtual Status AfterDrill(const DrillRecord&) { return Status::Ok(); }
};

struct WsupTargetOptions {
  std::string supervisor_socket;  // <runtime_dir>/wsup.sock
  std::string front_socket;       // <runtime_dir>/front.sock
};

struct HaproxyTargetOptions {
  std::string stats_socket;
  std::string backend = "engines";
  std::string primary = "primary";  // server names in the backend
  std::string backup = "backup";
  int primary_port = 0;             // the engine ports behind them
  int backup_port = 0;
  std::string supervisor_socket;    // the wsup node that runs (and restarts) the engines
};

std::unique_ptr<DrillTarget> MakeWsupTarget(WsupTargetOptions o);
std::unique_ptr<DrillTarget> MakeHaproxyTarget(HaproxyTargetOptions o);

struct DrillPlan {
  int crash = 10;
  int planned = 10;
  int hang = 0;  // taken in turn with the others: crash, planned, hang, crash, ...
  // At least this long between drills (load flows undisturbed), and at
  // least min_requests_between answers completed.
  std::chrono::milliseconds gap{1000};
  uint64_t min_requests_between = 20;
  // Total run time wanted; the gap grows to spread the drills over it.
  std::chrono::milliseconds total{0};
  std::chrono::milliseconds ready_limit{60'000};
  // After a drill: wait (bounded) for an ok answer sent after it before the
  // next drill, so each drill's window has its first correct response.
  std::chrono::milliseconds recover_limit{30'000};
  bool verbose = true;
};

// Runs the plan (crash, planned, crash, ...) while `load` runs. Drills that
// could not run are an error; the records of those that ran are kept in `out`.
Status RunDrills(DrillTarget& target, LoadGenerator& load, const DrillPlan& plan, std::vector<DrillRecord>* out);

}  // namespace wsup::test
