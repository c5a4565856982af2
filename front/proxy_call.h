// ProxyCall: one client request on its way through the front (front/proxy.h
// says what the request path promises). It lives from Proxy::Handle until
// its answer is complete, the client is gone, or the proxy closes.
//
// Where it is in its life is a CallState (front/call_state.h), moved only
// along that table's rows. Each attempt on an engine is an Attempt
// (front/attempt.h) that holds the engine's in-flight count; a hedge is a
// second one, raced in a HedgeLeg (front/hedge.h). What it does when an
// attempt fails is a row of the failure table (front/call_policy.h). What
// it uses of the proxy is CallServices (front/call_services.h), nothing else.
//
// Files: proxy_call.cc (start, attempts, failures, the end), proxy_relay.cc
// (the engine's answer to the client, flow control), proxy_hedge.cc (its
// hedge).
//
// Ownership: it owns itself (deleted when it finishes, or when the
// outermost callback it is in returns: entry points hold a Guard, so that a
// call that finishes inside one of them is not freed under it). It holds its
// client's writer, never the client connection (the HttpServer owns that).
// Threads: the loop thread only.
#pragma once

#include <cstdint>
#include <list>
#include <utility>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "front/attempt.h"
#include "front/call_services.h"
#include "front/call_state.h"
#include "front/completion.h"
#include "front/hedge.h"
#include "front/sse_relay.h"
#include "http/server.h"

namespace wsup::front {

class ProxyCall final : private UpstreamListener, private HedgeLeg::Owner {
 public:
  using QueueSlot = std::list<ProxyCall*>::iterator;

  ProxyCall(const CallServices* services, std::shared_ptr<http::ResponseWriter> writer)
      : s_(services), writer_(std::move(writer)) {}
  ProxyCall(const ProxyCall&) = delete;
  ProxyCall& operator=(const ProxyCall&) = delete;

  // Reads the request (a completion is checked against the JSON limits and
  // planned once) and routes it.
  void Start();

  // The router's side (CallRouter::Route and the queue).
  // Sends the request (or the stream's continuation) to `b`.
  void Send(Backend* b);
  // No engine now: the call waits at `slot` of the router's queue.
  void Queued(QueueSlot slot);
  // The router takes the call out of its queue (nullopt: it was not in it).
  std::optional<QueueSlot> TakeQueueSlot() { return std::exchange(queue_slot_, std::nullopt); }
  // Loop time after which a queued call is answered 503.
  int64_t deadline_ms() const { return deadline_ms_; }
  // The queue timeout passed (or the queue is full) with no engine to take it.
  void Reject503(const std::string& cause);
  // The proxy is closing: drop everything.
  void Cancel();
  // The client's unsent bytes fell to `low`: reading from the engine goes
  // on. False while still above.
  bool ResumeIfDrained(size_t low);

  // The hedge scan's side (front/hedge.h).
  HedgeCandidate HedgeView() const;
  // Sends the request (or the stream's continuation) to `b` as well.
  void Hedge(Backend* b);
  // The budget was spent when it was silent (counted once).
  void MarkHedgeRefused() { hedge_refused_ = true; }

  // The engine its attempt is on now (null: none).
  Backend* backend() const { return attempt_.backend(); }
  CallState state() const { return state_; }

 private:
  enum class Mode { kNone, kBuffer, kStream, kSse };

  struct Guard {
    explicit Guard(ProxyCall* c) : c_(c) { ++c_->depth_; }
    ~Guard() {
      if (--c_->depth_ == 0 && c_->done()) delete c_;
    }
    Guard(const Guard&) = delete;
    Guard& operator=(const Guard&) = delete;
    ProxyCall* c_;
  };

  // UpstreamListener: the call's attempt (proxy_relay.cc, OnUpstreamError in proxy_call.cc).
  void OnUpstreamHead(int status, std::vector<http::Header>* headers) override;
  void OnUpstreamBody(std::string_view data) override;
  void OnUpstreamDone() override;
  void OnUpstreamError(const UpstreamError& e) override;
  // HedgeLeg::Owner: its hedge (proxy_hedge.cc).
  void OnHedgeProgress() override;
  void OnHedgeError(const UpstreamError& e) override;

