// The front: started on the listening socket the supervisor keeps, steered
// over its control socket (set_routes), restarted through the one restart
// throttle when it dies. Its own events (a switch it made by itself, the
// first good answer after a swap) come back over the same link.
#include "common/fs.h"
#include "common/log.h"
#include "supervisor/messages.h"
#include "supervisor/preflight.h"
#include "supervisor/probe_config.h"
#include "supervisor/silence_check.h"
#include "supervisor/supervisor_impl.h"

namespace wsup {

using nlohmann::json;

namespace {
constexpr int64_t kFrontConnectRetryMs = 20;
}  // namespace

void Supervisor::Impl::FireFront(ChildEvent event, const std::string& cause, int exit_code) {
  auto t = NextChildTransition(ChildKind::kFront, front_.state, event);
  if (!t) {
    spdlog::debug("front: event {} ignored in state {} ({})", ChildEventName(event), ChildStateName(front_.state),
                  cause);
    return;
  }
  if (t->from != t->to || event == ChildEvent::kExited) {
    spdlog::info("front: {} --{}--> {} [{}] {}", ChildStateName(t->from), ChildEventName(event),
                 ChildStateName(t->to), ChildActionName(t->action), cause);
  }
  front_.state = t->to;
  switch (t->action) {
    case ChildAction::kNone:
    case ChildAction::kAttachKeeper:
    case ChildAction::kEnginesMayStart:
      break;
    case ChildAction::kPushRoutes:
      PushRoutes();
      break;
    case ChildAction::kReconnect:
      if (event == ChildEvent::kLinkLost) {
        front_.retry->Start(kFrontConnectRetryMs, [this] { ConnectFront(); });
      } else {
        ConnectFront();
      }
      break;
    case ChildAction::kKill:
      if (front_.pid > 0) Logged(launcher_.Signal(front_.pid, SIGKILL), "killing the front");
      break;
    case ChildAction::kTerminate:
      if (front_.pid > 0) Logged(launcher_.Signal(front_.pid, SIGTERM), "stopping the front");
      break;
    case ChildAction::kScheduleRestart:
      ScheduleFrontRestart(exit_code, cause);
      break;
    case ChildAction::kReportDown:
      SetDegraded(front_.down_reason);
      break;
  }
  metrics_.front_crash_looping = front_.throttle.crash_looping();
}

void Supervisor::Impl::StartFront() {
  if (stopping_) return;
  if (!front_.listen.valid()) {
    // Only after an adopted front whose socket could not be taken back.
    auto fd = BindListenSocket(cfg_.front.listen, "front.listen", &front_.port);
    if (!fd.ok()) {
      BeginStop(fd.error().message(), kExitConfig);
      return;
    }
    front_.listen = std::move(*fd);
  }
  front_.control_path = JoinPath(cfg_.node.runtime_dir, "front.sock");
  ChildSpec spec;
  spec.argv = {JoinPath(opts_.bin_dir, "wsup-front"), "--listen-fd", "3", "--control", front_.control_path,
               "--queue-timeout-ms", std::to_string(cfg_.front.queue_timeout_ms), "--max-queued",
               std::to_string(cfg_.front.max_queued), "--epoch", std::to_string(epoch_), "--hedge-after-ms",
               std::to_string(cfg_.front.hedge_after_ms), "--hedge-percent", std::to_string(cfg_.front.hedge_percent),
               "--hedge-burst", std::to_string(cfg_.front.hedge_burst), "--loops", std::to_string(cfg_.front.loops)};
  if (!routed_active_.empty()) {
    spec.argv.push_back("--active");
    spec.argv.push_back(routed_active_);
  }
  if (!routed_standby_.empty()) {
    spec.argv.push_back("--standby");
    spec.argv.push_back(routed_standby_);
  }
  spec.pass_fds = {front_.listen.get()};
  bool first = front_.state == ChildState::kIdle;
  if (first) Logged(notifier_.StoreFds("front-listen", {front_.listen.get()}), "storing the front's socket");
  spec.log_path = JoinPath(cfg_.node.state_dir, "logs/front.log");
  auto pid = launcher_.Spawn(spec);
  if (!pid.ok()) {
    BeginStop(pid.error().message().empty() ? "cannot start the front" : pid.error().message(), kExitConfig);
    return;
  }
  front_.pid = *pid;
  auto st = launcher_.StartTime(front_.pid);
  front_.start_time = st.ok() ? *st : 0;
  metrics_.front_restarts = front_.throttle.total();
  SaveState();
  auto w = launcher_.WatchExit(&loop_, front_.pid, [this](const ExitInfo& info) { OnFrontExit(info); });
  if (w.ok()) {
    front_.watch = *w;
  } else {
    spdlog::error("front pid {}: {}; its death will not be seen", front_.pid, w.error().message());
  }
  spdlog::info("{} front pid {} on {}", first ? "started" : "restarted", front_.pid,
               HostPortString(cfg_.front.listen.host, front_.port));
  FireFront(ChildEvent::kSpawn, "started pid " + std::to_string(front_.pid));
}

void Supervisor::Impl::OnFrontExit(const ExitInfo& info) {
  if (front_.watch) front_.watch->Close();
  front_.watch = nullptr;
  std::string how = "pid " + std::to_string(front_.pid) + " " + info.Describe();
  if (stopping_) {
    spdlog::info("front {}", how);
  } else {
    spdlog::error("front {}", how);
  }
  front_.last_exit = how;
  front_.retry->Stop();
  if (front_.link) front_.link->Close("front exited");
  front_.link.reset();
  front_.pid = 0;
  SaveState();
  FireFront(ChildEvent::kExited, how, info.known && !info.signal ? info.exit_code : -1);
  if (stopping_) MaybeFinishStop();
}

void Supervisor::Impl::ScheduleFrontRestart(int exit_code, const std::string& how) {
  if (stopping_) return;
  RestartDecision d = front_.throttle.OnExit(clock_.MonotonicMs(), exit_code);
  metrics_.front_crash_looping = front_.throttle.crash_looping();
  if (d.kind != RestartDecision::Kind::kRestart) {
    front_.down_reason = "the front (" + how + ") is " + d.Describe() + "; see " +
                         JoinPath(cfg_.node.state_dir, "logs/front.log");
    FireFront(ChildEvent::kGiveUp, front_.down_reason);
    return;
  }
  if (d.crash_looping) {
    spdlog::error("the front is crash-looping ({} restarts within supervisor.restart_window_ms = {} ms): restarting "
                  "it in {} ms; see {}",
                  d.recent, cfg_.supervisor.restart_window_ms, d.delay_ms,
                  JoinPath(cfg_.node.state_dir, "logs/front.log"));
    UpdateStatusLine();
  }
  front_.restart_timer->Start(d.delay_ms, [this] {
    if (front_.state == ChildState::kFailed && !stopping_) StartFront();
  });
}

void Supervisor::Impl::ConnectFront() {
  if (stopping_ || front_.pid == 0) return;
  const pid_t pid = front_.pid;
  JsonConn::Connect(&loop_, front_.control_path, 1 << 20, [this, pid](Result<std::shared_ptr<JsonConn>> r) {
    if (stopping_ || front_.pid != pid) return;
    if (!r.ok()) {
      FireFront(ChildEvent::kLinkLost, "control socket not up yet: " + r.error().message());
      return;
    }
    front_.link = *r;
    front_.link->Start([this](const std::shared_ptr<JsonConn>&, const json& m) { OnFrontMessage(m); },
                       [this, pid](const std::string& why) {
                         spdlog::debug("front control link closed: {}", why);
                         front_.link.reset();
                         if (!stopping_ && front_.pid == pid && launcher_.Alive(pid)) {
                           FireFront(ChildEvent::kLinkLost, "control link closed: " + why);
                         }
                       });
    FireFront(ChildEvent::kUp, "control link connected");
  });
}

void Supervisor::Impl::OnFrontMessage(const json& m) {
  auto parsed = ParseFrontMessage(m);
  if (!parsed.ok()) {
    // The front is of this wsup version; a message that is not one is
    // logged and dropped, never acted on in part.
    spdlog::warn("front: a message that cannot be read was dropped: {}", parsed.error().message());
    metrics_.bad_messages["front"]++;
    return;
  }
  const FrontMessage& f = *parsed;
  switch (f.kind) {
    case FrontMessage::Kind::kSwitched:
      spdlog::warn("front switched on its own from {} to {}: {}", f.from, f.to, f.reason);
      metrics_.front_self_switches++;
      break;
    case FrontMessage::Kind::kSilent:
      OnFrontSilent(f);
      break;
    case FrontMessage::Kind::kFirstOk:
      if (pending_ && f.backend == routed_active_) CompletePending(f.at_ms > 0 ? f.at_ms : clock_.WallMs());
      break;
    case FrontMessage::Kind::kCut:
      spdlog::info("front: {} request(s) cut from the dead engine and sent on", f.cut);
      break;
    case FrontMessage::Kind::kRoutesAck:
      // Routes acknowledged: the swap is done.
      if (pending_ && pending_->swapped_ms == 0) pending_->swapped_ms = clock_.WallMs();
      break;
    case FrontMessage::Kind::kOther:
      break;
  }
}

void Supervisor::Impl::OnFrontSilent(const FrontMessage& m) {
  const std::string& backend = m.backend;
  Slot* act = Active();
  const bool routed = act && !backend.empty() && backend == routed_active_;
  const int64_t last_byte = m.last_byte_ms;
  std::string report = "the front saw " + std::to_string(m.silent) + " of " + std::to_string(m.inflight) +
                       " requests on " + backend + " get no byte for " + std::to_string(m.after_ms) + " ms";
  char run = 0;
  if (routed && act->pid > 0) {
    auto r = launcher_.RunState(act->pid);
    if (r.ok()) run = *r;
  }
  SilenceVerdict v = JudgeSilence(routed, Standby() != nullptr, routed ? act->pid : 0, run);
  if (routed && last_byte > 0) act->traffic_last_ms = last_byte;
  switch (v.step) {
    case SilenceStep::kIgnore:
      spdlog::info("{}; not acted on: {}", report, v.why);
      metrics_.front_silent["ignored"]++;
      return;
    case SilenceStep::kTrip:
      TripSilent(*act, report + "; " + v.why);
      return;
    case SilenceStep::kConfirm:
      break;
  }
  if (silence_probe_ && silence_pid_ == act->pid) return;  // one check at a time
  spdlog::warn("{}; {}", report, v.why);
  silence_pid_ = act->pid;
  silence_probe_ = MakeProbeFromConfig(cfg_, act->port, act->control_token, *http_, clock_);
  Slot* sp = act;
  const pid_t pid = act->pid;
  silence_probe_->Run([this, sp, pid, report](ProbeOutcome o) {
    // Freed after this callback returns, on the loop.
    After(0, [this, pid] {
      if (silence_pid_ == pid) {
        silence_probe_.reset();
        silence_pid_ = 0;
      }
    });
    if (stopping_ || sp->pid != pid || sp->state != SlotState::kActive) return;
    if (o.ok) {
      spdlog::info("{}; the probe made at once passed ({} ms): not tripped, it is busy, not hung", report,
                   o.latency_ms);
      metrics_.front_silent["dismissed"]++;
      return;
    }
    TripSilent(*sp, report + "; a probe made at once failed: " + o.reason);
  });
}

void Supervisor::Impl::TripSilent(Slot& s, const std::string& why) {
  metrics_.front_silent["tripped"]++;
  spdlog::warn("engine {}: tripped: {}", s.name, why);
  s.semantic_ready = false;
  Fire(s, SlotEvent::kProbeTrip, why);
}

void Supervisor::Impl::PushRoutes() {
  Slot* act = Active();
  Slot* stby = Standby();
  std::string na = act ? HostPortString(cfg_.engine.host, act->port) : "";
  std::string ns = stby ? HostPortString(cfg_.engine.host, stby->port) : "";
  if (na != routed_active_ || ns != routed_standby_) {
    ++epoch_;
    routed_active_ = na;
    routed_standby_ = ns;
    SaveState();
  }
  if (!front_.link) return;
  json m{{"type", "set_routes"}, {"epoch", epoch_}};
  m["active"] = na.empty() ? json(nullptr) : json(na);
  m["standby"] = ns.empty() ? json(nullptr) : json(ns);
  front_.link->Send(m);
}

void Supervisor::Impl::CutInFront(const std::string& address, const std::string& why) {
  // A front that predates the message answers it with an error, which
  // changes nothing: it still sees the sockets close a little later.
  if (!front_.link || address.empty()) return;
  front_.link->Send(json{{"type", "engine_dead"}, {"engine", address}, {"why", why}});
}

void Supervisor::Impl::PushFrontLimits() {
  // A front started later gets them on its command line.
  if (!front_.link) return;
  front_.link->Send(json{{"type", "set_limits"},
                         {"queue_timeout_ms", cfg_.front.queue_timeout_ms},
                         {"max_queued", cfg_.front.max_queued},
                         {"hedge_after_ms", cfg_.front.hedge_after_ms},
                         {"hedge_percent", cfg_.front.hedge_percent},
                         {"hedge_burst", cfg_.front.hedge_burst}});
}

}  // namespace wsup
