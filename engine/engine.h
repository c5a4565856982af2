// Engine: the wsup-engine process behind RunEngine() (engine_server.h),
// one class whose parts live in a file each:
//
//   engine_server.cc   the loop: Run(), the lifecycle (engine_state.h), shutdown
//   engine_startup.cc  the startup thread's timed phases (context, weights, ...)
//   engine_routes.cc   the HTTP routes and the completions in flight
//   engine_text.cc     POST /v1/chat/completions, /tokenize and /detokenize
//   engine_kv_role.cc  POST /wsup/role: the role and the node's KV pool
//   engine_status.cc   GET /wsup/status's JSON
//   engine_options.cc  the options' checks
//
// Threads: the libuv loop runs on the caller of Run() and owns every handle
// and HTTP connection; the startup thread loads; the scheduler thread
// computes. Both hand results to the loop through one mailbox. Members are
// grouped below by the threads that may touch them.
#pragma once

#include <uv.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/signals.h"
#include "common/status.h"
#include "engine/api.h"
#include "engine/engine_server.h"
#include "engine/engine_state.h"
#include "engine/kv_memory.h"
#include "engine/kv_pool_link.h"
#include "engine/runner.h"
#include "engine/scheduler.h"
#include "engine/weight_cache.h"
#include "http/mailbox.h"
#include "http/server.h"

namespace wsup::engine {

using SteadyTime = std::chrono::steady_clock::time_point;

// Milliseconds since t0; the steady clock in ms; the wall clock in ms.
double MsSince(SteadyTime t0);
int64_t MonoMs();
int64_t WallMs();

// "cpu" -> {}, "cuda:0,1" -> {0, 1}.
Result<std::vector<int>> ParseDevice(const std::string& d);

// Prompt tokens one step takes (longer prompts are split over steps); GPU
// step buffers are sized for it.
inline constexpr int kMaxStepTokens = 2048;
// --max-step-ms by backend (engine/step_budget.h): a GPU step of 50 ms is
// a few thousand prompt tokens of a large model; a CPU is slower at
// everything, and its probes' timeouts are sized for that.
inline constexpr int64_t kMaxStepMsCuda = 50;
inline constexpr int64_t kMaxStepMsCpu = 100;

// How the last mapping of the pool went, by part.
struct PoolMapParts {
  bool prefetched = false;  // its fds were fetched (and imported) ahead
  double fetch_ms = 0;      // getting the fds at the grant
  KvMemory::MapTimes times;
};

// One completion in flight, on the loop thread.
struct Pending {
  std::shared_ptr<http::ResponseWriter> writer;
  CompletionText text;
  bool stream = false;
  bool token_ids = false;
  bool include_usage = false;
  int64_t prompt_tokens = 0;
  std::vector<int32_t> prompt;  // kept for prompt_token_ids (return_token_ids)
  std::vector<int32_t> tokens;
  std::unique_ptr<TokenText> stream_text;  // the stream's deltas
  bool sent_first = false;                 // a stream's first chunk is out
  bool chat = false;                       // a chat completion (its own shapes)
};

class Engine {
 public:
  explicit Engine(EngineOptions opts);

  int Run();

 private:
  using json = nlohmann::json;

  // ---- loop thread (engine_server.cc) ----
  // Takes the event through the lifecycle table and carries out its action.
  // exit_code and why (printed to stderr) are a shutdown's.
  void Fire(EngineEvent event, int exit_code = kEngineExitOk, const std::string& why = "");
  void OnStartupDone();
  void StartServing();
  void ShutDown(int code, const std::string& why);
  // Runs fn on the loop thread (from the scheduler thread).
  void OnLoop(std::function<void()> fn);
  void PrintPhases();
  void NotifyReady();
  const char* state_name() const { return EngineStateName(state_); }
  bool ready() const { return state_ == EngineState::kReady && scheduler_ != nullptr; }
  // --max-step-ms, or the backend's default (once the startup has run).
  int64_t MaxStepMs() const {
    if (opts_.max_step_ms >= 0) return opts_.max_step_ms;
    return gpu_devices_.empty() ? kMaxStepMsCpu : kMaxStepMsCuda;
  }

