// Config: the supervisor's one configuration file (TOML), read and checked
// once at start, before anything is spawned.
//
// LoadConfig() parses the file, applies `--set section.key=value` overrides,
// checks every key (names, types, ranges, and the rules that tie keys
// together) and returns a fully defaulted Config with every relative path made
// absolute against the config file's directory. Nothing is checked later:
// once a Config exists, the supervisor may trust it.
//
// Every error has exactly one form, so that editors and scripts can jump to
// it:
//   FILE:LINE:COL: KEY: what is wrong and what is allowed
// FILE is the path as given to LoadConfig; KEY is the dotted key
// ("probe.failures"), a section ("front") or, for TOML syntax errors where
// no key can be named, "syntax". Errors caused by an override name the
// override instead of the file: `--set:N:COL`, N being the 1-based position
// of the override among all overrides and COL the column inside its text
// (1 for the key, the first column of the value for a bad value).
// docs/config.md lists every key with its type, default and allowed values.
//
// Thread-safety: pure functions over values; call from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace wsup {

// host:port to listen on. host is an IPv4 literal, a bracketed IPv6 literal
// ("[::1]") or a host name; port 0 asks the kernel for a free port.
struct ListenAddress {
  std::string host;  // without brackets
  int port = 0;
  bool ipv6() const { return host.find(':') != std::string::npos; }
  // "127.0.0.1:8000", "[::1]:8000"
  std::string ToString() const;
};

// Parses "HOST:PORT". The error message says what is wrong and what is
// allowed, without a location (callers prefix it).
Result<ListenAddress> ParseListenAddress(std::string_view text);

// How engines get their weights (passed to engines as {mode}):
//   daemon: the supervisor runs one wsup-holder per rank, which loads the
//           weights once and keeps them resident; engines attach to it.
//   client: engines attach to a weight cache that the supervisor does not
//           start (an already running holder); on a miss they load from disk.
//   off:    no weight cache; every engine loads from disk.
enum class CacheMode { kDaemon, kClient, kOff };
// Where resident weights live: host memory (memfd) or GPU memory (CUDA VMM).
enum class CacheBackend { kHost, kCuda };
// What a holder keeps (passed as {layout}):
//   checkpoint: the checkpoint's own tensors, loaded by the holder;
//   engine:     the holder loads nothing (wsup-holder --layout engine); the
//               first engine publishes the layout it computes from and
//               every later engine attaches it (wire/layout_protocol.h).
enum class CacheLayout { kCheckpoint, kEngine };
// What a health probe checks (see probes/probe.h).
enum class ProbeKind { kSemantic, kPort };

const char* CacheModeName(CacheMode m);
const char* CacheBackendName(CacheBackend b);
const char* CacheLayoutName(CacheLayout l);
const char* ProbeKindName(ProbeKind k);

struct Config {
  std::string path;  // absolute path of the config file
  std::string dir;   // its directory; relative paths in the file are resolved against it
  // Where each key of the schema was written ("FILE:LINE:COL" or
  // "--set:N:COL"; its section's, or the file's top, for a key left out),
  // for checks made after loading: CheckConfigPaths, and a reload's
  // refusals (supervisor/reload_plan.h).
  std::map<std::string, std::string> where;
  // The --set overrides it was loaded with: a reload reads the file again
  // with the same ones.
  std::vector<std::string> overrides;

  struct Node {
    std::string name;
    std::string state_dir;    // absolute; holds wsup.db (the ledger)
    std::string runtime_dir;  // absolute; pids, sockets, the control socket
  } node;

  struct Model {
    std::string path;      // absolute
    std::string revision;  // operator label, "" when not set
  } model;

  struct Parallel {
    int tp = 1;
    std::vector<int> devices;  // cuda ordinals, one per rank; may be empty for host
    // Routed experts partitioned whole across the tp ranks (EP size = tp)
    // rather than each split by tensor parallelism.
    bool expert_parallel = false;
    int ep() const { return expert_parallel ? tp : 1; }
  } parallel;

