// The wsup-engine program as a library: starts the HTTP API at once (so
// /health and /wsup/status answer while loading, state "starting"), loads
// the model on a startup thread through timed phases, then serves
// completions from the scheduler (state "ready").
//
// Threads: the libuv loop runs on the caller of RunEngine() and owns every
// handle and HTTP connection; the startup thread loads; the scheduler thread
// computes. Both hand results to the loop through one uv_async.
//
// Routes: POST /v1/completions, GET /v1/models, GET /health (liveness: the
// loop, the scheduler and the communicator are alive), GET /wsup/status,
// POST /wsup/role (the supervisor's word on this engine's role and the
// node's KV pool: engine/kv_pool_link.h). The two /wsup routes take the
// supervisor's token when one was given ($WSUP_CONTROL_TOKEN,
// http/control_auth.h): 401 without it.
//
// Readiness: stdout gets "listening on HOST:PORT" as soon as the socket is
// bound; --ready-fd gets the same line, and is closed, once the engine is
// ready to serve (weights loaded, communicator warm, KV allocated, warmed up).
//
// /wsup/status: state ("starting", "ready", "stopping"); tp and ep (the
// expert-parallel size: 1, or tp under --ep-size/--expert-parallel); weights {mode,
// layout "checkpoint"|"engine", source "holder"|"published"|"disk"
// ("published": this engine wrote the engine-made layout it computes from;
// "holder": it attached one), miss_reason (client mode that fell back),
// diffs, ms}; phases {name: ms} for context, weights, communicator, kv_cache,
// graph_capture (0: skipped on the CPU), warmup, listening; comm {kind,
// ranks, warm, last_keepalive_ms (since the last keepalive succeeded),
// keepalive_latency_us, keepalives, keepalive_failures, error}; kv_cache
// and requests counters; role ("standby" until told otherwise) and kv
// {source "pool"|"scratch"|"private", bytes (per rank, usable now),
// scratch_bytes, pool_bytes, pool_id, pool_mapped, pool_closing,
// pool_blocks_in_use, mapped_at_ms and released_at_ms (wall clock, the
// last time), map_ms}; memory {weights_bytes, kv_bytes, other_bytes} (all
// ranks; other: what this process holds beyond its own KV: on the CPU its
// resident anonymous memory, on GPUs what the driver charges to it
// (gpu_used_bytes, through NVML), absent where that cannot be read;
// graphs_bytes: what capturing the decode graphs added to it).
//
// Exit codes: 0 after SIGTERM/SIGINT; 1 a failure a retry may cure (I/O,
// holder unavailable in daemon mode); 2 a usage error; 78 (EX_CONFIG) a
// permanent refusal (fingerprint mismatch in daemon mode, bad or unsupported
// checkpoint): restarting unchanged will not help, and the supervisor does
// not restart an engine that exits with it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/exit_codes.h"
#include "common/status.h"

namespace wsup::engine {

// The engine's codes, from the one table (common/exit_codes.h).
inline constexpr int kEngineExitOk = kExitOk;
inline constexpr int kEngineExitFailure = kExitFailure;
inline constexpr int kEngineExitUsage = kExitUsage;
inline constexpr int kEngineExitRefused = kExitConfig;  // every permanent refusal

struct EngineOptions {
  std::string model_dir;
  std::string model_name;  // served as "model"; default: the model folder's name
  std::string host = "127.0.0.1";
  int port = 0;
  std::string weight_cache = "off";  // daemon | client | off
  std::string socket;                // holder socket(s), one per rank, comma-separated
  std::string revision;              // fingerprint revision label (as given to the holder)
  // checkpoint: attach the checkpoint's tensors a holder loaded; engine:
  // attach (or publish, once) this engine's own layout in a holder started
  // with --layout engine (engine/layout_publish.h). Host memory only.
  std::string layout = "checkpoint";
  int64_t layout_wait_ms = 600'000;  // engine: longest wait for another engine's commit
  std::string device = "cpu";        // cpu | cuda:N[,M...]
  int tp = 1;                        // ranks (threads) for --device cpu
  // Expert parallelism (mixture-of-experts models): each rank holds whole
  // experts instead of a slice of every one. --ep-size is 1 or the tp size
  // (the supervisor's {ep}, the holders' --ep-size); --expert-parallel sets
  // it to the tp size, as vLLM's --enable-expert-parallel does.
  int ep_size = 1;
  bool expert_parallel = false;
  int64_t kv_cache_mib = 64;         // per rank (a private cache)
  // The node's KV pool (engine/kv_pool_link.h): the holders' pools, mapped
  // while the supervisor makes this engine their owner, beside a scratch
  // of its own (per rank) that serves probes and the first requests.
  bool kv_pool = false;
  int64_t kv_scratch_mib = 64;
  int64_t dequant_scratch_mib = 32;  // cuda: engine/cuda/cuda_engine.h MakeCudaRank
  // cuda: wide products over bfloat16 weights: "split" (activations as two
  // bfloat16 terms, close to float32) or "bf16" (one term, twice as fast).
  std::string matmul = "split";
  int nccl_max_ctas = 0;             // cuda: RunnerOptions::nccl_max_ctas
  int64_t comm_keepalive_ms = 1000;
  // Adopting a crashed engine's KV (docs/kv_journal.md): how long a
  // resumed request waits for the pool, and how long the dead engine's
  // pages are kept for the resumes after the pool opened.
  int64_t kv_adopt_wait_ms = 2000;
  int64_t kv_adopt_keep_ms = 10'000;
  // Each step takes at least this long (drills and demos; 0: off).
  int64_t min_step_ms = 0;
  // A step's prefill is sized to end within this (engine/step_budget.h);
  // -1: the backend's default (kMaxStepMsCuda, kMaxStepMsCpu); 0: off.
  int64_t max_step_ms = -1;
  int ready_fd = -1;
  // This start's identity, echoed as "nonce" in GET /wsup/status so the
  // supervisor can tell its engine from anything else answering on the port.
  // Default: $WSUP_ENGINE_NONCE (the supervisor sets it).
  std::string nonce;
  // The supervisor's secret for the control routes (GET /wsup/status, POST
  // /wsup/role: http/control_auth.h), from $WSUP_CONTROL_TOKEN only: a flag
  // would show it to every user in /proc/PID/cmdline. Empty: the routes
  // answer anyone (an engine run by hand), and a warning says so.
  std::string control_token;
  int max_batch = 64;
  int threads = 0;  // compute threads per rank; 0: usable CPUs (affinity) / tp
  int block_size = 16;
  // HTTP limits and timeouts.
  size_t max_body_bytes = 1 << 20;
  int64_t header_timeout_ms = 10'000;
  int64_t idle_timeout_ms = 60'000;
};

// Usage errors, each naming the flag and what to pass instead.
Status ValidateEngineOptions(const EngineOptions& opts);

// The expert-parallel size the options ask for at tensor-parallel size tp:
// 1, or tp.
int EngineEpSize(const EngineOptions& opts, int tp);

// Serves until SIGTERM/SIGINT or a fatal startup error; returns the exit code.
int RunEngine(const EngineOptions& opts);

}  // namespace wsup::engine