  // Moves along the state table; a move with no row is logged and ignored.
  void Move(CallEvent e);
  bool done() const { return state_ == CallState::kDone; }
  bool resuming() const { return IsResuming(state_); }
  int64_t now_ms() const { return s_->clock->MonotonicMs(); }
  int64_t now_us() const { return s_->clock->MonotonicUs(); }
  const ProxyOptions& options() const { return *s_->options; }
  ProxyCounters& counters() const { return *s_->counters; }
  const std::string& id() const { return writer_->request().request_id; }

  void Reject400(const std::string& message);
  void OnClientGone();
  void Fail502(const UpstreamError& e, const std::string& backend);
  // Routes the call again after its attempt failed (`counted`: a re-send
  // that spends the retry budget and restarts the queue deadline).
  void Reroute(bool counted);
  // Continues a stream cut after `remaining` tokens still owed elsewhere.
  void ResumeStream(bool counted, int64_t remaining, const std::string& why);
  void Finish();
  void ResetAttempt();
  void Heard();
  void CheckFlow();
  // `tokens` more of the stream's tokens went to the client now (the
  // serving histograms: time to first token, time per output token).
  void CountTokens(size_t tokens);
  // The stream's state for the policy tables (kNotStream unless relaying events).
  StreamState Stream() const;
  // The prompt's ids for a continuation: as the client sent them, or as
  // the engine reported them.
  const std::vector<int64_t>& PromptIds() const {
    return plan_.prompt_ids_given ? plan_.prompt_ids : sse_->prompt_ids();
  }
  // The request that continues the stream with `remaining` tokens: its
  // body and target ("" for the client's). Before the first token, with
  // the prompt's ids unknown, the client's own request is sent again.
  void Continuation(int64_t remaining, std::string* body, std::string* target) const;
  int64_t TokensOwed() const;

  bool HedgePending() const { return hedge_ && hedge_->pending(); }
  bool CanHedge() const;
  void AdoptHedge();
  void EndHedge(const char* why);

  const CallServices* s_;
  std::shared_ptr<http::ResponseWriter> writer_;
  int depth_ = 0;
  CallState state_ = CallState::kNew;
  std::optional<QueueSlot> queue_slot_;  // the router's, while queued
  int64_t deadline_ms_ = 0;

  std::string head_;
  std::string_view body_;
  CompletionPlan plan_;
  std::unique_ptr<CompletionStream> sse_;
  std::string resume_body_;
  std::string target_;  // where the request goes, when not the client's target (a chat's continuation)
  // Sent again after the engine it ran on failed mid-request: marked
  // (X-Wsup-Resume: cut) so that the next engine may adopt its KV from
  // the dead engine's journal (docs/kv_journal.md).
  bool cut_ = false;

  Attempt attempt_;  // the engine the request is on now, and its connection
  bool force_fresh_ = false;
  bool stale_retry_used_ = false;
  int retries_ = 0;
  int resumes_ = 0;
  bool flow_paused_ = false;

  Mode mode_ = Mode::kNone;
  int status_ = 0;
  std::vector<http::Header> resp_headers_;
  std::string resp_body_;
  std::string out_;
  int64_t start_ms_ = 0;
  int64_t start_us_ = 0;       // the front's receipt of the request, for the serving histograms
  int64_t last_token_us_ = 0;  // the stream's latest token reached the client (0: none yet)
  int64_t last_byte_ms_ = 0;  // loop time of the engine's latest byte, or of the attempt's start
  bool answer_pending_ = false;  // a 2xx head came; the answer counts as good at its first body byte

  // Hedges: one in the call's life, as docs/front.md promises (a call the
  // hedge took over is not hedged again: the supervisor's probes judge the
  // engine it is on). Kept until the call ends: the connection it handed
  // over sends its head and body.
  static constexpr size_t kMaxHedges = 1;
  std::vector<std::unique_ptr<HedgeLeg>> hedges_;
  HedgeLeg* hedge_ = nullptr;
  bool hedge_refused_ = false;
};

}  // namespace wsup::front
