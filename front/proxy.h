// Proxy: the front's request path. Every client request is forwarded to the
// active engine and the answer streamed back; the supervisor steers where
// "active" is (SetRoutes), and the front moves on its own when the active
// engine refuses or drops connections.
//
// Per request (a ProxyCall, front/proxy_call.h):
//   - routing: the active backend when it is up; otherwise the call waits
//     in a bounded queue until a route appears (served at once) or the queue
//     timeout passes (503 with Retry-After and the cause);
//   - failures before any byte reached the client: a refused connect never
//     reached an engine and is simply tried again; a request that was sent
//     and got no complete answer is sent again ONCE (max_retries); a reused
//     keep-alive connection that turns out closed is retried on a fresh one
//     first, without counting;
//   - the active engine refusing, resetting or closing a connection marks it
//     down (with a short backoff) and, when a standby is routed, makes the
//     standby active in one step and pushes a `switched` event;
//   - a client that goes away (its connection closes or errs, or it sends
//     EOF: http/server.h) ends its call: the engine connection is closed,
//     so the engine cancels the request, and nothing is sent again;
//   - a completion body past the shared JSON limits (common/json_limits.h)
//     is answered 400 by the front and never forwarded;
//   - streamed completions are resumed after a cut (see completion.h,
//     sse_relay.h): the client sees one stream, no gap, no repeated token;
//   - any other cut after bytes reached the client closes the client's
//     connection, so a truncated answer is never presented as complete;
//   - hedging on silence (hedge_after_ms > 0): a request that has had no
//     byte from the active engine for hedge_after_ms is sent to the routed
//     standby as well. The first of the two to answer wins (a response head
//     for a plain request, the first event bytes for a stream) and the other
//     is closed, so its engine cancels the request. A stream that already
//     delivered tokens is hedged with its resume request (completion.h), so
//     the client still sees one stream. Hedges are bounded by a token
//     bucket (hedge_percent hedges per 100 requests, at most hedge_burst
//     saved) and are
//     never sent to a standby that is not routed or is down;
//   - when the active engine has sent no byte on any request for
//     hedge_after_ms while at least two requests waited that long, a `silent` event
//     tells the supervisor, which may trip the engine at once instead of
//     waiting for its probes' hysteresis. Until that engine sends a byte
//     again, new requests go to the standby, and its requests are hedged
//     without waiting hedge_after_ms again (within the budget);
//   - every event it emits (switched, first_ok, silent) is also kept in a
//     bounded log that the status reply carries, for a supervisor that was away.
// Responses announcing a Content-Length up to buffer_limit_bytes are
// relayed in one piece (one write; a cut before the end is retried
// invisibly); others, and all event streams, are relayed as they arrive.
//
// Files: proxy.cc (accepting, routing, the queue, switching, status),
// proxy_silence.cc (the hedge scan's side: silence, budget); a call is
// front/proxy_call.h.
//
// Ownership: the Proxy owns its calls, its UpstreamPool, two timers and a
// Hedger (front/hedge.h) with the third (common/timer.h: made by the
// TimerSource it is given, so that tests drive its queue timeout and
// hedging with a fake clock); it
// never owns a client connection (the HttpServer does). Close() ends every
// call and closes the pool and timers; `done` runs when all are freed.
// Threads: the loop thread only. A front of several loops runs one Proxy
// per loop (front/worker.h); they share only a FrontShared (front/shared.h):
// engine silence and the hedge budget are judged over all of them.
#pragma once

#include <uv.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "common/clock.h"
#include "common/close_latch.h"
#include "common/log_limit.h"
#include "common/status.h"
#include "common/timer.h"
#include "front/address.h"
#include "front/call_services.h"
#include "front/hedge.h"
#include "front/proxy_options.h"
#include "front/shared.h"
#include "front/upstream.h"
#include "http/server.h"

namespace wsup::front {

class ProxyCall;

// A call reaches the proxy only through CallServices (front/call_services.h):
// the Proxy is its CallRouter and its EngineBook, privately.
class Proxy : private CallRouter, private EngineBook, private Hedger::Site {
 public:
  using EventSink = std::function<void(const nlohmann::json& event)>;

  // `shared`: the state this proxy shares with the front's other loops
  // (front/shared.h); null: its own (a front of one loop).
  // `timers` and `clock`: its queue, flow and hedge timers and the time it
  // reads (tests drive both from a FakeClock); null timers: timers on `loop`.
  Proxy(uv_loop_t* loop, ProxyOptions options, EventSink events, FrontShared* shared = nullptr,
        Clock* clock = &RealClock(), TimerSource* timers = nullptr);
  ~Proxy() override;
  Proxy(const Proxy&) = delete;
  Proxy& operator=(const Proxy&) = delete;

  // The HttpServer handler.
  void Handle(std::shared_ptr<http::ResponseWriter> writer);

