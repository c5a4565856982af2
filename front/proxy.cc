#include "front/proxy.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "front/proxy_call.h"
#include "front/routes.h"
#include "http/loop_timer.h"

namespace wsup::front {

Proxy::Proxy(uv_loop_t* loop, ProxyOptions options, EventSink events, FrontShared* shared, Clock* clock,
             TimerSource* timers)
    : loop_(loop),
      options_(options),
      events_(std::move(events)),
      clock_(clock),
      pool_(loop, options_.upstream) {
  services_.router = this;
  services_.engines = this;
  services_.pool = &pool_;
  services_.counters = &counters_;
  services_.options = &options_;
  services_.clock = clock_;
  if (!shared) {
    own_shared_ = std::make_unique<FrontShared>();
    shared = own_shared_.get();
  }
  shared_ = shared;
  if (!timers) {
    own_timers_ = std::make_unique<LoopTimerSource>(loop_);
    timers = own_timers_.get();
  }
  queue_timer_ = timers->Make();
  flow_timer_ = timers->Make();
  hedger_ = std::make_unique<Hedger>(timers, clock_, static_cast<Hedger::Site*>(this));
  if (options_.hedge_after_ms > 0) shared_->FillHedges(options_.hedge_burst);
  hedger_->SetAfter(options_.hedge_after_ms);
}

Proxy::~Proxy() {
  if (!close_.closing() || !calls_.empty()) spdlog::error("front: proxy destroyed while open; call Close() first");
}

void Proxy::Handle(std::shared_ptr<http::ResponseWriter> writer) {
  ++counters_.requests;
  if (options_.hedge_after_ms > 0) {
    shared_->EarnHedge(options_.hedge_percent, options_.hedge_burst);
  }
  if (close_.closing()) {
    writer->Send(http::HttpResponse::Json(503, http::ErrorJson("the front is shutting down; retry", "unavailable")));
    counters_.serving.Answer(writer->request().path, 503);
    return;
  }
  // Only the OpenAI API and /health are an engine's to answer through the
  // front; its control routes are the supervisor's (front/routes.h).
  if (!IsForwardedPath(writer->request().path)) {
    ++counters_.not_forwarded;
    writer->Send(http::HttpResponse::Json(404, http::ErrorJson(kNotForwardedMessage, "not_found_error")));
    counters_.serving.Answer(writer->request().path, 404);
    return;
  }
  auto* call = new ProxyCall(&services_, std::move(writer));
  calls_.insert(call);
  // An idle proxy lets its hedge timer sleep (a front of many loops would
  // otherwise wake each of them up to 200 times a second for nothing).
  hedger_->Wake();
  call->Start();
}

Backend* Proxy::Pick() const {
  const int64_t now = now_ms();
  if (!active_ || active_->down_until_ms > now) return nullptr;
  // Most of the active engine's requests have had no byte for
  // hedge_after_ms and it has sent nothing since: new requests go to the
  // proven standby until it speaks again (or the supervisor decides).
  if (active_->shared->silent_reported.load(std::memory_order_relaxed) && standby_ && standby_->down_until_ms <= now) return standby_;
  return active_;
}

void Proxy::Route(ProxyCall* call) {
  if (Backend* b = Pick(); b && queue_.empty()) {
    if (b != active_) ++counters_.silent_to_standby;
    call->Send(b);
    return;
  }
  if (queue_.size() >= options_.max_queued) {
    call->Reject503("the wait queue is full (" + std::to_string(options_.max_queued) + " requests); " +
                    NoRouteCause());
    return;
  }
  call->Queued(queue_.insert(queue_.end(), call));
  ArmQueueTimer();
}

void Proxy::Dequeue(ProxyCall* call) {
  if (auto slot = call->TakeQueueSlot()) queue_.erase(*slot);
}

void Proxy::Forget(ProxyCall* call) {
  Dequeue(call);
  calls_.erase(call);
  flow_paused_.erase(call);
  close_.Check();
}

void Proxy::WakeQueue() {
  while (!queue_.empty()) {
    Backend* b = Pick();
    if (!b) break;
    ProxyCall* call = queue_.front();
    Dequeue(call);
    if (b != active_) ++counters_.silent_to_standby;
    call->Send(b);
  }
  ArmQueueTimer();
}

void Proxy::ArmQueueTimer() {
  if (close_.closing()) return;
  if (queue_.empty()) {
    queue_timer_->Stop();
    return;
  }
  int64_t next = INT64_MAX;
  for (const ProxyCall* c : queue_) next = std::min(next, c->deadline_ms());
  if (Pick()) {
    next = now_ms();  // a backend is up again: serve the queue on the next turn
  } else if (active_) {
    next = std::min(next, active_->down_until_ms);
  }
  int64_t delay = std::max<int64_t>(0, next - now_ms());
  queue_timer_->Start(delay, [this] { OnQueueTimer(); });
}

void Proxy::OnQueueTimer() {
  int64_t now = now_ms();
  std::vector<ProxyCall*> expired;
  for (ProxyCall* c : queue_) {
    if (c->deadline_ms() <= now) expired.push_back(c);
  }
  if (!expired.empty()) {
    std::string cause = NoRouteCause();
    for (ProxyCall* c : expired) {
      Dequeue(c);
      c->Reject503(cause + " (waited " + std::to_string(options_.queue_timeout_ms) + " ms)");
    }
  }
  WakeQueue();
}

std::string Proxy::NoRouteCause() const {
  if (!active_) return "no engine is routed (the supervisor has not set an active route)";
  std::string why = "the active engine " + active_->name + " is down";
  if (!active_->last_error.empty()) why += " (" + active_->last_error + ")";
  return why + " and no standby is routed";
}

void Proxy::SetRouted(Backend* b, bool routed) {
  if (b) b->routed = routed;
}

Status Proxy::SetRoutes(const std::optional<HostPort>& active, const std::optional<HostPort>& standby, int64_t epoch) {
  if (epoch < epoch_) {
    return Refused("set_routes: epoch " + std::to_string(epoch) + " is older than the current epoch " +
                   std::to_string(epoch_) + "; a newer supervisor has steered this front: read its status and "
                   "send an epoch of at least " + std::to_string(epoch_));
  }
  if (active && standby && active->ToString() == standby->ToString()) {
    return InvalidArgument("set_routes: active and standby are both " + active->ToString() +
                           "; route two different engines, or leave standby null");
  }
  Backend* new_active = active ? Get(*active) : nullptr;
  const Backend* old_active = active_;
  Backend* new_standby = standby ? Get(*standby) : nullptr;
  // The supervisor vouches for what it routes: forget earlier failures.
  for (Backend* b : {new_active, new_standby}) {
    if (b) {
      b->down_until_ms = 0;
      b->failures = 0;
    }
  }
  if (new_active != active_) {
    if (options_.log_routes) {
      spdlog::info("front: route change (epoch {}): active {} -> {}", epoch, active_ ? active_->name : "none",
                   new_active ? new_active->name : "none");
    }
  }
  SetRouted(active_, false);
  SetRouted(standby_, false);
  active_ = new_active;
  standby_ = new_standby;
  SetRouted(active_, true);
  SetRouted(standby_, true);
  epoch_ = epoch;
  if (new_active != old_active) ActiveChanged(old_active);
  pool_.Collect();
  WakeQueue();
  return Status::Ok();
}

int64_t Proxy::EngineDead(const HostPort& addr, const std::string& why) {
  Backend* b = pool_.Find(addr.ToString());
  if (!b) return 0;
  // Down first (with the usual backoff; the supervisor's routes have moved
  // on from it already), so that nothing cut below is sent back to it. If it
  // is still this loop's active (the supervisor had no engine to move to),
  // the front moves to its standby by itself, as after a reset.
  BackendFailed(b, b->name + " died (" + why + ")");
  const size_t cut = pool_.CutBackend(b, UV_ESRCH, why);
  if (cut > 0) spdlog::warn("front: {} died ({}); {} request(s) in flight there sent on", b->name, why, cut);
  WakeQueue();
  return static_cast<int64_t>(cut);
}

Backend* Proxy::Get(const HostPort& addr) {
  Backend* b = pool_.Get(addr);
  if (!b->shared) b->shared = shared_->Backend(b->name);
  return b;
}

void Proxy::PeerFailed(const std::string& name, const std::string& why, int64_t epoch, int64_t at_ms) {
  if (epoch != epoch_ || !active_ || active_->name != name || !standby_) return;
  BackendFailed(active_, why, at_ms);
}

void Proxy::BackendFailed(Backend* b, const std::string& why, int64_t peer_at_ms) {
  const bool from_peer = peer_at_ms > 0;
  int64_t now = now_ms();
  ++b->failures;
  int64_t backoff = options_.down_backoff_ms;
  for (int i = 1; i < b->failures && backoff < options_.down_backoff_max_ms; ++i) backoff *= 2;
  b->down_until_ms = now + std::min(backoff, options_.down_backoff_max_ms);
  b->last_error = why;
  const int64_t wall = from_peer ? peer_at_ms : clock_->WallMs();
  b->failed_at_ms = wall;
  // Every kept-alive connection to it is suspect now.
  std::vector<UpstreamConn*> idle = b->idle;
  for (UpstreamConn* c : idle) c->Close();
  if (b != active_ || !standby_) {
    if (b == active_) spdlog::warn("front: active engine {} failed and no standby is routed; requests wait", why);
    ArmQueueTimer();
    return;
  }
  Backend* from = active_;
  SetRouted(active_, false);
  active_ = standby_;
  standby_ = nullptr;
  if (from_peer) {
    // Another loop of this front switched first and said so; its event is the one.
    ActiveChanged(from);
    WakeQueue();
    return;
  }
  ++counters_.switched_self;
  spdlog::warn("front: switched from {} to {} by itself: {}", from->name, active_->name, why);
  Emit({{"type", "event"},
        {"kind", "switched"},
        {"from", from->name},
        {"to", active_->name},
        {"reason", why},
        {"epoch", epoch_},
        {"at_ms", wall}});
  ActiveChanged(from);  // after the switch's event: a first_ok is about this switch
  WakeQueue();
}

void Proxy::ActiveChanged(const Backend* from) {
  first_ok_pending_ = active_ ? active_->name : "";
  // The new active won hedges of the old one after that one last spoke:
  // clients got its answers before this change (a route change, or the
  // front's own switch), and first_ok says when.
  if (!active_ || !from) return;
  const int64_t won = active_->shared->hedge_win_ms.load();
  if (won <= from->shared->last_byte_ms.load()) return;
  first_ok_pending_.clear();
  Emit({{"type", "event"},
        {"kind", "first_ok"},
        {"backend", active_->name},
        {"epoch", epoch_},
        {"at_ms", won},
        {"hedged", true}});
}

void Proxy::Answered(Backend* b) {
  b->failures = 0;
  b->last_ok_ms = clock_->WallMs();
  if (first_ok_pending_.empty() || first_ok_pending_ != b->name) return;
  first_ok_pending_.clear();
  Emit({{"type", "event"}, {"kind", "first_ok"}, {"backend", b->name}, {"epoch", epoch_}, {"at_ms", clock_->WallMs()}});
}

void Proxy::Emit(const nlohmann::json& event) {
  if (event_log_.size() >= kEventLogSize) event_log_.pop_front();
  event_log_.push_back(event);
  if (events_) events_(event);
}

void Proxy::WatchFlow(ProxyCall* call) {
  flow_paused_.insert(call);
  if (!close_.closing() && !flow_timer_->active()) flow_timer_->Start(10, [this] { OnFlowTimer(); }, 10);
}

void Proxy::OnFlowTimer() {
  std::vector<ProxyCall*> paused(flow_paused_.begin(), flow_paused_.end());
  for (ProxyCall* c : paused) {
    if (c->ResumeIfDrained(options_.client_buffer_low)) flow_paused_.erase(c);
  }
  if (flow_paused_.empty()) flow_timer_->Stop();
}

nlohmann::json Proxy::StatusJson() const {
  nlohmann::json inflight = nlohmann::json::object();
  nlohmann::json down = nlohmann::json::object();
  nlohmann::json backends = nlohmann::json::object();
  int64_t now = now_ms();
  for (const auto& [name, b] : pool_.backends()) {
    if (b->routed || b->inflight > 0) inflight[name] = b->inflight;
    if (b->down_until_ms > now) {
      down[name] = {{"for_ms", b->down_until_ms - now}, {"error", b->last_error}, {"failed_at_ms", b->failed_at_ms}};
    }
    const char* role = b.get() == active_ ? "active" : b.get() == standby_ ? "standby" : "none";
    nlohmann::json entry = {{"route", role}, {"inflight", b->inflight}, {"failures", b->failures}};
    // Wall times only when known: 0 would read as 1970.
    if (b->failed_at_ms > 0) {
      entry["failed_at_ms"] = b->failed_at_ms;
      entry["error"] = b->last_error;
    }
    if (b->last_ok_ms > 0) entry["last_ok_ms"] = b->last_ok_ms;
    if (b->shared && b->shared->last_byte_ms.load() > 0) entry["last_byte_ms"] = b->shared->last_byte_ms.load();
    backends[name] = std::move(entry);
  }
  nlohmann::json j;
  j["active"] = active_ ? nlohmann::json(active_->name) : nlohmann::json(nullptr);
  j["standby"] = standby_ ? nlohmann::json(standby_->name) : nlohmann::json(nullptr);
  j["epoch"] = epoch_;
  j["inflight"] = std::move(inflight);
  j["queued"] = queue_.size();
  j["down"] = std::move(down);
  j["backends"] = std::move(backends);
  j["events"] = nlohmann::json::array();
  for (const auto& e : event_log_) j["events"].push_back(e);
  j["counters"] = {{"requests", counters_.requests},         {"ok", counters_.ok},
                   {"failed", counters_.failed},             {"retried", counters_.retried},
                   {"resumed", counters_.resumed},           {"resumed_chat", counters_.resumed_chat},
                   {"resume_refused", counters_.resume_refused},
                   {"switched_self", counters_.switched_self},
                   {"rejected_503", counters_.rejected_503}, {"client_closed", counters_.client_closed},
                   {"rejected_400", counters_.rejected_400}, {"hedged", counters_.hedged},
                   {"hedge_won", counters_.hedge_won},       {"hedge_lost", counters_.hedge_lost},
                   {"hedge_failed", counters_.hedge_failed}, {"hedge_refused", counters_.hedge_refused},
                   {"silent_reports", counters_.silent_reports},
                   {"silent_to_standby", counters_.silent_to_standby},
                   {"not_forwarded", counters_.not_forwarded}};
  counters_.serving.AppendTo(&j["counters"]);
  j["hedging"] = {{"after_ms", options_.hedge_after_ms},
                  {"percent", options_.hedge_percent},
                  {"burst", options_.hedge_burst},
                  {"budget", shared_->hedge_budget()}};
  return j;
}

void Proxy::Close(std::function<void()> done) {
  if (!close_.Begin(std::move(done))) return;
  ShareSilence(nullptr, 0, 0);
  std::vector<ProxyCall*> all(calls_.begin(), calls_.end());
  for (ProxyCall* c : all) c->Cancel();
  queue_.clear();
  // A timer's callback never runs once it is gone; each frees its own
  // handle (http/loop_timer.h), while the loop still runs.
  queue_timer_.reset();
  flow_timer_.reset();
  hedger_->Close();
  pool_.Close([this] {
    pool_closed_ = true;
    close_.Check();
  });
}

}  // namespace wsup::front
