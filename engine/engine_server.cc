#include "engine/engine_server.h"

#include <signal.h>
#include <unistd.h>
#include <uv.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "checkpoint/fingerprint.h"
#include "common/fs.h"
#include "common/json_limits.h"
#include "engine/api.h"
#include "engine/cuda/cuda_engine.h"
#include "engine/gpu_memory.h"
#include "engine/kv_pool_link.h"
#include "engine/runner.h"
#include "engine/scheduler.h"
#include "engine/weight_cache.h"
#include "http/control_auth.h"
#include "http/mailbox.h"
#include "http/server.h"
#include "wire/death_word.h"

namespace wsup::engine {

namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

int64_t MonoMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now().time_since_epoch()).count();
}

int ExitCodeFor(const Error& e) {
  switch (e.code()) {
    case Code::kInvalidArgument: return kEngineExitUsage;
    case Code::kMismatch:
    case Code::kRefused:
    case Code::kCorrupt:
    case Code::kNotFound: return kEngineExitRefused;
    default: return kEngineExitFailure;
  }
}

// Prompt tokens one step takes (longer prompts are split over steps); GPU
// step buffers are sized for it.
constexpr int kMaxStepTokens = 2048;

// "cpu" -> {}, "cuda:0,1" -> {0, 1}.
Result<std::vector<int>> ParseDevice(const std::string& d) {
  if (d == "cpu") return std::vector<int>{};
  if (d.rfind("cuda:", 0) != 0) {
    return InvalidArgument("--device '" + d + "' is not one of cpu, cuda:N[,M...]");
  }
  std::vector<int> out;
  std::string rest = d.substr(5);
  size_t pos = 0;
  while (pos <= rest.size()) {
    size_t comma = rest.find(',', pos);
    if (comma == std::string::npos) comma = rest.size();
    std::string n = rest.substr(pos, comma - pos);
    if (n.empty() || n.size() > 3 || n.find_first_not_of("0123456789") != std::string::npos) {
      return InvalidArgument("--device '" + d + "': '" + n + "' is not a GPU ordinal; write cuda:0 or cuda:0,1");
    }
    out.push_back(std::stoi(n));
    pos = comma + 1;
  }
  return out;
}

// End-of-sequence ids from config.json (an integer or a list; absent: none).
std::vector<int32_t> EosTokens(const std::string& model_dir) {
  std::vector<int32_t> out;
  auto text = ReadFile(JoinPath(model_dir, "config.json"));
  if (!text.ok()) return out;
  // The checkpoint reader has already refused a config past the limit;
  // this read is bounded the same way on its own.
  auto parsed = ParseJsonChecked(*text, "config.json", "fix the model's config.json");
  if (!parsed.ok()) return out;
  json j = std::move(parsed).value();
  if (!j.is_object()) return out;
  auto it = j.find("eos_token_id");
  if (it == j.end()) return out;
  if (it->is_number_integer()) out.push_back(it->get<int32_t>());
  if (it->is_array()) {
    for (const auto& v : *it) {
      if (v.is_number_integer()) out.push_back(v.get<int32_t>());
    }
  }
  return out;
}

std::string DefaultModelName(const std::string& dir) {
  std::string d = dir;
  while (d.size() > 1 && d.back() == '/') d.pop_back();
  return BaseName(d);
}

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
  std::vector<int32_t> tokens;
};

// What this engine's KV bytes mean, for the KV journal (wire/kv_journal.h
// kv_format): the checkpoint's identity (its files and headers), its
// sharding, the backend and block size, and the version of this engine's
// KV layout. Another engine whose KV would differ in any of these never
// adopts these pages.
constexpr int kEngineKvLayoutVersion = 1;
uint64_t KvFormat(const Checkpoint& ckpt, int tp, int ep, bool cuda, int block_size) {
  FingerprintInputs in;
  in.shard.tp_size = tp;
  in.shard.ep_size = ep;
  const Fingerprint fp = Fingerprint::Compute(ckpt, in);
  std::string id = "wsup-engine kv " + std::to_string(kEngineKvLayoutVersion);
  for (const char* f : {"architecture", "checkpoint", "quant_method", "quant_config", "dtype"}) {
    id += std::string("|") + f + "=" + fp.Get(f);
  }
  id += "|tp=" + std::to_string(tp) + "|ep=" + std::to_string(ep) + "|backend=" + (cuda ? "cuda" : "cpu") +
        "|block=" + std::to_string(block_size);
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : id) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

class Engine {
 public:
  explicit Engine(EngineOptions opts) : opts_(std::move(opts)) {
    if (opts_.model_name.empty()) opts_.model_name = DefaultModelName(opts_.model_dir);
  }

  int Run();

 private:
  // ---- loop thread ----
  void OnStartupDone();
  void OnEvents();
  void Shutdown(int code);
  void Route(std::shared_ptr<http::ResponseWriter> w);
  void HandleCompletion(const std::shared_ptr<http::ResponseWriter>& w);
  void HandleStatus(const std::shared_ptr<http::ResponseWriter>& w);
  void HandleHealth(const std::shared_ptr<http::ResponseWriter>& w);
  void HandleModels(const std::shared_ptr<http::ResponseWriter>& w);
  void HandleRole(const std::shared_ptr<http::ResponseWriter>& w);
  json KvJson();
  json MemoryJson(const json& kv);
  // Runs fn on the loop thread (from the scheduler thread).
  void OnLoop(std::function<void()> fn);
  void SendError(const std::shared_ptr<http::ResponseWriter>& w, int status, const std::string& message,
                 const std::string& type, std::vector<http::Header> extra = {});
  void FinishPending(uint64_t id, Pending& p, const GenEvent& ev);
  void PrintPhases();
  void NotifyReady();

