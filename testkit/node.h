// A wsup node under test: the real `wsup start` (holders, engines, front)
// on a test checkpoint, on the CPU, with every port chosen by the kernel
// and every path in a temporary directory. One fixture for the end-to-end
// suites (tests/node, tests/chaos) and the drills (tests/drills,
// tests/openai), which differ only in their NodeSpec.
//
// Start() runs `wsup start config/<config>` (demo.toml unless told) with
// overrides: the folders, the ports, the probe's timing, the engine command
// (the tested build's) and model.path (unless the spec keeps the file's),
// then the spec's own `sets`, last. Everything else, the probe's expected
// answer included, is the config's.
//
// Every process of a node carries WSUP_TEST_NODE=<its directory> in its
// environment (the supervisor passes its environment on), so the destructor
// ends whatever the node left running, whether the test passed or not and
// whatever the test did to the supervisor.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "testkit/sanitized.h"
#include "testkit/test_util.h"

namespace wsup::test {

// The end-to-end suites' probe interval and timeout. Sanitizer builds run
// the engines several times slower: the probe's budget grows with them, and
// so does every bound a test derives from it.
#if WSUP_TEST_SANITIZED
inline constexpr int kNodeProbeMs = 1000;
#else
inline constexpr int kNodeProbeMs = 150;
#endif

// Which node a Node starts.
struct NodeSpec {
  std::string config = "demo.toml";  // a file in config/
  // A config file of the test's own instead of config/<config>; the same
  // overrides apply (a reload reads the file again), unless command_in_file,
  // which keeps its [engine] command and model.path as written.
  std::string config_file;
  bool command_in_file = false;
  std::string model = "llama-tiny-f32";  // a test checkpoint's name, or a path
  std::vector<std::string> sets;         // more `--set` overrides, applied last
  // Engines take the node's KV pool (the config must make one: [kv]
  // pool_mib): --kv-pool --kv-scratch-mib {kv_scratch_mib}.
  bool kv_pool = false;
  // More engine arguments, at the command's end.
  std::vector<std::string> engine_args;
  // A program (and its arguments) put in front of the engine's command: a
  // wrapper that misbehaves.
  std::vector<std::string> engine_prefix;
  // Added to the supervisor's environment (NOTIFY_SOCKET, say).
  std::vector<std::pair<std::string, std::string>> env;
  int probe_ms = kNodeProbeMs;  // the probe's interval and timeout; 0: the config's (and its jitter)
  int probe_failures = 3;       // 0: the config's
  // Restarts at once, with a budget no run of drills exhausts (every crash
  // drill is a restart).
  bool unlimited_restarts = false;
};

// The tested build's engine command as a TOML array, with `extra` arguments
// at its end and `prefix` in front.
std::string EngineCommandToml(bool kv_pool, const std::vector<std::string>& extra = {},
                              const std::vector<std::string>& prefix = {});

// The engine of a status (`wsup status --json`) with this role ("active",
// "standby"), or null.
nlohmann::json EngineOf(const nlohmann::json& status, const std::string& role);

// The value of one unlabelled (or fully labelled) series in a /metrics
// text, -1 if absent.
double MetricValue(const std::string& text, const std::string& name);

class Node {
 public:
  explicit Node(NodeSpec spec = {});
  ~Node();
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  // `wsup CMD <config> --set ...`, with the overrides Start() gives.
  std::vector<std::string> Argv(const std::string& cmd) const;
  void Start();
  // `wsup stop`, and waits for the supervisor (a bounded wait).
  void Stop();
  // Uses a config file of the test's own from the next Start() on.
  void UseConfig(std::string path) { spec_.config_file = std::move(path); }

  std::string SupervisorSocket() const { return dir_.Join("run/wsup.sock"); }
  std::string FrontSocket() const { return dir_.Join("run/front.sock"); }
  std::string Db() const { return dir_.Join("state/wsup.db"); }
  std::string ConfigPath() const;
  const TempDir& dir() const { return dir_; }
  // The supervisor's process (a test that kills it calls Start() again).
  Child& sup() { return sup_; }
  // Every live process of this node (supervisor, front, holders, engines).
  std::vector<TaggedProcess> Processes() const;

  std::string Log() const { return ReadAll(dir_.Join("supervisor.log")); }
  // The last `lines` lines of the supervisor's log and of every child's
  // (engines, holders, the front), each under its name: what a failed test
  // prints, so a rare failure can be read from CI's output.
  std::string LogTails(size_t lines = 400) const;

  // The supervisor's status, or nullopt when it does not answer.
  std::optional<nlohmann::json> Status() const;
  // Waits until pred(status) holds, within limit.
  bool WaitStatus(const std::function<bool(const nlohmann::json&)>& pred, std::chrono::milliseconds limit) const;
  // Serving with two semantically ready engines, within limit.
  bool WaitServing(std::chrono::milliseconds limit = std::chrono::seconds(120)) const;
  int FrontPort() const;

  // The control token the supervisor gave the engine of `slot` (its
  // /wsup/status and /wsup/role answer no one else), from the node's 0600
  // state.json; "" when none is recorded.
  std::string ControlToken(const std::string& slot) const;
  // The same as an Authorization header; empty when none is recorded.
  std::vector<std::pair<std::string, std::string>> ControlAuth(const std::string& slot) const;
  // Runs `wsup ARGS... --socket <the supervisor's socket>`.
  RunResult Cli(std::vector<std::string> args) const;
  // The supervisor's /metrics (its admin listener); "" when it does not answer.
  std::string Metrics() const;
  // The /wsup/status of the engine with this role, asked with its control
  // token; nullopt when there is none or it does not answer.
  std::optional<nlohmann::json> EngineStatus(const std::string& role) const;

 private:
  TempDir dir_;
  NodeSpec spec_;
  Child sup_;
};

}  // namespace wsup::test
