#include "engine/engine_server.h"

#include <signal.h>
#include <unistd.h>
#include <uv.h>

#include <spdlog/spdlog.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "common/fs.h"
#include "engine/engine.h"
#include "http/control_auth.h"
#include "wire/death_word.h"

namespace wsup::engine {

namespace {

using Clock = std::chrono::steady_clock;

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

std::string DefaultModelName(const std::string& dir) {
  std::string d = dir;
  while (d.size() > 1 && d.back() == '/') d.pop_back();
  return BaseName(d);
}

}  // namespace

double MsSince(SteadyTime t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

int64_t MonoMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now().time_since_epoch()).count();
}

int64_t WallMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

Engine::Engine(EngineOptions opts) : opts_(std::move(opts)) {
  if (opts_.model_name.empty()) opts_.model_name = DefaultModelName(opts_.model_dir);
}

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
  signals_ = std::make_unique<Signals>(&loop_);
  auto on_signal = [this](int signum) {
    spdlog::info("signal {}: shutting down", signum);
    Fire(EngineEvent::kStop, kEngineExitOk);
  };
  signals_->On(SIGTERM, on_signal);
  signals_->On(SIGINT, on_signal);

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
    Fire(EngineEvent::kListenFailed, kEngineExitFailure, st.error().message());
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
    if (state_ != EngineState::kStopping) fn();
  });
}

void Engine::OnStartupDone() {
  Status st;
  {
    std::lock_guard<std::mutex> lk(mu_);
    st = startup_status_;
  }
  if (!st.ok()) {
    Fire(EngineEvent::kStartupFailed, ExitCodeFor(st.error()), "startup failed: " + st.error().message());
    return;
  }
  Fire(EngineEvent::kLoaded);
}

void Engine::Fire(EngineEvent event, int exit_code, const std::string& why) {
  auto t = NextEngineTransition(state_, event);
  if (!t) {
    spdlog::error("engine: {}: the lifecycle table (engine/engine_state.cc) has no such move; ignored",
                  kEngineNames.Refused(state_, event));
    return;
  }
  state_ = t->to;
  switch (t->action) {
    case EngineAction::kNone: break;
    case EngineAction::kStartServing: StartServing(); break;
    case EngineAction::kShutDown: ShutDown(exit_code, why); break;
  }
}

void Engine::StartServing() {
  SchedulerOptions so;
  so.max_batch = opts_.max_batch;
  so.max_step_tokens = kMaxStepTokens;
  so.keepalive_ms = opts_.comm_keepalive_ms;
  so.adopt_wait_ms = opts_.kv_adopt_wait_ms;
  so.adopt_keep_ms = opts_.kv_adopt_keep_ms;
  so.min_step_ms = opts_.min_step_ms;
  so.max_step_ms = MaxStepMs();
  so.kv_format = kv_format_;
  scheduler_ = std::make_unique<Scheduler>(runner_.get(), so, [this](std::vector<GenEvent> events) {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto& e : events) outbox_.push_back(std::move(e));
    // One OnEvents() in the mailbox takes every step's events that came
    // before it runs.
    if (!outbox_posted_) outbox_posted_ = mailbox_->Post([this] { OnEvents(); });
  });
  scheduler_->Start();
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

void Engine::ShutDown(int code, const std::string& why) {
  if (!why.empty()) std::fprintf(stderr, "wsup-engine: %s\n", why.c_str());
  exit_code_ = code;
  cancel_startup_ = true;
  // No more events: the scheduler is joined before the async handle goes.
  if (scheduler_) scheduler_->Stop();
  pending_.clear();
  auto close_rest = [this] {
    mailbox_->Close();
    signals_->Close();
  };
  http_->Close(close_rest);
}

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