  // ---- startup thread ----
  void Startup();
  Status StartupPhases();
  void Phase(const std::string& name, double ms, const std::string& note = "");

  EngineOptions opts_;
  uv_loop_t loop_;
  // Work for the loop from the startup and scheduler threads; closed at
  // shutdown, after which their posts are dropped.
  std::unique_ptr<http::Mailbox> mailbox_;
  uv_signal_t sigterm_, sigint_;
  std::unique_ptr<http::HttpServer> http_;
  std::thread startup_thread_;
  int exit_code_ = kEngineExitOk;
  bool shutting_down_ = false;
  Clock::time_point t_start_ = Clock::now();

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
  std::string state_ = "starting";
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

// ---------------------------------------------------------------- startup

void Engine::Phase(const std::string& name, double ms, const std::string& note) {
  // On GPUs, what each phase added to the memory the driver charges to
  // this process: where a standby's own memory goes (memory.by_phase).
  int64_t gpu = -1;
  if (!gpu_devices_.empty()) {
    auto used = ProcessGpuMemory(gpu_devices_);
    if (used.ok()) gpu = static_cast<int64_t>(*used);
  }
  std::lock_guard<std::mutex> lk(mu_);
  phases_.emplace_back(name, ms);
  if (!note.empty()) phase_notes_[name] = note;
  if (gpu >= 0) {
    phase_gpu_.emplace_back(name, gpu - std::max<int64_t>(gpu_after_last_phase_, 0));
    gpu_after_last_phase_ = gpu;
  }
}

Status Engine::StartupPhases() {
  // Context: the checkpoint's headers and config, the device.
  auto t0 = Clock::now();
  WSUP_ASSIGN_OR_RETURN(std::vector<int> devices, ParseDevice(opts_.device));
  gpu_devices_ = devices;
  const int tp = devices.empty() ? opts_.tp : static_cast<int>(devices.size());
  std::string context_note = "cpu";
  if (!devices.empty()) {
    WSUP_ASSIGN_OR_RETURN(std::vector<std::string> names, InitCudaDevices(devices));
    context_note.clear();
    for (const auto& n : names) context_note += (context_note.empty() ? "" : ", ") + n;
  }
  WSUP_ASSIGN_OR_RETURN(Checkpoint ckpt, Checkpoint::Open(opts_.model_dir));
  const int ep = EngineEpSize(opts_, tp);
  WSUP_RETURN_IF_ERROR(ModelDims::From(ckpt.config(), tp, 0, ep).status());
  eos_ = EosTokens(opts_.model_dir);
  kv_format_ = KvFormat(ckpt, tp, ep, !devices.empty(), opts_.block_size);
  Phase("context", MsSince(t0), context_note);
  if (cancel_startup_) return Status::Ok();

  // Weights: holder or disk, then bound to the model on every rank.
  t0 = Clock::now();
  WeightCacheOptions wc;
  wc.model_dir = opts_.model_dir;
  wc.mode = opts_.weight_cache;
  wc.tp = tp;
  wc.ep = ep;
  wc.devices = devices;
  wc.revision = opts_.revision;
  wc.layout = opts_.layout;
  wc.layout_wait_ms = static_cast<uint64_t>(opts_.layout_wait_ms);
  if (opts_.weight_cache != "off") {
    WSUP_ASSIGN_OR_RETURN(wc.sockets, RankSockets(opts_.socket, tp));
  }
  WeightsReport report;
  auto weights = AcquireWeights(ckpt, wc, &report);
  if (!weights.ok()) {
    std::lock_guard<std::mutex> lk(mu_);
    weights_ = report;
    return weights.error();
  }
  RunnerOptions ro;
  ro.threads_per_rank = opts_.threads;
  ro.devices = devices;
  ro.ep = ep;
  ro.max_batch = opts_.max_batch;
  ro.max_step_tokens = kMaxStepTokens;
  ro.dequant_scratch_bytes = static_cast<uint64_t>(opts_.dequant_scratch_mib) << 20;
  ro.nccl_max_ctas = opts_.nccl_max_ctas;
  WSUP_ASSIGN_OR_RETURN(auto runner, ModelRunner::Create(ckpt.config(), std::move(*weights), ro));
  {
    std::lock_guard<std::mutex> lk(mu_);
    weights_ = report;
  }
  Phase("weights", MsSince(t0), report.source + ", mode " + report.mode);
  if (cancel_startup_) return Status::Ok();

  t0 = Clock::now();
  WSUP_RETURN_IF_ERROR(runner->InitCommunicator());
  Phase("communicator", MsSince(t0),
        std::string(runner->comm_kind()) + ", " + std::to_string(runner->tp()) + " rank" + (runner->tp() > 1 ? "s" : ""));

  t0 = Clock::now();
  if (opts_.kv_pool) {
    // The pool's shape fixes the block ids; it is mapped only when the
    // supervisor says so (POST /wsup/role).
    auto link = std::make_unique<KvPoolLink>(wc.sockets, 10'000);
    WSUP_ASSIGN_OR_RETURN(auto pools, link->Describe());
    WSUP_RETURN_IF_ERROR(
        runner->AllocatePooledKv(pools, static_cast<uint64_t>(opts_.kv_scratch_mib) << 20, opts_.block_size));
    pool_link_ = std::move(link);
  } else {
    WSUP_RETURN_IF_ERROR(runner->AllocateKv(static_cast<uint64_t>(opts_.kv_cache_mib) << 20, opts_.block_size));
  }
  {
    const KvLayout& kv = runner->kv_layout();
    Phase("kv_cache", MsSince(t0),
          kv.pooled() ? std::to_string(kv.scratch_blocks) + " scratch blocks and " + std::to_string(kv.pool_blocks) +
                            " in the node's pool (not mapped) of " + std::to_string(kv.block_size) + " tokens per rank"
                      : std::to_string(kv.scratch_blocks) + " blocks of " + std::to_string(kv.block_size) +
                            " tokens per rank");
  }

  t0 = Clock::now();
  // What the graphs take on the GPU: what the driver charges to this
  // process before and after (a standby's own memory is mostly these, its
  // context and its scratch).
  auto gpu_before = devices.empty() ? Result<uint64_t>(uint64_t{0}) : ProcessGpuMemory(devices);
  WSUP_ASSIGN_OR_RETURN(int graphs, runner->CaptureGraphs());
  auto gpu_after = devices.empty() ? Result<uint64_t>(uint64_t{0}) : ProcessGpuMemory(devices);
  if (graphs && gpu_before.ok() && gpu_after.ok() && *gpu_after >= *gpu_before) {
    graphs_bytes_ = static_cast<int64_t>(*gpu_after - *gpu_before);
  }
  Phase("graph_capture", graphs ? MsSince(t0) : 0,
        graphs ? std::to_string(graphs) + " decode graphs, batch 1 to " + std::to_string(opts_.max_batch) +
                     (graphs_bytes_ >= 0 ? ", " + std::to_string(graphs_bytes_ >> 20) + " MiB of GPU memory" : "")
               : std::string("cpu: none"));
  if (cancel_startup_) return Status::Ok();

  t0 = Clock::now();
  WSUP_RETURN_IF_ERROR(runner->Warmup());
  Phase("warmup", MsSince(t0));

  comm_kind_ = runner->comm_kind();
  runner_ = std::move(runner);
  return Status::Ok();
}

void Engine::Startup() {
  Status st = StartupPhases();
  std::lock_guard<std::mutex> lk(mu_);
  startup_status_ = st;
  mailbox_->Post([this] { OnStartupDone(); });
}

// ---------------------------------------------------------------- loop

int Engine::Run() {
  // First of all, so that a death while loading is seen at once too.
  if (auto armed = ArmDeathWordFromEnv(); !armed.ok()) {
    death_word_ = armed.error().message();
    spdlog::warn("{}; the supervisor will see this engine's death through its lifeline only", death_word_);
  } else if (*armed) {
    death_word_ = "armed";
  }
  uv_loop_init(&loop_);
  mailbox_ = std::make_unique<http::Mailbox>(&loop_);
  sigterm_.data = this;
  sigint_.data = this;
  uv_signal_init(&loop_, &sigterm_);
  uv_signal_init(&loop_, &sigint_);
  auto on_signal = [](uv_signal_t* s, int signum) {
    spdlog::info("signal {}: shutting down", signum);
    static_cast<Engine*>(s->data)->Shutdown(kEngineExitOk);
  };
  uv_signal_start(&sigterm_, on_signal, SIGTERM);
  uv_signal_start(&sigint_, on_signal, SIGINT);

  http::ServerOptions so;
  so.host = opts_.host;
  so.port = opts_.port;
  so.limits.max_body_bytes = opts_.max_body_bytes;
  so.header_timeout_ms = opts_.header_timeout_ms;
  so.idle_timeout_ms = opts_.idle_timeout_ms;
  so.server_name = "wsup-engine";
  http_ = std::make_unique<http::HttpServer>(&loop_, so, [this](std::shared_ptr<http::ResponseWriter> w) { Route(std::move(w)); });
  auto t0 = Clock::now();
  Status st = http_->Listen();
  listen_ms_ = MsSince(t0);
  if (!st.ok()) {
    std::fprintf(stderr, "wsup-engine: %s\n", st.error().message().c_str());
    exit_code_ = kEngineExitFailure;
    Shutdown(kEngineExitFailure);
  } else {
    std::printf("listening on %s:%d\n", opts_.host.c_str(), http_->port());
    std::fflush(stdout);
    if (opts_.control_token.empty()) {
      spdlog::warn("{} is not set: GET /wsup/status and POST /wsup/role answer anyone who reaches port {}; an engine "
                   "run by wsup always gets one",
                   http::kControlTokenEnv, http_->port());
    }
    spdlog::info("model {} from {}: loading (weight cache {}, device {}, tp {})", opts_.model_name, opts_.model_dir,
                 opts_.weight_cache, opts_.device, opts_.tp);
    startup_thread_ = std::thread([this] { Startup(); });
  }
  uv_run(&loop_, UV_RUN_DEFAULT);
  if (startup_thread_.joinable()) startup_thread_.join();
  scheduler_.reset();
  pool_link_.reset();  // a prefetch in flight prepares into the runner
  runner_.reset();
  http_.reset();
  int rc = uv_loop_close(&loop_);
  if (rc != 0) spdlog::warn("event loop closed with handles open: {}", uv_strerror(rc));
  return exit_code_;
}

void Engine::OnLoop(std::function<void()> fn) {
  // What comes after the shutdown began is dropped (the server is closing).
  mailbox_->Post([this, fn = std::move(fn)] {
    if (!shutting_down_) fn();
  });
}

void Engine::OnStartupDone() {
  Status st;
  {
    std::lock_guard<std::mutex> lk(mu_);
    st = startup_status_;
  }
  if (shutting_down_) return;
  if (!st.ok()) {
    const int code = ExitCodeFor(st.error());
    std::fprintf(stderr, "wsup-engine: startup failed: %s\n", st.error().message().c_str());
    Shutdown(code);
    return;
  }
  SchedulerOptions so;
  so.max_batch = opts_.max_batch;
  so.max_step_tokens = kMaxStepTokens;
  so.keepalive_ms = opts_.comm_keepalive_ms;
  so.adopt_wait_ms = opts_.kv_adopt_wait_ms;
  so.adopt_keep_ms = opts_.kv_adopt_keep_ms;
  so.min_step_ms = opts_.min_step_ms;
  so.kv_format = kv_format_;
  scheduler_ = std::make_unique<Scheduler>(runner_.get(), so, [this](std::vector<GenEvent> events) {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto& e : events) outbox_.push_back(std::move(e));
    // One OnEvents() in the mailbox takes every step's events that came
    // before it runs.
    if (!outbox_posted_) outbox_posted_ = mailbox_->Post([this] { OnEvents(); });
  });
  scheduler_->Start();
  state_ = "ready";
  Phase("listening", listen_ms_, std::string(opts_.host) + ":" + std::to_string(http_->port()));
  PrintPhases();
  NotifyReady();
}

void Engine::PrintPhases() {
  std::lock_guard<std::mutex> lk(mu_);
  std::string table = "startup phases:\n";
  double total = 0;
  for (const auto& [name, ms] : phases_) {
    char line[256];
    auto note = phase_notes_.find(name);
    std::string n = note == phase_notes_.end() ? "" : note->second;
    if (name == "graph_capture" && ms == 0) {  // nothing to capture on the CPU
      std::snprintf(line, sizeof(line), "  %-14s %10s  %s\n", name.c_str(), "skipped", n.c_str());
    } else {
      std::snprintf(line, sizeof(line), "  %-14s %8.1f ms  %s\n", name.c_str(), ms, n.c_str());
    }
    table += line;
    total += ms;
  }
  char line[128];
  std::snprintf(line, sizeof(line), "  %-14s %8.1f ms  (wall %.1f ms)\n", "total", total, MsSince(t_start_));
  table += line;
  std::printf("%s", table.c_str());
  std::printf("ready: serving %s\n", opts_.model_name.c_str());
  std::fflush(stdout);
}

void Engine::NotifyReady() {
  if (opts_.ready_fd < 0) return;
  std::string line = "listening on " + opts_.host + ":" + std::to_string(http_->port()) + "\n";
  ssize_t n = ::write(opts_.ready_fd, line.data(), line.size());
  if (n != static_cast<ssize_t>(line.size())) spdlog::warn("--ready-fd {}: short write", opts_.ready_fd);
  ::close(opts_.ready_fd);
  opts_.ready_fd = -1;
}

void Engine::Shutdown(int code) {
  if (shutting_down_) return;
  shutting_down_ = true;
  exit_code_ = code;
  state_ = "stopping";
  cancel_startup_ = true;
  // No more events: the scheduler is joined before the async handle goes.
  if (scheduler_) scheduler_->Stop();
  pending_.clear();
  auto close_rest = [this] {
    mailbox_->Close();
    uv_close(reinterpret_cast<uv_handle_t*>(&sigterm_), nullptr);
    uv_close(reinterpret_cast<uv_handle_t*>(&sigint_), nullptr);
  };
  http_->Close(close_rest);
}

void Engine::OnEvents() {
  std::vector<GenEvent> events;
  {
    std::lock_guard<std::mutex> lk(mu_);
    events.swap(outbox_);
    outbox_posted_ = false;
  }
  for (auto& ev : events) {
    auto it = pending_.find(ev.id);
    if (it == pending_.end()) continue;  // its client went away
    Pending& p = it->second;
    if (!ev.done) {
      p.tokens.insert(p.tokens.end(), ev.tokens.begin(), ev.tokens.end());
      if (p.stream) p.writer->Write(http::SseEvent(StreamChunkJson(p.text, ev.tokens, "", p.token_ids)));
      continue;
    }
    FinishPending(ev.id, p, ev);
    pending_.erase(ev.id);
  }
}

void Engine::FinishPending(uint64_t id, Pending& p, const GenEvent& ev) {
  p.tokens.insert(p.tokens.end(), ev.tokens.begin(), ev.tokens.end());
  auto& w = p.writer;
  w->OnClose(nullptr);
  if (ev.error) {
    const std::string msg = "generation failed: " + ev.error->message();
    if (p.stream) {
      w->Write(http::SseEvent(http::ErrorJson(msg, "server_error")));
      w->Write(http::SseEvent("[DONE]"));
      w->End();
    } else {
      SendError(w, 500, msg, "server_error");
    }
    return;
  }
  const int64_t n = static_cast<int64_t>(p.tokens.size());
  if (p.stream) {
    w->Write(http::SseEvent(StreamChunkJson(p.text, ev.tokens, ev.finish_reason, p.token_ids)));
    if (p.include_usage) w->Write(http::SseEvent(UsageChunkJson(p.text, p.prompt_tokens, n)));
    w->Write(http::SseEvent("[DONE]"));
    w->End();
  } else {
    w->Send(http::HttpResponse::Json(200, CompletionJson(p.text, p.tokens, ev.finish_reason, p.token_ids, p.prompt_tokens)));
  }
}

void Engine::SendError(const std::shared_ptr<http::ResponseWriter>& w, int status, const std::string& message,
                       const std::string& type, std::vector<http::Header> extra) {
  http::HttpResponse r = http::HttpResponse::Json(status, http::ErrorJson(message, type));
  for (auto& h : extra) r.headers.push_back(std::move(h));
  w->Send(std::move(r));
}

void Engine::Route(std::shared_ptr<http::ResponseWriter> w) {
  const auto& r = w->request();
  auto only = [&](const char* method) {
    if (r.method == method || (std::string(method) == "GET" && r.method == "HEAD")) return true;
    SendError(w, 405, "method " + r.method + " is not allowed on " + r.path + "; use " + method, "invalid_request_error",
              {{"Allow", method}});
    return false;
  };
  // The control routes are the supervisor's alone (http/control_auth.h):
  // checked before the method, so that nothing about them is told to
  // anyone else.
  if (http::IsControlPath(r.path)) {
    if (Status auth = http::CheckControlAuth(r, opts_.control_token); !auth.ok()) {
      SendError(w, 401, auth.error().message(), "authentication_error", {{"WWW-Authenticate", "Bearer"}});
      return;
    }
  }
  if (r.path == "/v1/completions") {
    if (only("POST")) HandleCompletion(w);
  } else if (r.path == "/health") {
    if (only("GET")) HandleHealth(w);
  } else if (r.path == "/wsup/status") {
    if (only("GET")) HandleStatus(w);
  } else if (r.path == "/v1/models") {
    if (only("GET")) HandleModels(w);
  } else if (r.path == "/wsup/role") {
    if (only("POST")) HandleRole(w);
  } else {
    SendError(w, 404, "no route " + r.path.substr(0, 200) +
                          "; the engine serves POST /v1/completions, GET /v1/models, /health, /wsup/status and "
                          "POST /wsup/role",
              "not_found_error");
  }
}

void Engine::HandleCompletion(const std::shared_ptr<http::ResponseWriter>& w) {
  if (state_ != "ready" || !scheduler_) {
    SendError(w, 503, "the engine is " + state_ + " (loading the model); retry when GET /wsup/status says ready",
              "unavailable_error", {{"Retry-After", "1"}});
    return;
  }
  ApiLimits limits;
  limits.vocab = runner_->dims().vocab;
  limits.context = runner_->dims().max_pos;
  auto req = ParseCompletionRequest(w->request().body, limits);
  if (!req.ok()) {
    SendError(w, 400, req.error().message(), "invalid_request_error");
    return;
  }
  GenRequest g;
  g.id = ++next_id_;
  g.prompt = req->prompt;
  g.max_tokens = req->max_tokens;
  g.temperature = req->temperature;
  g.seed = req->seed ? *req->seed : seed_rng_();
  g.stop_tokens = eos_;
  g.request_id = w->request().request_id;
  // The front's mark on a stream it resumes after the engine it ran on
  // failed (docs/kv_journal.md): its KV may be adopted from the journal.
  if (const std::string* resume = w->request().FindHeader("X-Wsup-Resume")) g.resumed = *resume == "cut";
  const uint64_t id = g.id;
  Status st = scheduler_->Submit(std::move(g));
  if (!st.ok()) {
    if (st.code() == Code::kInvalidArgument) {
      SendError(w, 400, st.error().message(), "invalid_request_error");
    } else {
      SendError(w, 503, st.error().message(), "unavailable_error", {{"Retry-After", "1"}});
    }
    return;
  }
  Pending p;
  p.writer = w;
  p.text.id = "cmpl-" + w->request().request_id;
  p.text.created = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  p.text.model = opts_.model_name;
  p.stream = req->stream;
  p.token_ids = req->return_token_ids;
  p.include_usage = req->include_usage;
  p.prompt_tokens = static_cast<int64_t>(req->prompt.size());
  if (p.stream) {
    w->StartStream(200, {{"Content-Type", "text/event-stream"}, {"Cache-Control", "no-cache"}});
  }
  // A client that goes away stops its generation and frees its KV blocks.
  w->OnClose([this, id] {
    if (scheduler_) scheduler_->Cancel(id);
    pending_.erase(id);
  });
  pending_.emplace(id, std::move(p));
}

int64_t WallMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void Engine::HandleRole(const std::shared_ptr<http::ResponseWriter>& w) {
  if (state_ != "ready" || !scheduler_) {
    SendError(w, 503, "the engine is " + state_ + "; give it a role once GET /wsup/status says ready",
              "unavailable_error", {{"Retry-After", "1"}});
    return;
  }
  auto req = ParseRoleRequest(w->request().body);
  if (!req.ok()) {
    SendError(w, 400, req.error().message(), "invalid_request_error");
    return;
  }
  role_ = req->role;
  auto answer = [this, w, role = req->role](const Status& st) {
    json j{{"role", role}, {"kv", KvJson()}};
    if (!st.ok()) {
      j["error"] = st.error().message();
      w->Send(http::HttpResponse::Json(409, j.dump()));
      return;
    }
    w->Send(http::HttpResponse::Json(200, j.dump()));
  };
  if (!pool_link_) {
    answer(Status::Ok());  // a private cache: the role changes nothing of it
    return;
  }
  const auto t0 = Clock::now();
  if (req->pool) {
    KvPoolLink* link = pool_link_.get();
    ModelRunner* runner = runner_.get();
    // Filled on the mapping thread (the fetch, then the done callback).
    auto parts = std::make_shared<PoolMapParts>();
    scheduler_->OpenPool(
        [link, parts] {
          const auto f0 = Clock::now();
          auto fds = link->Take(&parts->prefetched);
          parts->fetch_ms = MsSince(f0);
          return fds;
        },
        [this, answer, t0, runner, parts](Status st) {
          const double ms = MsSince(t0);
          const int64_t at = WallMs();
          parts->times = runner->last_kv_map_times();
          OnLoop([this, answer, st, ms, at, parts] {
            if (st.ok()) {
              pool_mapped_at_ms_ = at;
              pool_map_ms_ = ms;
              pool_map_parts_ = *parts;
              spdlog::info("KV pool {} mapped in {:.2f} ms ({} {:.2f} ms, import {:.2f}, map {:.2f}, access {:.2f}): "
                           "this engine is its owner",
                           pool_link_->pool_id(), ms, parts->prefetched ? "prefetched; take" : "fetch",
                           parts->fetch_ms, parts->times.import_ms, parts->times.map_ms, parts->times.access_ms);
            } else {
              spdlog::error("KV pool: not mapped: {}", st.ToString());
            }
            answer(st);
          });
        });
  } else {
    ModelRunner* runner = runner_.get();
    if (req->role == "active") {
      // Promoted while another engine may still write the pool: serve from
      // the scratch, with the pool's fds and import ready for the grant.
      pool_link_->Prefetch([runner](const PoolFds& fds) { return runner->PrepareKvPool(fds); });
    } else {
      pool_link_->Discard([runner] { runner->DropPreparedKvPool(); });
    }
    scheduler_->ClosePool([this, answer](Status st) {
      const int64_t at = WallMs();
      OnLoop([this, answer, st, at] {
        if (st.ok()) {
          pool_released_at_ms_ = at;
          spdlog::info("KV pool let go: this engine serves from its scratch");
        } else {
          spdlog::error("KV pool: not let go: {}", st.ToString());
        }
        answer(st);
      });
    });
  }
}

json Engine::KvJson() {
  const KvLayout& kv = runner_->kv_layout();
  SchedulerStats s = scheduler_->stats();
  json j;
  const uint64_t pool_now = s.pool_mapped ? kv.pool_bytes() : 0;
  j["source"] = !kv.pooled() ? "private" : s.pool_mapped ? "pool" : "scratch";
  j["bytes"] = kv.scratch_bytes() + pool_now;
  j["scratch_bytes"] = kv.scratch_bytes();
  j["block_size"] = kv.block_size;
  j["blocks"] = s.total_blocks;
  j["free_blocks"] = s.free_blocks;
  if (kv.pooled()) {
    j["pool_bytes"] = kv.pool_bytes();
    j["pool_id"] = pool_link_ ? pool_link_->pool_id() : "";
    j["pool_mapped"] = s.pool_mapped;
    j["pool_closing"] = s.pool_closing;
    j["pool_blocks_in_use"] = s.pool_blocks_in_use;
    // The journal of this engine's sequences in the pool (docs/kv_journal.md).
    j["journal"] = {{"on", s.journal},
                    {"blocks", s.journal_blocks},
                    {"entries", s.journal_entries},
                    {"found_at_open", s.journal_found},
                    {"writes", s.journal_writes},
                    {"write_errors", s.journal_errors}};
    j["mapped_at_ms"] = pool_mapped_at_ms_;
    j["released_at_ms"] = pool_released_at_ms_;
    j["map_ms"] = pool_map_ms_;
    // The last mapping by part: fetching the fds (or taking them, fetched
    // ahead), importing, mapping, granting access.
    j["map_parts"] = {{"prefetched", pool_map_parts_.prefetched},
                      {"imported_ahead", pool_map_parts_.times.prepared},
                      {"fetch_ms", pool_map_parts_.fetch_ms},
                      {"import_ms", pool_map_parts_.times.import_ms},
                      {"map_ms", pool_map_parts_.times.map_ms},
                      {"access_ms", pool_map_parts_.times.access_ms}};
  }
  return j;
}

// Resident anonymous memory of this process (heap, stacks, private
// mappings), from /proc/self/status; 0 when unreadable.
uint64_t RssAnonBytes() {
  auto text = ReadFile("/proc/self/status");
  if (!text.ok()) return 0;
  size_t at = text->find("RssAnon:");
  if (at == std::string::npos) return 0;
  return std::strtoull(text->c_str() + at + 8, nullptr, 10) * 1024;
}

json Engine::MemoryJson(const json& kv) {
  const uint64_t ranks = static_cast<uint64_t>(runner_->tp());
  json m;
  {
    std::lock_guard<std::mutex> lk(mu_);
    m["weights_bytes"] = weights_.bytes;
  }
  m["kv_bytes"] = kv["bytes"].get<uint64_t>() * ranks;
  // Its own KV (the scratch, or the private cache) is counted as KV; the
  // pool and the holder's weights are the node's, not this process's.
  const uint64_t own_kv = kv["scratch_bytes"].get<uint64_t>() * ranks;
  if (!runner_->on_gpu()) {
    // The scratch is anonymous memory touched at startup.
    const uint64_t anon = RssAnonBytes();
    m["other_bytes"] = anon > own_kv ? anon - own_kv : 0;
  } else {
    // What the driver charges to this process beyond its own KV: contexts,
    // step buffers, graphs, cuBLAS workspaces. Read at most once a second.
    const int64_t now = MonoMs();
    if (now - gpu_read_ms_ >= 1000 || gpu_read_ms_ == 0) {
      gpu_read_ms_ = now;
      auto devices = ParseDevice(opts_.device);
      auto used = devices.ok() ? ProcessGpuMemory(*devices) : Result<uint64_t>(devices.error());
      gpu_used_ = used.ok() ? static_cast<int64_t>(*used) : -1;
      if (!used.ok() && !gpu_warned_) {
        gpu_warned_ = true;
        spdlog::warn("memory.other_bytes is not reported: {}", used.error().message());
      }
    }
    if (graphs_bytes_ >= 0) m["graphs_bytes"] = graphs_bytes_;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (!phase_gpu_.empty()) {
        json by = json::object();
        for (const auto& [name, bytes] : phase_gpu_) by[name] = bytes;
        m["by_phase"] = by;
      }
    }
    if (gpu_used_ >= 0) {
      m["gpu_used_bytes"] = gpu_used_;
      m["other_bytes"] = static_cast<uint64_t>(gpu_used_) > own_kv ? static_cast<uint64_t>(gpu_used_) - own_kv : 0;
    }
  }
  return m;
}

