// The node's wiring of its front: the hooks of FrontLink (front_link.h, the
// front's one owner), SilenceWatch (silence_watch.h) and FrontProbe
// (front_probe.h), each of the front's messages to the owner it concerns,
// and the routes the front should have.
#include "common/log.h"
#include "supervisor/messages.h"
#include "supervisor/probe_config.h"
#include "supervisor/node.h"

namespace wsup {

FrontLink::Hooks Node::FrontHooks() {
  FrontLink::Hooks h;
  h.stopping = [this] { return stop_.stopping(); };
  h.fatal = [this](const std::string& why) { stop_.Begin(why, kExitConfig); };
  h.save_state = [this] { SaveState(); };
  h.down = [this](const std::string& why) { health_.SetDegraded(why); };
  h.crash_looping = [this] { health_.Update(); };
  h.routes = [this] { return WantedRoutes(); };
  h.message = [this](const FrontMessage& m) { OnFrontMessage(m); };
  h.exited = [this] { stop_.ChildExited(); };
  h.store_listen_fd = [this](int fd) {
    LogFailure(notifier_.StoreFds("front-listen", {fd}), "storing the front's socket");
  };
  return h;
}

FrontLink::Routes Node::WantedRoutes() {
  Slot* act = engines_.Active();
  Slot* stby = engines_.Standby();
  return FrontLink::Routes{act ? HostPortString(cfg_.engine.host, act->port) : "",
                           stby ? HostPortString(cfg_.engine.host, stby->port) : ""};
}

void Node::OnFrontMessage(const FrontMessage& f) {
  switch (f.kind) {
    case FrontMessage::Kind::kSwitched:
      spdlog::warn("front switched on its own from {} to {}: {}", f.from, f.to, f.reason);
      metrics_.front_self_switches++;
      break;
    case FrontMessage::Kind::kSilent:
      silence_.OnSilent(f);
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

SilenceWatch::Hooks Node::SilenceHooks() {
  SilenceWatch::Hooks h;
  h.stopping = [this] { return stop_.stopping(); };
  h.active = [this]() -> std::optional<SilenceWatch::Engine> {
    Slot* act = engines_.Active();
    if (!act) return std::nullopt;
    return SilenceWatch::Engine{act->name, act->pid, HostPortString(cfg_.engine.host, act->port)};
  };
  h.routed = [this] { return front_.routes().active; };
  h.standby_ready = [this] { return engines_.Standby() != nullptr; };
  h.run_state = [this](pid_t pid) { return launcher_.RunState(pid); };
  h.last_byte = [this](const std::string& slot, int64_t ms) {
    if (Slot* s = engines_.ByName(slot)) s->traffic_last_ms = ms;
  };
  h.make_probe = [this](const SilenceWatch::Engine& e) -> std::unique_ptr<Probe> {
    Slot* s = engines_.ByName(e.slot);
    if (!s) return nullptr;
    return MakeProbeFromConfig(cfg_, s->port, s->control_token, *http_, clock_);
  };
  h.trip = [this](const std::string& slot, const std::string& why) {
    Slot* s = engines_.ByName(slot);
    if (!s) return;
    s->semantic_ready = false;
    s->tripped_hung = true;  // the front saw it silent, and a probe found it so
    engines_.Fire(*s, SlotEvent::kProbeTrip, why);
  };
  h.counted = [this](const char* outcome) { metrics_.front_silent[outcome]++; };
  return h;
}

FrontProbe::Hooks Node::FrontProbeHooks() {
  FrontProbe::Hooks h;
  h.stopping = [this] { return stop_.stopping(); };
  h.spec = [this] { return SemanticSpecFromConfig(cfg_); };
  h.queue_ms = [this] { return cfg_.front.queue_timeout_ms; };
  h.send = [this](http::ClientRequest req, http::ResponseCallback done) {
    // The front listens on every address: the probe goes to loopback.
    const std::string& listen = cfg_.front.listen.host;
    const std::string host = listen == "0.0.0.0" ? "127.0.0.1" : listen == "::" ? "::1" : listen;
    http_->Send(host, front_.port(), std::move(req), std::move(done));
  };
  return h;
}

}  // namespace wsup
