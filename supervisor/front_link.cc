// The front: started on the listening socket kept here, steered over its
// control socket (set_routes), restarted through the one restart throttle
// when it dies. Its own events (a switch it made by itself, the first good
// answer after a swap) come back over the same link and go to the owner's
// message hook.
#include "supervisor/front_link.h"

#include <signal.h>

#include <cstdlib>

#include "common/fs.h"
#include "common/log.h"
#include "supervisor/notify.h"
#include "supervisor/preflight.h"
#include "supervisor/process.h"

namespace wsup {

using nlohmann::json;

namespace {
constexpr int64_t kFrontConnectRetryMs = 20;

void Logged(const Status& st, const char* what) {
  if (!st.ok()) spdlog::warn("{}: {}", what, st.error().message());
}
}  // namespace

FrontLink::FrontLink(uv_loop_t* loop, Launcher& launcher, TimerSource& timers, const Clock& clock, const Config& cfg,
                     std::string bin_dir, Hooks hooks)
    : loop_(loop),
      launcher_(launcher),
      clock_(clock),
      cfg_(cfg),
      bin_dir_(std::move(bin_dir)),
      hooks_(std::move(hooks)),
      retry_(timers.Make()),
      restart_timer_(timers.Make()),
      throttle_(FrontRestartPolicy(cfg)),
      poll_(timers.Make()) {
  poll_->Start(kCountersPollMs, [this] { PollCounters(); }, kCountersPollMs);
}

FrontLink::~FrontLink() { Detach("supervisor exiting"); }

void FrontLink::Detach(const std::string& why) {
  detached_ = true;
  retry_->Stop();
  restart_timer_->Stop();
  poll_->Stop();
  if (watch_) watch_->Close();
  watch_ = nullptr;
  CloseLink(why);
}

void FrontLink::CloseLink(const std::string& why) {
  if (link_) link_->Close(why);
  link_.reset();
}

std::string FrontLink::LogPath() const { return JoinPath(cfg_.node.state_dir, "logs/front.log"); }

void FrontLink::Fire(ChildEvent event, const std::string& cause, int exit_code) {
  auto t = NextChildTransition(ChildKind::kFront, state_, event);
  if (!t) {
    spdlog::debug("front: {}; ignored ({})", kChildNames.Refused(state_, event), cause);
    return;
  }
  if (t->from != t->to || event == ChildEvent::kExited) {
    spdlog::info("front: {} {}", kChildNames.Move(*t), cause);
  }
  state_ = t->to;
  switch (t->action) {
    case ChildAction::kNone:
    case ChildAction::kAttachKeeper:
    case ChildAction::kEnginesMayStart:
      break;
    case ChildAction::kPushRoutes:
      SetRoutes(hooks_.routes ? hooks_.routes() : routes_);
      break;
    case ChildAction::kReconnect:
      if (event == ChildEvent::kLinkLost) {
        retry_->Start(kFrontConnectRetryMs, [this] { Connect(); });
      } else {
        Connect();
      }
      break;
    case ChildAction::kKill:
      if (pid_ > 0) Logged(launcher_.Signal(pid_, SIGKILL), "killing the front");
      break;
    case ChildAction::kTerminate:
      if (pid_ > 0) Logged(launcher_.Signal(pid_, SIGTERM), "stopping the front");
      break;
    case ChildAction::kScheduleRestart:
      ScheduleRestart(exit_code, cause);
      break;
    case ChildAction::kReportDown:
      if (hooks_.down) hooks_.down(down_reason_);
      break;
  }
}

Status FrontLink::Bind() {
  auto fd = BindListenSocket(cfg_.front.listen, "front.listen", &port_);
  if (!fd.ok()) return fd.error();
  listen_ = std::move(*fd);
  return Status::Ok();
}

void FrontLink::Start() {
  if (Stopping()) return;
  if (!listen_.valid()) {
    // Only after an adopted front whose socket could not be taken back.
    Status st = Bind();
    if (!st.ok()) {
      if (hooks_.fatal) hooks_.fatal(st.error().message());
      return;
    }
  }
  control_path_ = JoinPath(cfg_.node.runtime_dir, "front.sock");
  ChildSpec spec;
  spec.argv = {JoinPath(bin_dir_, "wsup-front"), "--listen-fd", "3", "--control", control_path_,
               "--queue-timeout-ms", std::to_string(cfg_.front.queue_timeout_ms), "--max-queued",
               std::to_string(cfg_.front.max_queued), "--epoch", std::to_string(epoch_), "--hedge-after-ms",
               std::to_string(cfg_.front.hedge_after_ms), "--hedge-percent", std::to_string(cfg_.front.hedge_percent),
               "--hedge-burst", std::to_string(cfg_.front.hedge_burst), "--loops", std::to_string(cfg_.front.loops)};
  if (!routes_.active.empty()) {
    spec.argv.push_back("--active");
    spec.argv.push_back(routes_.active);
  }
  if (!routes_.standby.empty()) {
    spec.argv.push_back("--standby");
    spec.argv.push_back(routes_.standby);
  }
  spec.pass_fds = {listen_.get()};
  bool first = state_ == ChildState::kIdle;
  if (first && hooks_.store_listen_fd) hooks_.store_listen_fd(listen_.get());
  spec.log_path = LogPath();
  auto pid = launcher_.Spawn(spec);
  if (!pid.ok()) {
    if (hooks_.fatal) hooks_.fatal(pid.error().message().empty() ? "cannot start the front" : pid.error().message());
    return;
  }
  pid_ = *pid;
  auto st = launcher_.StartTime(pid_);
  start_time_ = st.ok() ? *st : 0;
  if (hooks_.save_state) hooks_.save_state();
  auto w = launcher_.WatchExit(loop_, pid_, [this](const ExitInfo& info) { OnExit(info); });
  if (w.ok()) {
    watch_ = *w;
  } else {
    spdlog::error("front pid {}: {}; its death will not be seen", pid_, w.error().message());
  }
  spdlog::info("{} front pid {} on {}", first ? "started" : "restarted", pid_,
               HostPortString(cfg_.front.listen.host, port_));
  Fire(ChildEvent::kSpawn, "started pid " + std::to_string(pid_));
}

void FrontLink::Adopt(const RuntimeState::Front& prev, int64_t epoch) {
  pid_ = prev.proc.pid;
  start_time_ = prev.proc.start_time;
  control_path_ = prev.control_socket;
  epoch_ = epoch;
  // Take the listening socket back for the next front restart: from the
  // service manager's fd store, else from the front itself (it serves on
  // fd 3, as this supervisor's predecessor started it).
  bool got_fd = false;
  for (auto& [name, fd] : Notifier::ReceivedFds()) {
    if (name == "front-listen" && !got_fd) {
      listen_.Reset(fd);
      got_fd = true;
    }
  }
  if (!got_fd) {
    auto fd = TakeFdFrom(pid_, 3);
    if (fd.ok()) {
      listen_ = std::move(*fd);
      got_fd = true;
    } else {
      spdlog::warn("{}", fd.error().message());
    }
  }
  auto port_pos = prev.listen.rfind(':');
  port_ = port_pos == std::string::npos ? 0 : std::atoi(prev.listen.c_str() + port_pos + 1);
  auto w = launcher_.WatchExit(loop_, pid_, [this](const ExitInfo& info) { OnExit(info); });
  if (w.ok()) watch_ = *w;
  spdlog::info("adopted front pid {} on {}{}", pid_, prev.listen,
               got_fd ? "" : " (its listening socket could not be taken back; a front crash will rebind)");
  Fire(ChildEvent::kAdopt, "adopted pid " + std::to_string(pid_) + " after a supervisor restart");
}

void FrontLink::Stop(const std::string& why) {
  restart_timer_->Stop();
  retry_->Stop();
  Fire(ChildEvent::kStop, why);
}

void FrontLink::OnExit(const ExitInfo& info) {
  if (watch_) watch_->Close();
  watch_ = nullptr;
  std::string how = "pid " + std::to_string(pid_) + " " + info.Describe();
  if (Stopping()) {
    spdlog::info("front {}", how);
  } else {
    spdlog::error("front {}", how);
  }
  last_exit_ = how;
  retry_->Stop();
  CloseLink("front exited");
  pid_ = 0;
  if (hooks_.save_state) hooks_.save_state();
  Fire(ChildEvent::kExited, how, info.known && !info.signal ? info.exit_code : -1);
  if (hooks_.exited) hooks_.exited();
}

void FrontLink::ScheduleRestart(int exit_code, const std::string& how) {
  if (Stopping()) return;
  RestartDecision d = throttle_.OnExit(clock_.MonotonicMs(), exit_code);
  if (d.kind != RestartDecision::Kind::kRestart) {
    down_reason_ = "the front (" + how + ") is " + d.Describe() + "; see " + LogPath();
    Fire(ChildEvent::kGiveUp, down_reason_);
    return;
  }
  if (d.crash_looping) {
    spdlog::error("the front is crash-looping ({} restarts within supervisor.restart_window_ms = {} ms): restarting "
                  "it in {} ms; see {}",
                  d.recent, cfg_.supervisor.restart_window_ms, d.delay_ms, LogPath());
    if (hooks_.crash_looping) hooks_.crash_looping();
  }
  restart_timer_->Start(d.delay_ms, [this] {
    if (state_ == ChildState::kFailed && !Stopping()) Start();
  });
}

void FrontLink::Connect() {
  if (Stopping() || pid_ == 0) return;
  const pid_t pid = pid_;
  JsonConn::Connect(loop_, control_path_, 1 << 20, [this, pid](Result<std::shared_ptr<JsonConn>> r) {
    if (Stopping() || pid_ != pid) return;
    if (!r.ok()) {
      Fire(ChildEvent::kLinkLost, "control socket not up yet: " + r.error().message());
      return;
    }
    link_ = *r;
    link_->Start([this](const std::shared_ptr<JsonConn>&, const json& m) { OnMessage(m); },
                 [this, pid](const std::string& why) {
                   spdlog::debug("front control link closed: {}", why);
                   link_.reset();
                   if (!detached_ && !Stopping() && pid_ == pid && launcher_.Alive(pid)) {
                     Fire(ChildEvent::kLinkLost, "control link closed: " + why);
                   }
                 });
    Fire(ChildEvent::kUp, "control link connected");
  });
}

void FrontLink::OnMessage(const json& m) {
  auto parsed = ParseFrontMessage(m);
  if (!parsed.ok()) {
    // The front is of this wsup version; a message that is not one is
    // logged and dropped, never acted on in part.
    spdlog::warn("front: a message that cannot be read was dropped: {}", parsed.error().message());
    bad_messages_++;
    return;
  }
  if (hooks_.message) hooks_.message(*parsed);
}

void FrontLink::Send(const json& m) {
  if (link_) link_->Send(m);
}

void FrontLink::SetRoutes(const Routes& routes) {
  if (!(routes == routes_)) {
    ++epoch_;
    routes_ = routes;
    if (hooks_.save_state) hooks_.save_state();
  }
  if (!link_) return;
  json m{{"type", "set_routes"}, {"epoch", epoch_}};
  m["active"] = routes_.active.empty() ? json(nullptr) : json(routes_.active);
  m["standby"] = routes_.standby.empty() ? json(nullptr) : json(routes_.standby);
  Send(m);
}

void FrontLink::CutEngine(const std::string& address, const std::string& why) {
  // A front that predates the message answers it with an error, which
  // changes nothing: it still sees the sockets close a little later.
  if (address.empty()) return;
  Send(json{{"type", "engine_dead"}, {"engine", address}, {"why", why}});
}

void FrontLink::PushLimits() {
  Send(json{{"type", "set_limits"},
            {"queue_timeout_ms", cfg_.front.queue_timeout_ms},
            {"max_queued", cfg_.front.max_queued},
            {"hedge_after_ms", cfg_.front.hedge_after_ms},
            {"hedge_percent", cfg_.front.hedge_percent},
            {"hedge_burst", cfg_.front.hedge_burst}});
}

void FrontLink::AskStatus(const std::function<void(const json* reply)>& done) {
  if (control_path_.empty() || pid_ == 0) {
    done(nullptr);
    return;
  }
  // A connection of its own: the link carries the front's events, and an
  // answer on it could not be told from them.
  JsonConn::Connect(loop_, control_path_, 1 << 20, [done](Result<std::shared_ptr<JsonConn>> r) {
    if (!r.ok()) {
      done(nullptr);
      return;
    }
    auto conn = *r;
    auto answered = std::make_shared<bool>(false);
    conn->Start(
        [done, answered](const std::shared_ptr<JsonConn>& self, const json& m) {
          if (IsFrontEvent(m) || *answered) return;
          *answered = true;
          self->Close("done");
          done(&m);
        },
        [done, answered](const std::string&) {
          if (*answered) return;
          *answered = true;
          done(nullptr);
        });
    conn->Send(json{{"type", "status"}});
  });
}

std::optional<RuntimeState::Front> FrontLink::Record() const {
  if (pid_ <= 0) return std::nullopt;
  return RuntimeState::Front{ProcessRef{pid_, start_time_}, control_path_,
                             HostPortString(cfg_.front.listen.host, port_)};
}

json FrontLink::StatusJson() const {
  json fj{{"listen", HostPortString(cfg_.front.listen.host, port_)},
          {"pid", pid_},
          {"state", ChildStateName(state_)},
          {"restarts", throttle_.total()},
          {"crash_looping", throttle_.crash_looping()},
          {"epoch", epoch_}};
  if (!last_exit_.empty()) fj["last_exit"] = last_exit_;
  if (!down_reason_.empty()) fj["failure"] = down_reason_;
  return fj;
}

void FrontLink::PollCounters() {
  if (pid_ <= 0 || !link_) return;
  // One ask at a time; one unanswered for 10 polls (a stopped front holds
  // its connections without a word) is given up, and its answer, if it
  // ever comes, is still taken for the pid it names.
  const int64_t now = clock_.MonotonicMs();
  if (poll_since_ms_ != 0 && now - poll_since_ms_ < 10 * kCountersPollMs) return;
  poll_since_ms_ = now;
  std::weak_ptr<bool> alive = alive_;
  AskStatus([this, alive, asked = now](const json* reply) {
    if (alive.expired()) return;
    if (poll_since_ms_ == asked) poll_since_ms_ = 0;
    if (reply == nullptr || !reply->is_object()) return;
    const json& counters = reply->contains("counters") ? (*reply)["counters"] : json();
    const pid_t pid = reply->value("pid", 0);
    if (pid > 0 && counters.is_object()) TakeCounters(pid, counters);
    TakeGauges(*reply);
  });
}

void FrontLink::TakeCounters(pid_t pid, const json& counters) {
  if (pid != counters_pid_) {
    // A new front: the last counts of the one before are its final ones.
    for (const auto& [k, v] : counters_now_) counters_gone_[k] += v;
    counters_now_.clear();
    counters_pid_ = pid;
  }
  for (const auto& [k, v] : counters.items()) {
    // A count a front reports lower than before (it cannot) is not taken.
    if (v.is_number_unsigned() && v.get<uint64_t>() >= counters_now_[k]) counters_now_[k] = v.get<uint64_t>();
  }
}

void FrontLink::TakeGauges(const json& reply) {
  // The queue and the requests in flight, as of this answer; a field that
  // cannot be read leaves the last value.
  if (reply.contains("queued") && reply["queued"].is_number_unsigned()) queued_ = reply["queued"].get<uint64_t>();
  if (reply.contains("inflight") && reply["inflight"].is_object()) {
    uint64_t n = 0;
    for (const auto& [engine, v] : reply["inflight"].items()) {
      if (v.is_number_unsigned()) n += v.get<uint64_t>();
    }
    inflight_ = n;
  }
}

void FrontLink::Report(Metrics& m) const {
  m.front_queued = queued_;
  m.front_inflight = inflight_;
  for (const auto& [k, v] : counters_gone_) m.front_counters[k] = v;
  for (const auto& [k, v] : counters_now_) m.front_counters[k] = counters_gone_.count(k) ? counters_gone_.at(k) + v : v;
  m.front_restarts = throttle_.total();
  m.front_crash_looping = throttle_.crash_looping();
  if (bad_messages_ > 0) m.bad_messages["front"] = bad_messages_;
}

}  // namespace wsup