void Engine::HandleHealth(const std::shared_ptr<http::ResponseWriter>& w) {
  // Liveness: this loop answers; the scheduler thread runs; the communicator
  // passes its keepalive. While starting, the loop alone is the answer.
  if (scheduler_) {
    SchedulerStats s = scheduler_->stats();
    if (!s.running) {
      SendError(w, 503, "the scheduler is not running", "unavailable_error");
      return;
    }
    if (!s.comm_ok) {
      SendError(w, 503, "the communicator failed its keepalive: " + s.comm_error, "unavailable_error");
      return;
    }
  }
  w->Send(http::HttpResponse::Json(200, json{{"status", "ok"}, {"state", state_}}.dump()));
}

void Engine::HandleModels(const std::shared_ptr<http::ResponseWriter>& w) {
  json m = {{"id", opts_.model_name}, {"object", "model"}, {"owned_by", "wsup"}, {"root", opts_.model_dir}};
  if (runner_ && state_ == "ready") m["max_model_len"] = runner_->dims().max_pos;
  json j = {{"object", "list"}, {"data", json::array({m})}};
  w->Send(http::HttpResponse::Json(200, j.dump(-1, ' ', false, json::error_handler_t::replace)));
}

void Engine::HandleStatus(const std::shared_ptr<http::ResponseWriter>& w) {
  json j;
  j["state"] = state_;
  if (!opts_.nonce.empty()) j["nonce"] = opts_.nonce;
  j["death_word"] = death_word_;
  j["model"] = opts_.model_name;
  j["model_dir"] = opts_.model_dir;
  j["device"] = opts_.device;
  {
    auto devices = ParseDevice(opts_.device);
    j["tp"] = devices.ok() && !devices->empty() ? static_cast<int>(devices->size()) : opts_.tp;
    j["ep"] = EngineEpSize(opts_, j["tp"].get<int>());
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    json wj = {{"mode", opts_.weight_cache}, {"layout", opts_.layout}};
    if (!weights_.source.empty()) {
      wj["source"] = weights_.source;
      wj["ms"] = weights_.attach_ms + weights_.load_ms;
      wj["attach_ms"] = weights_.attach_ms;
      wj["load_ms"] = weights_.load_ms;
      wj["bytes"] = weights_.bytes;
    }
    if (!weights_.miss_reason.empty()) wj["miss_reason"] = weights_.miss_reason;
    if (!weights_.diffs.empty()) {
      json diffs = json::array();
      for (const auto& d : weights_.diffs) diffs.push_back({{"field", d.field}, {"ours", d.ours}, {"holder", d.theirs}});
      wj["diffs"] = diffs;
    }
    j["weights"] = wj;
    json phases = json::object();
    for (const auto& [name, ms] : phases_) phases[name] = ms;
    j["phases"] = phases;
    json notes = json::object();
    for (const auto& [name, note] : phase_notes_) notes[name] = note;
    j["phase_notes"] = notes;
  }
  // comm_kind_ is written by the startup thread; read it only once ready.
  json comm = {{"kind", scheduler_ ? comm_kind_ : std::string("none")}, {"ranks", j["tp"]}, {"warm", false}};
  if (scheduler_) {
    SchedulerStats s = scheduler_->stats();
    comm["warm"] = s.comm_ok;
    comm["last_keepalive_ms"] = MonoMs() - s.last_keepalive_mono_ms;
    comm["keepalive_latency_us"] = s.last_keepalive_us;
    comm["keepalives"] = s.keepalives;
    comm["keepalive_failures"] = s.keepalive_failures;
    comm["keepalive_interval_ms"] = opts_.comm_keepalive_ms;
    if (!s.comm_ok) comm["error"] = s.comm_error;
    j["role"] = role_;
    j["kv"] = KvJson();
    j["memory"] = MemoryJson(j["kv"]);
    j["kv_cache"] = {{"mib_per_rank", opts_.kv_pool ? opts_.kv_scratch_mib : opts_.kv_cache_mib},
                     {"block_size", runner_->block_size()},
                     {"blocks", s.total_blocks},
                     {"free_blocks", s.free_blocks}};
    // Streams resumed here after a crash (docs/kv_journal.md).
    j["resume"] = {
        {"adopted_sequences", s.adopted_sequences},   {"adopted_tokens", s.adopted_tokens},
        {"adopted_by_page", s.adopted_by_page},       {"recomputed_sequences", s.recomputed_sequences},
        {"recomputed_reasons", s.recomputed_reasons}, {"held", s.resume_held},
        {"held_total", s.resume_held_total},          {"held_max_ms", s.resume_held_max_ms},
        {"adoptable_blocks", s.adoptable_blocks},     {"released_blocks", s.released_blocks}};
    j["requests"] = {{"active", s.active},
                     {"waiting", s.waiting},
                     {"steps", s.steps},
                     {"generated_tokens", s.generated_tokens},
                     {"finished", s.finished},
                     {"cancelled", s.cancelled}};
    // Steps of rank 0 replayed from a CUDA graph and run eagerly (both 0 on the CPU).
    j["steps"] = {{"graph", runner_->graph_steps()},
                  {"eager", runner_->eager_steps()},
                  {"total", runner_->steps()},
                  {"forward_ms_total", runner_->step_ms_total()}};
  }
  j["comm"] = comm;
  w->Send(http::HttpResponse::Json(200, j.dump(-1, ' ', false, json::error_handler_t::replace)));
}

}  // namespace