  struct WeightCache {
    CacheMode mode = CacheMode::kDaemon;
    CacheBackend backend = CacheBackend::kHost;
    CacheLayout layout = CacheLayout::kCheckpoint;
    std::string socket;  // absolute; default <runtime_dir>/holder.sock
    // layout engine: the cap on each holder's layout memory (writing and
    // committed layouts; wsup-holder --layout-max-bytes); 0: none.
    int64_t layout_max_bytes = 0;
  } weight_cache;

  struct Engine {
    std::vector<std::string> command;  // template with {placeholders}; [0] made absolute if it has a '/'
    std::string host = "127.0.0.1";    // where engines listen and are probed
    int primary_port = 0;
    int standby_port = 0;
    int64_t ready_timeout_ms = 300'000;
    int64_t stop_timeout_ms = 10'000;  // SIGTERM to SIGKILL
    std::vector<std::pair<std::string, std::string>> env;  // sorted by name
  } engine;

  struct Probe {
    ProbeKind kind = ProbeKind::kSemantic;
    std::string prompt;
    std::optional<std::string> expect;                 // exactly one of these two
    std::optional<std::vector<int64_t>> expect_token_ids;  // for kind semantic
    int max_tokens = 16;
    int64_t interval_ms = 1000;
    int64_t timeout_ms = 1000;
    int failures = 3;
    int successes = 2;
    int64_t jitter_ms = 0;
    bool comm = false;               // also check GET /wsup/status comm.warm
    int64_t comm_max_age_ms = 10'000;  // how old comm.last_keepalive_ms may be
  } probe;

  struct Front {
    ListenAddress listen;
    int64_t queue_timeout_ms = 30'000;
    int max_queued = 1024;
    // Hedging on silence (front/proxy.h): 0 is off.
    int64_t hedge_after_ms = 0;
    int hedge_percent = 10;
    int hedge_burst = 16;
    // The front's worker loops (threads); 0: one per CPU it may run on.
    int loops = 0;
  } front;

  struct Admin {
    ListenAddress listen;
  } admin;

  struct Supervisor {
    int64_t restart_backoff_ms = 1000;
    int64_t restart_backoff_max_ms = 30'000;
    int max_restarts = 5;
    int64_t restart_window_ms = 600'000;
    // A rollout keeps the old version as the standby this long after the
    // new one took the traffic; a new active that fails meanwhile fails
    // over to it (a rollback).
    int64_t rollout_watch_ms = 10'000;
    std::string control_socket;  // absolute; default <runtime_dir>/wsup.sock
    std::string log_level = "info";
  } supervisor;

  // The node's KV pool (docs/architecture.md, "The KV pool"), per rank.
  struct Kv {
    // MiB each holder makes at its start and the supervisor keeps (daemon
    // mode; wsup-holder --kv-pool-mib); 0: no pool, engines keep their own.
    int64_t pool_mib = 0;
    // MiB of the standby engine's own small KV cache, for its probes and a
    // first request or two after a promotion.
    int64_t scratch_mib = 64;
  } kv;

  struct Holder {
    std::string binary;                // absolute, or "" for wsup-holder beside the wsup binary
    std::vector<std::string> command;  // overrides binary when not empty
    int64_t ready_timeout_ms = 600'000;
  } holder;

  // One model across several nodes (docs/config.md, [group]): this node is
  // member `index` of `size`; each member runs parallel.tp ranks of each
  // side, so the group's tensor-parallel size is tp x size. Members agree
  // through the etcd cluster at `etcd`. Absent: size 0, a node on its own.
  struct Group {
    std::string name;
    int index = 0;
    int size = 0;
    int head = 0;                   // the member whose rank 0 serves HTTP
    std::vector<std::string> etcd;  // endpoints, "http://HOST:PORT"
    int64_t lease_ttl_ms = 2000;
    bool enabled() const { return size > 0; }
  } group;
};

// Reads, overrides, checks. `overrides` are "section.key=value" strings as
// given to --set; each value is parsed as a TOML value and, when that fails,
// taken as a string (so --set node.name=a and --set probe.failures=5 both
// work). Unknown keys are refused the same way as in the file.
Result<Config> LoadConfig(const std::string& path, const std::vector<std::string>& overrides = {});

// The same on text already in memory; `path` is used in errors and to
// resolve relative paths (its directory, made absolute against the cwd).
Result<Config> ParseConfig(std::string_view text, const std::string& path,
                           const std::vector<std::string>& overrides = {});

