// A wsup node for the drill tests: `wsup start config/<config>` (demo.toml
// unless told) on a test checkpoint (llama-tiny-f32 unless told), every port
// chosen by the kernel and every path in a temporary directory. Start()
// overrides the folders, ports, model.path, the engine program (the tested
// build's), the probe timing and the restart budget; everything else, the
// revision and the probe's expected answer included, is the config's own,
// then the spec's `sets`. The destructor stops it (`wsup stop`) and kills
// whatever it left behind by the pids in its state.json.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/failover_drill.h"
#include "bench/failover_load.h"
#include "tests/sanitized.h"
#include "tests/test_util.h"

namespace wsup::test {

// The supervisor's probe interval and timeout. The probes share the
// engines with 16 busy clients on a small machine: a tight timeout would
// trip a healthy, loaded engine and add failovers the test did not ask for.
// Sanitizer builds run the engines several times slower.
#if WSUP_TEST_SANITIZED
inline constexpr bool kSanitized = true;
inline constexpr int kDrillProbeMs = 3000;
#else
inline constexpr bool kSanitized = false;
inline constexpr int kDrillProbeMs = 1000;
#endif

// Which node a DrillNode starts.
struct DrillNodeSpec {
  std::string config = "demo.toml";      // a file in config/
  std::string model = "llama-tiny-f32";  // a checkpoint in the test data
  std::vector<std::string> sets;         // more `--set` overrides, applied last
  // Engines take the node's KV pool (the config must make one: [kv]
  // pool_mib): --kv-pool --kv-scratch-mib {kv_scratch_mib}.
  bool kv_pool = false;
  // More engine arguments, at the command's end (unless command_in_file).
  std::vector<std::string> engine_args;
  // A program (and its arguments) that runs the engine's command, put in
  // front of it (unless command_in_file): a wrapper that misbehaves.
  std::vector<std::string> engine_prefix;
  // A config file of the test's own instead of config/<config>; with
  // command_in_file its [engine] command and model.path are used as
  // written (a reload test edits them), else they are overridden as for
  // the others.
  std::string config_file;
  bool command_in_file = false;
  // Added to the supervisor's environment (NOTIFY_SOCKET, say).
  std::vector<std::pair<std::string, std::string>> env;
};

// The tested build's engine command as a TOML array (what Start() sets,
// unless the spec keeps the file's), with `extra` arguments at its end.
std::string EngineCommandToml(bool kv_pool, const std::vector<std::string>& extra = {},
                              const std::vector<std::string>& prefix = {});

class DrillNode {
 public:
  explicit DrillNode(std::vector<std::string> extra_sets = {});
  explicit DrillNode(DrillNodeSpec spec);
  ~DrillNode();
  DrillNode(const DrillNode&) = delete;
  DrillNode& operator=(const DrillNode&) = delete;

  void Start();
  // Serving with two semantically ready engines, within `limit`.
  bool WaitServing(std::chrono::milliseconds limit = std::chrono::seconds(120)) const;
  std::optional<nlohmann::json> Status() const;
  int FrontPort() const;

  std::string SupervisorSocket() const { return dir_.Join("run/wsup.sock"); }
  std::string FrontSocket() const { return dir_.Join("run/front.sock"); }
  std::string Log() const { return ReadAll(dir_.Join("supervisor.log")); }
  // The last `lines` lines of the supervisor's log and of every child's
  // (engines, holders, the front), each under its name: what a failed
  // drill test prints, so a rare failure can be read from CI's output.
  std::string LogTails(size_t lines = 400) const;
  std::string ConfigPath() const;
  // Runs `wsup ARGS... --socket <the supervisor's socket>`.
  RunResult Cli(std::vector<std::string> args) const;
  const TempDir& dir() const { return dir_; }
  // The control token the supervisor gave the engine of `slot` (its
  // /wsup/status and /wsup/role answer no one else), from the node's 0600
  // state.json; "" when none is recorded.
  std::string ControlToken(const std::string& slot) const;
  // The supervisor's process (a test that kills it calls Start() again).
  Child& sup() { return sup_; }

 private:
  TempDir dir_;
  DrillNodeSpec spec_;
  Child sup_;
};

// The engine of `wsup status --json` with this role ("active", "standby"), or null.
nlohmann::json EngineOf(const nlohmann::json& status, const std::string& role);

// Closed-loop clients on the node's front asking the golden prompts (each
// request may take up to a minute: the engines share a small machine).
bench::LoadOptions DrillLoad(const DrillNode& node, int clients);

// Drills paced as the tests pace them: 100 ms and `min_requests_between`
// answers between two, up to two minutes for the node to be ready again.
bench::DrillPlan DrillPlanOf(int crash, int planned, int hang, int min_requests_between);

// The analysis (bench::Analyze) of a drilled load: no request failed, was
// lost, duplicated or wrong, and every one was answered.
void CheckNothingLost(const nlohmann::json& analysis);

}  // namespace wsup::test