Status ValidateEngineOptions(const EngineOptions& o) {
  if (o.model_dir.empty()) return InvalidArgument("--model is required: the Hugging Face model folder");
  if (o.port < 0 || o.port > 65535) return InvalidArgument("--port " + std::to_string(o.port) + " is out of range; pass 0 to 65535 (0 picks a free port)");
  if (o.weight_cache != "daemon" && o.weight_cache != "client" && o.weight_cache != "off") {
    return InvalidArgument("--weight-cache '" + o.weight_cache + "' is not one of daemon, client, off");
  }
  if (o.weight_cache != "off" && o.socket.empty()) {
    return InvalidArgument("--weight-cache " + o.weight_cache + " needs --socket PATH (the holder's socket, one per rank)");
  }
  if (o.layout != "checkpoint" && o.layout != "engine") {
    return InvalidArgument("--layout '" + o.layout + "' is not one of checkpoint, engine");
  }
  if (o.layout == "engine" && o.weight_cache == "off") {
    return InvalidArgument("--layout engine publishes to or attaches from a holder: pass --weight-cache client or "
                           "daemon with --socket, or drop --layout engine");
  }
  if (o.layout == "engine" && o.device != "cpu") {
    return InvalidArgument("--layout engine: the reference engine publishes and attaches host-memory layouts only "
                           "(its CUDA path computes from the checkpoint's own tensors); use --device cpu, or "
                           "--layout checkpoint on the GPU");
  }
  if (o.layout_wait_ms < 0 || o.layout_wait_ms > 3'600'000) {
    return InvalidArgument("--layout-wait-ms " + std::to_string(o.layout_wait_ms) + " is out of range; pass 0 to 3600000");
  }
  auto devices = ParseDevice(o.device);
  if (!devices.ok()) return devices.error();
  if (o.tp < 1 || o.tp > 64) return InvalidArgument("--tp " + std::to_string(o.tp) + " is out of range; pass 1 to 64");
  if (!devices->empty()) {
    if (o.tp != 1 && static_cast<size_t>(o.tp) != devices->size()) {
      return InvalidArgument("--tp " + std::to_string(o.tp) + " with --device " + o.device +
                             ": on GPUs there is one rank per listed device; drop --tp or list " + std::to_string(o.tp) +
                             " devices");
    }
    std::vector<int> sorted = *devices;
    std::sort(sorted.begin(), sorted.end());
    if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
      return InvalidArgument("--device " + o.device + " lists a GPU twice; each rank needs its own GPU");
    }
  }
  const int tp = devices->empty() ? o.tp : static_cast<int>(devices->size());
  if (o.ep_size != 1 && o.ep_size != tp) {
    return InvalidArgument("--ep-size " + std::to_string(o.ep_size) + " with " + std::to_string(tp) +
                           " tensor-parallel rank(s): expert parallelism spans the tensor-parallel ranks, so pass "
                           "--ep-size " + std::to_string(tp) + " (or --expert-parallel), or --ep-size 1");
  }
  if (o.expert_parallel && tp == 1) {
    return InvalidArgument("--expert-parallel at --tp 1: one rank holds every expert already; pass --tp N "
                           "(N dividing the experts) or drop --expert-parallel");
  }
  if (o.kv_cache_mib < 1 || o.kv_cache_mib > (1 << 22)) {
    return InvalidArgument("--kv-cache-mib " + std::to_string(o.kv_cache_mib) + " is out of range; pass 1 to 4194304");
  }
  if (o.kv_pool && o.weight_cache == "off") {
    return InvalidArgument("--kv-pool maps the KV pool each rank's holder makes: pass --weight-cache daemon or "
                           "client with --socket, or drop --kv-pool");
  }
  if (o.kv_scratch_mib < 1 || o.kv_scratch_mib > (1 << 20)) {
    return InvalidArgument("--kv-scratch-mib " + std::to_string(o.kv_scratch_mib) + " is out of range; pass 1 to 1048576");
  }
  if (o.dequant_scratch_mib < 1 || o.dequant_scratch_mib > 65536) {
    return InvalidArgument("--dequant-scratch-mib " + std::to_string(o.dequant_scratch_mib) +
                           " is out of range; pass 1 to 65536");
  }
  if (o.nccl_max_ctas < 0 || o.nccl_max_ctas > 64) {
    return InvalidArgument("--nccl-max-ctas " + std::to_string(o.nccl_max_ctas) + " is out of range; pass 0 to 64");
  }
  if (o.comm_keepalive_ms < 1) return InvalidArgument("--comm-keepalive-ms must be at least 1");
  if (o.kv_adopt_wait_ms < 0 || o.kv_adopt_wait_ms > 600'000) {
    return InvalidArgument("--kv-adopt-wait-ms " + std::to_string(o.kv_adopt_wait_ms) +
                           " is out of range; pass 0 (no wait) to 600000");
  }
  if (o.kv_adopt_keep_ms < 0 || o.kv_adopt_keep_ms > 3'600'000) {
    return InvalidArgument("--kv-adopt-keep-ms " + std::to_string(o.kv_adopt_keep_ms) +
                           " is out of range; pass 0 (free them at once) to 3600000");
  }
  if (o.min_step_ms < 0 || o.min_step_ms > 10'000) {
    return InvalidArgument("--min-step-ms " + std::to_string(o.min_step_ms) +
                           " is out of range; pass 0 (off) to 10000");
  }
  if (o.max_batch < 1) return InvalidArgument("--max-batch must be at least 1");
  if (o.threads < 0) return InvalidArgument("--threads must be 0 (automatic) or more");
  if (o.block_size < 1 || o.block_size > 1024) return InvalidArgument("--kv-block-size must be 1 to 1024");
  if (o.header_timeout_ms < 1 || o.idle_timeout_ms < 1) return InvalidArgument("HTTP timeouts must be at least 1 ms");
  return Status::Ok();
}

int EngineEpSize(const EngineOptions& opts, int tp) { return opts.expert_parallel ? tp : opts.ep_size; }

int RunEngine(const EngineOptions& opts) {
  Status st = ValidateEngineOptions(opts);
  if (!st.ok()) {
    std::fprintf(stderr, "wsup-engine: %s\n", st.error().message().c_str());
    return kEngineExitUsage;
  }
  // A peer that closes mid-response must not kill the process.
  ::signal(SIGPIPE, SIG_IGN);
  Engine engine(opts);
  return engine.Run();
}

}  // namespace wsup::engine