// Placeholders allowed in [engine] command and [holder] command.
const std::vector<std::string>& EnginePlaceholders();
const std::vector<std::string>& HolderPlaceholders();

// Replaces every {name} in each argument by vars[name]. Braces that do not
// enclose a lower-case name ("{\"a\":1}") are left alone. An unknown name is
// an error naming it and listing `vars`.
Result<std::vector<std::string>> ExpandPlaceholders(const std::vector<std::string>& argv,
                                                    const std::map<std::string, std::string>& vars);

// The {devices} value: "cuda:0,1,2" for the configured devices, "cpu" when none.
std::string DevicesArg(const Config& config);

// The longest path a Unix socket may have (sun_path, less its terminating
// NUL). Every socket the node binds is checked against it when the config
// is loaded: the supervisor's control socket, <runtime_dir>/front.sock and
// each holder's socket.
inline constexpr size_t kMaxSocketPathBytes = 107;

// The socket of rank's holder: weight_cache.socket for tp = 1, else
// weight_cache.socket + "." + rank. An engine's {socket} lists every rank's,
// comma-separated, in rank order.
std::string HolderSocket(const Config& config, int rank);
std::string EngineSocketsArg(const Config& config);

// The argv of one engine listening on `port`, with every placeholder filled.
// `nonce` is this start's identity ({nonce}; also WSUP_ENGINE_NONCE in the
// engine's environment): an engine that echoes it in /wsup/status proves
// that it is the process the supervisor started.
// `ready_fd` fills {ready_fd}: the fd number in the engine of a pipe it may
// write one line to once it serves (see EngineAnnouncesReady).
Result<std::vector<std::string>> EngineArgv(const Config& config, int port, const std::string& nonce = "",
                                            int ready_fd = -1);

// True when engine.command passes {ready_fd}: the engine announces its
// readiness on an inherited fd, and the supervisor polls /wsup/status only
// after that line (or the fd's EOF) instead of from the spawn on.
bool EngineAnnouncesReady(const Config& config);

// The argv of the holder of `rank` (daemon mode); "" binary means the
// caller's default holder path, passed as `default_binary`.
Result<std::vector<std::string>> HolderArgv(const Config& config, int rank,
                                            const std::string& default_binary);

// One line per section, for logs and `wsup check`.
std::string DescribeConfig(const Config& config);

// What a loaded config names on this machine, checked without starting
// anything: model.path exists and holds config.json and safetensors files
// (or an index); the engine program and, in daemon mode, the holder program
// exist and are executable (`default_holder`: wsup-holder beside wsup); the
// state and runtime directories exist as writable folders or can be made.
// One error per problem, each "FILE:LINE:COL: KEY: what is wrong; the fix".
std::vector<Error> CheckConfigPaths(const Config& config, const std::string& default_holder);

// The members' configs of one group, each loaded: they must name the same
// group (name, size, head, etcd endpoints), run the same share of ranks
// (parallel.tp, parallel.expert_parallel) of the same model revision, and
// hold every index from 0 to size - 1 exactly once. One error per problem,
// each "FILE:LINE:COL: KEY: what is wrong; the fix". Configs without
// [group] beside ones with it are an error too.
std::vector<Error> CheckGroupConfigs(const std::vector<Config>& members);

// `wsup check CONFIG... [--set ...] [--no-paths]`: exit code 0 with a
// summary, or 1 with one error per line. `check_paths` false checks a
// config written for another machine (syntax, keys, types, rules only).
// Several configs are each checked, then, when they have [group], checked
// together as one group's members (CheckGroupConfigs). The CLI prints
// `output` (to stdout on 0, stderr on 1).
struct CheckOutcome {
  int exit_code = 0;
  std::string output;  // ends with a newline
};
CheckOutcome CheckConfig(const std::string& path, const std::vector<std::string>& overrides = {},
                         bool check_paths = false, const std::string& default_holder = "");
CheckOutcome CheckConfigs(const std::vector<std::string>& paths, const std::vector<std::string>& overrides = {},
                          bool check_paths = false, const std::string& default_holder = "");

}  // namespace wsup
