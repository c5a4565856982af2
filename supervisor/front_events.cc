// What the front tells the node, and what the node gives it: the hooks of
// FrontLink (front_link.h, the front's one owner), its messages (a switch
// it made by itself, the first good answer after a swap, an engine that
// sends nothing), and the routes it should have.
#include "common/log.h"
#include "supervisor/messages.h"
#include "supervisor/probe_config.h"
#include "supervisor/silence_check.h"
#include "supervisor/supervisor_impl.h"

namespace wsup {

FrontLink::Hooks Supervisor::Impl::FrontHooks() {
  FrontLink::Hooks h;
  h.stopping = [this] { return stopping_; };
  h.fatal = [this](const std::string& why) { BeginStop(why, kExitConfig); };
  h.save_state = [this] { SaveState(); };
  h.down = [this](const std::string& why) { SetDegraded(why); };
  h.crash_looping = [this] { UpdateStatusLine(); };
  h.routes = [this] { return WantedRoutes(); };
  h.message = [this](const FrontMessage& m) { OnFrontMessage(m); };
  h.exited = [this] {
    if (stopping_) MaybeFinishStop();
  };
  h.store_listen_fd = [this](int fd) { Logged(notifier_.StoreFds("front-listen", {fd}), "storing the front's socket"); };
  return h;
}

FrontLink::Routes Supervisor::Impl::WantedRoutes() {
  Slot* act = engines_.Active();
  Slot* stby = engines_.Standby();
  return FrontLink::Routes{act ? HostPortString(cfg_.engine.host, act->port) : "",
                           stby ? HostPortString(cfg_.engine.host, stby->port) : ""};
}

void Supervisor::Impl::PushRoutes() { front_.SetRoutes(WantedRoutes()); }

void Supervisor::Impl::OnFrontMessage(const FrontMessage& f) {
  switch (f.kind) {
    case FrontMessage::Kind::kSwitched:
      spdlog::warn("front switched on its own from {} to {}: {}", f.from, f.to, f.reason);
      metrics_.front_self_switches++;
      break;
    case FrontMessage::Kind::kSilent:
      OnFrontSilent(f);
      break;
    case FrontMessage::Kind::kFirstOk:
      // Only an answer of the engine the front routes to now proves the swap.
      if (f.backend == front_.routes().active) failover_.OnFirstOk(f.at_ms > 0 ? f.at_ms : clock_.WallMs());
      break;
    case FrontMessage::Kind::kCut:
      spdlog::info("front: {} request(s) cut from the dead engine and sent on", f.cut);
      break;
    case FrontMessage::Kind::kRoutesAck:
      // Routes acknowledged: the swap is done.
      failover_.OnRoutesAcked();
      break;
    case FrontMessage::Kind::kOther:
      break;
  }
}

void Supervisor::Impl::OnFrontSilent(const FrontMessage& m) {
  const std::string& backend = m.backend;
  Slot* act = engines_.Active();
  const bool routed = act && !backend.empty() && backend == front_.routes().active;
  const int64_t last_byte = m.last_byte_ms;
  std::string report = "the front saw " + std::to_string(m.silent) + " of " + std::to_string(m.inflight) +
                       " requests on " + backend + " get no byte for " + std::to_string(m.after_ms) + " ms";
  char run = 0;
  if (routed && act->pid > 0) {
    auto r = launcher_.RunState(act->pid);
    if (r.ok()) run = *r;
  }
  SilenceVerdict v = JudgeSilence(routed, engines_.Standby() != nullptr, routed ? act->pid : 0, run);
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
  engines_.Fire(s, SlotEvent::kProbeTrip, why);
}

}  // namespace wsup