  // ---- loop thread (engine_routes.cc) ----
  void Route(std::shared_ptr<http::ResponseWriter> w);
  void HandleCompletion(const std::shared_ptr<http::ResponseWriter>& w);
  void HandleHealth(const std::shared_ptr<http::ResponseWriter>& w);
  void HandleModels(const std::shared_ptr<http::ResponseWriter>& w);
  void HandleChat(const std::shared_ptr<http::ResponseWriter>& w);
  // Ready to serve requests; otherwise answers 503 (retry once ready).
  bool ServesNow(const std::shared_ptr<http::ResponseWriter>& w);
  // What a request may ask of this model (once ready).
  ApiLimits Limits() const;
  // Submits a parsed completion or chat and keeps it in flight.
  void StartGeneration(const std::shared_ptr<http::ResponseWriter>& w, const CompletionRequest& r, bool chat);
  void HandleTokenize(const std::shared_ptr<http::ResponseWriter>& w);
  void HandleDetokenize(const std::shared_ptr<http::ResponseWriter>& w);
  // The chunk of a stream's new ids (their text from p's decoder).
  std::string StreamChunk(Pending& p, const std::vector<int32_t>& ids, const std::string& finish_reason);
  void OnEvents();
  void FinishPending(uint64_t id, Pending& p, const GenEvent& ev);
  void SendError(const std::shared_ptr<http::ResponseWriter>& w, int status, const std::string& message,
                 const std::string& type, std::vector<http::Header> extra = {});

  // ---- loop thread (engine_kv_role.cc, engine_status.cc) ----
  void HandleRole(const std::shared_ptr<http::ResponseWriter>& w);
  json KvJson();
  void HandleStatus(const std::shared_ptr<http::ResponseWriter>& w);
  json MemoryJson(const json& kv);

  // ---- startup thread (engine_startup.cc) ----
  void Startup();
  Status StartupPhases();
  void Phase(const std::string& name, double ms, const std::string& note = "");

  EngineOptions opts_;
  uv_loop_t loop_;
  // Work for the loop from the startup and scheduler threads; closed at
  // shutdown, after which their posts are dropped.
  std::unique_ptr<http::Mailbox> mailbox_;
  // SIGTERM and SIGINT: a clean stop (made once the loop is).
  std::unique_ptr<Signals> signals_;
  std::unique_ptr<http::HttpServer> http_;
  std::thread startup_thread_;
  int exit_code_ = kEngineExitOk;
  SteadyTime t_start_ = std::chrono::steady_clock::now();

  // Shared between the loop, startup and scheduler threads.
  std::mutex mu_;
  std::atomic<bool> cancel_startup_{false};
  Status startup_status_;
  std::vector<std::pair<std::string, double>> phases_;
  std::map<std::string, std::string> phase_notes_;
  WeightsReport weights_;
  std::vector<GenEvent> outbox_;
  bool outbox_posted_ = false;  // an OnEvents() is in the mailbox

  // Set by the startup thread before it finishes; read by the loop after.
  std::unique_ptr<ModelRunner> runner_;
  std::unique_ptr<TextCodec> text_;  // the checkpoint's tokenizer, or the byte one
  std::vector<int32_t> eos_;
  uint64_t kv_format_ = 0;  // KvFormat(): the KV journal's kv_format
  std::string comm_kind_;
  std::unique_ptr<KvPoolLink> pool_link_;  // --kv-pool
  int64_t graphs_bytes_ = -1;              // GPU memory the decode graphs took (NVML); -1: not known
  std::vector<int> gpu_devices_;           // set first by the startup thread
  // GPU memory each startup phase added (NVML; the context phase from 0),
  // and the reading after the last one (mu_).
  std::vector<std::pair<std::string, int64_t>> phase_gpu_;
  int64_t gpu_after_last_phase_ = -1;

  // Loop thread only.
  EngineState state_ = EngineState::kStarting;
  std::unique_ptr<Scheduler> scheduler_;
  std::map<uint64_t, Pending> pending_;
  uint64_t next_id_ = 0;
  std::mt19937_64 seed_rng_{std::random_device{}()};
  double listen_ms_ = 0;
  // wire/death_word.h: "armed", "absent" (no supervisor gave one) or what went wrong.
  std::string death_word_ = "absent";
  std::string role_ = "standby";
  int64_t pool_mapped_at_ms_ = 0, pool_released_at_ms_ = 0;
  int64_t gpu_read_ms_ = 0, gpu_used_ = -1;  // ProcessGpuMemory, cached
  bool gpu_warned_ = false;
  double pool_map_ms_ = 0;
  PoolMapParts pool_map_parts_;
};

}  // namespace wsup::engine