  // Routes new requests to `active` from now on (one step: calls in flight
  // on the previous active finish there). A standby is used when the active
  // fails. An epoch lower than the current one is refused (a stale sender).
  Status SetRoutes(const std::optional<HostPort>& active, const std::optional<HostPort>& standby, int64_t epoch);
  // New queue limits (the supervisor's reload); requests already queued
  // keep the deadline they were given.
  void SetLimits(int64_t queue_timeout_ms, size_t max_queued) {
    options_.queue_timeout_ms = queue_timeout_ms;
    options_.max_queued = max_queued;
  }
  // The engine at `addr` died (its supervisor saw it): it is marked down,
  // and every request in flight there is failed over
  // now (retried, or a stream resumed) rather than when its sockets close.
  // Returns how many requests were cut.
  int64_t EngineDead(const HostPort& addr, const std::string& why);
  // New hedging settings (the supervisor's reload); hedges in flight go on.
  void SetHedging(const HedgeLimits& h);

  // active, standby, epoch, inflight per backend, queued, down, counters,
  // backends (per backend: what the front knows of it) and events (the log).
  nlohmann::json StatusJson() const;
  // The events the front emitted (switched, first_ok, silent), oldest first, at most
  // kEventLogSize. Kept because an event pushed while no supervisor is
  // connected reaches nobody: a supervisor that restarts reads them here.
  const std::deque<nlohmann::json>& event_log() const { return event_log_; }
  static constexpr size_t kEventLogSize = 64;
  const ProxyCounters& counters() const { return counters_; }
  size_t call_count() const { return calls_.size(); }

  void Close(std::function<void()> done = {});

  // Another loop of this front switched from the active engine `name` at
  // `epoch` (at wall time at_ms): do the same if this loop still routes it so.
  void PeerFailed(const std::string& name, const std::string& why, int64_t epoch, int64_t at_ms);

 private:
  int64_t now_ms() const { return clock_->MonotonicMs(); }
  // CallRouter (front/call_services.h).
  void Route(ProxyCall* call) override;
  void Forget(ProxyCall* call) override;
  void WatchFlow(ProxyCall* call) override;
  void Dequeue(ProxyCall* call);
  // EngineBook (front/call_services.h).
  void Failed(Backend* b, const std::string& why) override { BackendFailed(b, why); }
  void Answered(Backend* b) override;
  void Spoke(Backend* b) override;
  void HedgeWon(Backend* b) override;
  // `peer_at_ms` > 0: another loop of the front saw it fail then (wall
  // time) and switched; its event is the one the supervisor gets: follow
  // without an event.
  void BackendFailed(Backend* b, const std::string& why, int64_t peer_at_ms = 0);
  std::string NoRouteCause() const;

  Backend* Get(const HostPort& addr);
  // The active engine is now a different one (was `from`): first_ok is
  // due at its first good answer, or at once if it won hedges already.
  void ActiveChanged(const Backend* from);
  Backend* Pick() const;
  void WakeQueue();
  void ArmQueueTimer();
  void OnQueueTimer();
  void OnFlowTimer();
  // Hedger::Site: what the hedge scan reads and does (front/hedge.h).
  void Candidates(std::vector<HedgeCandidate>* out) override;
  const Backend* Active() const override { return active_; }
  Backend* HedgeTarget(int64_t now_ms) const override;
  bool JudgeSilence(const HedgeScan& counts, int64_t now_ms) override;
  bool TakeToken() override;
  void Hedge(size_t index, Backend* target) override;
  void BudgetSpent(const std::vector<size_t>& indexes, size_t fresh, int64_t now_ms) override;
  void Idle() override;
  // This loop's counts of requests waiting on its active engine `b`, and of
  // those silent, into b's shared record (null: it counts none now).
  void ShareSilence(SharedBackend* b, int waiting, int silent);
  void SetRouted(Backend* b, bool routed);
  void Emit(const nlohmann::json& event);

  uv_loop_t* loop_;
  ProxyOptions options_;
  EventSink events_;
  Clock* clock_;
  UpstreamPool pool_;
  CallServices services_;  // what the calls get of this proxy
  std::unique_ptr<TimerSource> own_timers_;
  std::unique_ptr<Timer> queue_timer_;
  std::unique_ptr<Timer> flow_timer_;
  std::unique_ptr<Hedger> hedger_;  // scans calls for silence while hedging is on
  std::vector<ProxyCall*> scanned_;  // the calls of the hedge scan's tick, by index
  // Warnings the hedge timer could repeat every tick: once a second each.
  LogLimiter refused_log_{1000}, silent_log_{1000};
  uint64_t refused_since_log_ = 0;
  std::unique_ptr<FrontShared> own_shared_;
  FrontShared* shared_;
  SharedBackend* shared_for_ = nullptr;  // the record this loop's counts are in
  int shared_waiting_ = 0, shared_silent_ = 0;
  bool pool_closed_ = false;
  // Done once the pool is closed and every call has ended.
  CloseLatch close_{[this] { return pool_closed_ && calls_.empty(); }};

  Backend* active_ = nullptr;
  Backend* standby_ = nullptr;
  int64_t epoch_ = 0;
  std::string first_ok_pending_;  // the backend whose first good answer is still to be reported

  std::unordered_set<ProxyCall*> calls_;
  std::list<ProxyCall*> queue_;
  std::unordered_set<ProxyCall*> flow_paused_;
  std::deque<nlohmann::json> event_log_;
  ProxyCounters counters_;
};

}  // namespace wsup::front
