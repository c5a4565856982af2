#include "front/proxy.h"
#include "front/routes.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <strings.h>

#include "front/attempt.h"
#include "front/call_policy.h"
#include "front/completion.h"
#include "front/hedge.h"
#include "front/request_head.h"
#include "front/sse_relay.h"
#include "http/loop_timer.h"

namespace wsup::front {

using http::Header;
using http::HeaderNameEquals;

// One client request on its way through the front. Lives from Handle()
// until its answer is complete, the client is gone, or the proxy closes.
// Entry points from callbacks hold a Guard, so that a call that finishes
// inside one of them (the client vanished during a write) is deleted only
// when the outermost entry returns.
class ProxyCall final : public UpstreamListener, public HedgeLeg::Owner {
 public:
  ProxyCall(Proxy* proxy, std::shared_ptr<http::ResponseWriter> writer)
      : proxy_(proxy), writer_(std::move(writer)) {}

  void Start();
  // Sends the request to `b` (from Proxy::Dispatch or the queue).
  void Send(Backend* b);
  // The queue timeout passed (or the queue is full) with no engine to take it.
  void Reject503(const std::string& cause);
  // The request is one no engine may be given (past the JSON limits).
  void Reject400(const std::string& message);
  // The proxy is closing: drop everything.
  void Cancel();

  void OnUpstreamHead(int status, std::vector<Header>* headers) override;
  void OnUpstreamBody(std::string_view data) override;
  void OnUpstreamDone() override;
  void OnUpstreamError(const UpstreamError& e) override;

  void CheckFlow();
  bool ResumeIfDrained(size_t low);

  // The call as the hedge scan sees it (front/hedge.h).
  HedgeCandidate HedgeView() const;
  Backend* backend() const { return attempt_.backend(); }
  // Sends the request (or the stream's resume request) to `b` as well.
  void Hedge(Backend* b);
  // From the hedge's listener.
  void OnHedgeProgress() override;
  void OnHedgeError(const UpstreamError& e) override;

  int64_t deadline_ms = 0;
  std::list<ProxyCall*>::iterator queue_pos;
  bool queued = false;
  bool hedge_refused = false;  // the budget was spent when it was silent (counted once)

 private:
  bool CanHedge() const;
  enum class Mode { kNone, kBuffer, kStream, kSse };

  struct Guard {
    explicit Guard(ProxyCall* c) : c_(c) { ++c_->depth_; }
    ~Guard() {
      if (--c_->depth_ == 0 && c_->finished_) delete c_;
    }
    ProxyCall* c_;
  };

  void OnClientGone();
  // The engine's request head; `cut` adds X-Wsup-Resume: cut.
  void BuildHead(const Backend* b, std::string_view body, bool cut, std::string* out) const;
  bool HedgePending() const;
  void AdoptHedge();
  void EndHedge(const char* why);
  void Heard();
  void ResetAttempt();
  void Fail502(const UpstreamError& e, const std::string& backend);
  void Finish();
  const std::string& id() const { return writer_->request().request_id; }

  Proxy* proxy_;
  std::shared_ptr<http::ResponseWriter> writer_;
  int depth_ = 0;
  bool finished_ = false;

  std::string head_;
  std::string_view body_;
  CompletionPlan plan_;
  std::unique_ptr<CompletionStream> sse_;
  std::string resume_body_;
  bool resuming_ = false;
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
  std::vector<Header> resp_headers_;
  std::string resp_body_;
  std::string out_;
  int64_t start_ms_ = 0;
  int64_t last_byte_ms_ = 0;  // loop time of the engine's latest byte, or of the attempt's start
  bool answer_pending_ = false;  // a 2xx head came; the answer counts as good at its first body byte

  // Hedges: one in the call's life, as docs/front.md promises (a call the
  // hedge took over is not hedged again: the supervisor's probes judge the
  // engine it is on). Kept until the call ends: the connection it handed
  // over sends its head and body.
  static constexpr size_t kMaxHedges = 1;
  std::vector<std::unique_ptr<HedgeLeg>> hedges_;
  HedgeLeg* hedge_ = nullptr;
};

void ProxyCall::Start() {
  Guard g(this);
  start_ms_ = proxy_->now_ms();
  deadline_ms = start_ms_ + proxy_->options().queue_timeout_ms;
  writer_->OnClose([this] { OnClientGone(); });
  const http::HttpRequest& r = writer_->request();
  body_ = r.body;
  if (r.method == "POST" && r.path == "/v1/completions") {
    // Past the shared JSON limits: refused here, before anything parses it
    // and before an engine spends a parse on it (the engine would refuse it
    // with the same words).
    if (Status limits = CheckCompletionBody(r.body); !limits.ok()) {
      Reject400(limits.error().message());
      return;
    }
  }
  // Only a completion that may ask for a stream is parsed; everything else
  // is forwarded byte for byte.
  if (r.method == "POST" && r.path == "/v1/completions" && MayRequestStream(r.body)) {
    if (PlanCompletion(r.body, proxy_->options().default_max_tokens, &plan_) && plan_.stream) {
      body_ = plan_.upstream_body;
      if (plan_.resumable) {
        sse_ = std::make_unique<CompletionStream>(!plan_.client_wants_token_ids);
      } else {
        spdlog::debug("front: request {}: stream not resumable: {}", id(), plan_.not_resumable);
      }
    }
  }
  proxy_->Dispatch(this);
}

void ProxyCall::BuildHead(const Backend* b, std::string_view body, bool cut, std::string* out) const {
  BuildRequestHead(writer_->request(), b->name, body, cut, out);
}

void ProxyCall::Send(Backend* b) {
  Guard g(this);
  if (finished_) return;
  attempt_ = Attempt(b);
  ResetAttempt();
  BuildHead(b, body_, cut_, &head_);
  last_byte_ms_ = proxy_->now_ms();
  attempt_.Lend(proxy_->pool().Acquire(b, force_fresh_));
  force_fresh_ = false;
  attempt_.conn()->Send(this, head_, body_, writer_->request().method == "HEAD");
}

void ProxyCall::ResetAttempt() {
  answer_pending_ = false;
  if (resuming_) return;  // the client's head is out; only the engine side restarts
  mode_ = Mode::kNone;
  status_ = 0;
  resp_headers_.clear();
  resp_body_.clear();
}

void ProxyCall::OnUpstreamHead(int status, std::vector<Header>* headers) {
  Guard g(this);
  Heard();
  const std::string* content_type = FindHeader(*headers, "Content-Type");
  const bool event_stream = IsEventStream(*headers);
  if (resuming_) {
    if (status / 100 == 2 && event_stream) {
      answer_pending_ = true;
      return;  // the continuation's events follow the ones already sent
    }
    spdlog::warn("front: request {}: resuming the stream on {} got status {} ({}); closing the client's connection",
                 id(), attempt_.backend()->name, status, content_type ? *content_type : "no content type");
    ++proxy_->mutable_counters().failed;
    writer_->Abort();
    Finish();
    return;
  }
  status_ = status;
  // A 2xx head of a whole answer is a good answer; a stream's (or a big
  // body's) head only says the engine took the request: that one is good at
  // its first body byte (OnUpstreamBody), as clients see it.
  answer_pending_ = status / 100 == 2;
  size_t announced = SIZE_MAX;
  resp_headers_ = RelayedHeaders(headers, &announced);
  bool bodiless = writer_->request().method == "HEAD" || status == 204 || status == 304;
  if (sse_ && status / 100 == 2 && event_stream) {
    mode_ = Mode::kSse;
    writer_->StartStream(status, std::move(resp_headers_));
  } else if (bodiless || announced <= proxy_->options().buffer_limit_bytes) {
    mode_ = Mode::kBuffer;
    if (answer_pending_) {
      answer_pending_ = false;
      proxy_->BackendAnswered(attempt_.backend());
    }
    if (announced != SIZE_MAX && !bodiless) resp_body_.reserve(announced);
  } else {
    mode_ = Mode::kStream;
    writer_->StartStream(status, std::move(resp_headers_));
  }
}

void ProxyCall::OnUpstreamBody(std::string_view data) {
  Guard g(this);
  Heard();
  if (answer_pending_) {
    answer_pending_ = false;
    proxy_->BackendAnswered(attempt_.backend());
  }
  switch (mode_) {
    case Mode::kBuffer:
      resp_body_.append(data);
      break;
    case Mode::kStream:
      writer_->Write(data);
      CheckFlow();
      break;
    case Mode::kSse:
      out_.clear();
      sse_->Feed(data, &out_);
      if (!out_.empty()) writer_->Write(out_);
      CheckFlow();
      break;
    case Mode::kNone:
      break;
  }
}

void ProxyCall::OnUpstreamDone() {
  Guard g(this);
  // A 2xx answer that ended with no body byte (an empty stream) is good too.
  if (answer_pending_) {
    answer_pending_ = false;
    proxy_->BackendAnswered(attempt_.backend());
  }
  attempt_.Complete();  // the connection went back to the pool
  switch (mode_) {
    case Mode::kBuffer: {
      http::HttpResponse resp;
      resp.status = status_;
      resp.headers = std::move(resp_headers_);
      resp.body = std::move(resp_body_);
      writer_->Send(std::move(resp));
      break;
    }
    case Mode::kSse:
    case Mode::kStream:
      writer_->End();
      break;
    case Mode::kNone:
      writer_->Send(http::HttpResponse::Json(502, http::ErrorJson("the engine's answer had no head", "upstream_error")));
      break;
  }
  ++proxy_->mutable_counters().ok;
  spdlog::debug("front: request {} {} {} -> {} in {} ms", id(), writer_->request().method, writer_->request().target,
                status_, proxy_->now_ms() - start_ms_);
  Finish();
}

// What the call does next is one row of the failure table
// (front/call_policy.h); this carries it out.
void ProxyCall::OnUpstreamError(const UpstreamError& e) {
  Guard g(this);
  Backend* b = attempt_.Complete();  // the connection is closed
  if (flow_paused_) flow_paused_ = false;
  FailureFacts facts;
  facts.stage = e.stage;
  facts.stale = e.reused && e.stage == UpstreamError::Stage::kAwaitingResponse && !stale_retry_used_;
  facts.hedge_pending = HedgePending();
  facts.delivered = writer_->started();
  const bool sse = mode_ == Mode::kSse;
  const int64_t remaining = sse ? plan_.max_tokens - static_cast<int64_t>(sse_->delivered().size()) : 0;
  facts.stream = sse ? StreamStateOf(sse_->done(), sse_->finished(), sse_->trackable(), sse_->error_seen(), remaining)
                     : StreamState::kNotStream;
  facts.budget_left = (facts.delivered ? resumes_ : retries_) < proxy_->options().max_retries;
  const FailureAction action = DecideFailure(facts);
  const std::string why = b->name + " " + e.Describe();
  if (JudgesEngine(facts)) proxy_->BackendFailed(b, why);
  auto& counters = proxy_->mutable_counters();

  switch (action) {
    case FailureAction::kAdoptHedge:
      spdlog::warn("front: request {}: {}; the hedge on {} carries on", id(), why, hedge_->attempt.backend()->name);
      ++counters.hedge_won;
      AdoptHedge();
      return;
    case FailureAction::kRetryFresh:
      // A kept-alive connection the engine had closed: not a failure of the engine.
      stale_retry_used_ = true;
      force_fresh_ = true;
      spdlog::debug("front: request {}: kept-alive connection to {} {}; retrying on a fresh one", id(), b->name,
                    e.Describe());
      proxy_->Dispatch(this);
      return;
    case FailureAction::kRedispatch:
      proxy_->Dispatch(this);  // it never reached an engine; bounded by the queue timeout
      return;
    case FailureAction::kRetry:
      ++retries_;
      ++counters.retried;
      cut_ = true;
      // The wait for an engine starts again: the first attempt may have run long.
      deadline_ms = proxy_->now_ms() + proxy_->options().queue_timeout_ms;
      spdlog::warn("front: request {}: {}; sending it again", id(), why);
      proxy_->Dispatch(this);
      return;
    case FailureAction::kFail502:
      Fail502(e, b->name);
      return;
    case FailureAction::kResume:
    case FailureAction::kResumeFree: {
      const bool counts = action == FailureAction::kResume;
      if (counts) {
        ++resumes_;
        ++counters.resumed;
      }
      sse_->BeginContinuation();
      resume_body_ = ResumeBody(plan_, sse_->delivered(), remaining);
      body_ = resume_body_;
      resuming_ = true;
      cut_ = counts;
      if (counts) deadline_ms = proxy_->now_ms() + proxy_->options().queue_timeout_ms;
      spdlog::warn("front: request {}: {}; resuming the stream after {} tokens ({} to go)", id(), why,
                   sse_->delivered().size(), remaining);
      proxy_->Dispatch(this);
      return;
    }
    case FailureAction::kEndStream:
      // Every token was delivered; only the end of the stream was lost.
      writer_->Write(sse_->SynthesizeEnd("length"));
      writer_->End();
      ++counters.ok;
      Finish();
      return;
    case FailureAction::kCloseStream:
      writer_->End();  // [DONE] went through; only the final chunk was lost
      ++counters.ok;
      Finish();
      return;
    case FailureAction::kAbortClient:
      // Part of the answer reached the client and the rest cannot be had: cut
      // the connection, so the client cannot take a truncated answer for a whole one.
      spdlog::warn(
          "front: request {}: {} after part of the answer reached the client; closing the client's connection", id(),
          why);
      ++counters.failed;
      writer_->Abort();
      Finish();
      return;
  }
}

void ProxyCall::Fail502(const UpstreamError& e, const std::string& backend) {
  ++proxy_->mutable_counters().failed;
  std::string msg = "the engine at " + backend + " " + e.Describe() +
                    (retries_ > 0 ? " (the request had already been sent again once)" : "") +
                    "; the supervisor restarts failed engines: retry the request";
  spdlog::warn("front: request {}: answering 502: {}", id(), msg);
  auto resp = http::HttpResponse::Json(502, http::ErrorJson(msg, "upstream_error"));
  writer_->Send(std::move(resp));
  Finish();
}

void ProxyCall::Reject503(const std::string& cause) {
  Guard g(this);
  ++proxy_->mutable_counters().rejected_503;
  if (writer_->started()) {
    // A stream waiting for its continuation: it cannot be answered any more.
    spdlog::warn("front: request {}: no engine to resume the stream on ({}); closing the client's connection", id(),
                 cause);
    writer_->Abort();
    Finish();
    return;
  }
  std::string msg = "no engine is ready to take the request: " + cause + "; retry after the Retry-After delay";
  spdlog::info("front: request {}: answering 503: {}", id(), msg);
  auto resp = http::HttpResponse::Json(503, http::ErrorJson(msg, "unavailable"));
  resp.headers.push_back({"Retry-After", "1"});
  writer_->Send(std::move(resp));
  Finish();
}

void ProxyCall::Reject400(const std::string& message) {
  Guard g(this);
  ++proxy_->mutable_counters().rejected_400;
  spdlog::info("front: request {}: answering 400: {}", id(), message);
  writer_->Send(http::HttpResponse::Json(400, http::ErrorJson(message, "invalid_request_error")));
  Finish();
}

void ProxyCall::Cancel() {
  Guard g(this);
  writer_->Abort();
  Finish();
}

void ProxyCall::OnClientGone() {
  Guard g(this);
  if (finished_) return;
  ++proxy_->mutable_counters().client_closed;
  spdlog::debug("front: request {}: the client went away", id());
  Finish();
}

void ProxyCall::CheckFlow() {
  if (!attempt_.conn() || flow_paused_ || writer_->queued_bytes() < proxy_->options().client_buffer_high) return;
  flow_paused_ = true;
  attempt_.conn()->PauseReading();
  proxy_->WatchFlow(this);
}

bool ProxyCall::ResumeIfDrained(size_t low) {
  if (!flow_paused_) return true;
  if (writer_->queued_bytes() > low) return false;
  flow_paused_ = false;
  if (attempt_.conn()) attempt_.conn()->ResumeReading();
  return true;
}

void ProxyCall::Finish() {
  if (finished_) return;
  finished_ = true;
  if (HedgePending()) EndHedge(nullptr);
  attempt_.Cancel();
  if (queued) proxy_->Dequeue(this);
  writer_->OnClose(nullptr);
  proxy_->Forget(this);
  if (depth_ == 0) delete this;
}

// ---- hedging ----

void ProxyCall::Heard() {
  last_byte_ms_ = proxy_->now_ms();
  if (attempt_) proxy_->BackendSpoke(attempt_.backend());
  // The engine the call was sent to spoke first: the hedge is not needed.
  if (HedgePending()) EndHedge("the active engine answered first");
}

bool ProxyCall::HedgePending() const { return hedge_ && hedge_->pending(); }

HedgeCandidate ProxyCall::HedgeView() const {
  HedgeCandidate c;
  c.backend = attempt_.backend();
  c.reading = !finished_ && attempt_.conn() && !flow_paused_;
  c.last_byte_ms = last_byte_ms_;
  c.hedge_pending = HedgePending();
  c.can_hedge = c.backend && !c.hedge_pending && CanHedge();
  c.refused = hedge_refused;
  return c;
}

bool ProxyCall::CanHedge() const {
  StreamState stream = StreamState::kNotStream;
  if (mode_ == Mode::kSse && sse_) {
    stream = StreamStateOf(sse_->done(), sse_->finished(), sse_->trackable(), sse_->error_seen(),
                           plan_.max_tokens - static_cast<int64_t>(sse_->delivered().size()));
  }
  return front::CanHedge(HedgePending(), hedges_.size(), kMaxHedges, writer_->started(), stream);
}

void ProxyCall::Hedge(Backend* b) {
  Guard g(this);
  hedges_.push_back(std::make_unique<HedgeLeg>(this, b, writer_->started()));
  hedge_ = hedges_.back().get();
  HedgeLeg& h = *hedge_;
  if (h.resume) {
    int64_t remaining = plan_.max_tokens - static_cast<int64_t>(sse_->delivered().size());
    h.resume_body = ResumeBody(plan_, sse_->delivered(), remaining);
    h.body = h.resume_body;
  } else {
    h.body = body_;
  }
  BuildHead(b, h.body, false, &h.head);  // the engine it hedges is alive: nothing to adopt
  ++proxy_->mutable_counters().hedged;
  spdlog::info("front: request {}: no byte from {} for {} ms; hedging on {}{}", id(), attempt_.backend()->name,
               proxy_->now_ms() - last_byte_ms_, b->name,
               h.resume ? " (resuming after " + std::to_string(sse_->delivered().size()) + " tokens)" : "");
  h.attempt.Lend(proxy_->pool().Acquire(b, /*fresh=*/false));
  h.attempt.conn()->Send(&h, h.head, h.body, writer_->request().method == "HEAD");
}

void ProxyCall::OnHedgeProgress() {
  Guard g(this);
  if (!HedgePending()) return;
  HedgeLeg& h = *hedge_;
  switch (JudgeHedge(h.Facts(sse_ != nullptr))) {
    case HedgeVerdict::kWait:
      return;
    case HedgeVerdict::kFailed:
      ++proxy_->mutable_counters().hedge_failed;
      spdlog::info("front: request {}: the hedge on {} got status {}; waiting for {}", id(),
                   h.attempt.backend()->name, h.status,
                   attempt_ ? attempt_.backend()->name : "the active engine");
      EndHedge(nullptr);
      return;
    case HedgeVerdict::kWins:
      ++proxy_->mutable_counters().hedge_won;
      AdoptHedge();
      return;
  }
}

void ProxyCall::OnHedgeError(const UpstreamError& e) {
  Guard g(this);
  if (!HedgePending()) return;
  HedgeLeg& h = *hedge_;
  if (e.reused && e.stage == UpstreamError::Stage::kAwaitingResponse && !h.stale_retry_used) {
    // A kept-alive connection the standby had closed: once more on a fresh one.
    h.stale_retry_used = true;
    h.attempt.Lend(proxy_->pool().Acquire(h.attempt.backend(), /*fresh=*/true));
    h.attempt.conn()->Send(&h, h.head, h.body, writer_->request().method == "HEAD");
    return;
  }
  h.state = HedgeLeg::State::kEnded;
  Backend* standby = h.attempt.Complete();
  ++proxy_->mutable_counters().hedge_failed;
  std::string why = standby->name + " " + e.Describe();
  spdlog::info("front: request {}: the hedge failed: {}; waiting for {}", id(), why,
               attempt_ ? attempt_.backend()->name : "the active engine");
  proxy_->BackendFailed(standby, why);
}

// The standby's attempt becomes the call's: the active engine's connection,
// if it is still open, is closed (so that engine cancels the request when it
// wakes), and what the standby sent so far is handled as if it had come now.
void ProxyCall::AdoptHedge() {
  Guard g(this);
  HedgeLeg& h = *hedge_;
  h.state = HedgeLeg::State::kAdopted;
  if (attempt_) {
    spdlog::info("front: request {}: {} answered first; closing the request on {}", id(),
                 h.attempt.backend()->name, attempt_.backend()->name);
  }
  attempt_.Cancel();  // the loser: its engine cancels the request
  flow_paused_ = false;
  if (h.resume) {
    sse_->BeginContinuation();
    resuming_ = true;
    body_ = h.body;
  } else {
    ResetAttempt();
  }
  proxy_->HedgeWon(h.attempt.backend());
  attempt_ = std::move(h.attempt);  // its claim, taken when the hedge was sent, is the call's now
  if (attempt_.conn()) attempt_.conn()->Rebind(this);
  if (h.has_head) OnUpstreamHead(h.status, &h.headers);
  if (finished_) return;
  if (!h.got.empty()) {
    std::string got = std::move(h.got);
    OnUpstreamBody(got);
  }
  if (finished_) return;
  if (h.done) OnUpstreamDone();
}

void ProxyCall::EndHedge(const char* why) {
  HedgeLeg& h = *hedge_;
  const Backend* standby = h.attempt.backend();
  h.Cancel();  // the loser: its engine cancels the request
  if (why) {
    ++proxy_->mutable_counters().hedge_lost;
    spdlog::info("front: request {}: {}; closing the hedge on {}", id(), why, standby->name);
  }
}

// ---- Proxy ----

Proxy::Proxy(uv_loop_t* loop, ProxyOptions options, EventSink events, FrontShared* shared, Clock* clock,
             TimerSource* timers)
    : loop_(loop),
      options_(std::move(options)),
      events_(std::move(events)),
      clock_(clock),
      pool_(loop, options_.upstream) {
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
  if (!closing_ || !calls_.empty()) spdlog::error("front: proxy destroyed while open; call Close() first");
}

void Proxy::Handle(std::shared_ptr<http::ResponseWriter> writer) {
  ++counters_.requests;
  if (options_.hedge_after_ms > 0) {
    shared_->EarnHedge(options_.hedge_percent, options_.hedge_burst);
  }
  if (closing_) {
    writer->Send(http::HttpResponse::Json(503, http::ErrorJson("the front is shutting down; retry", "unavailable")));
    return;
  }
  // Only the OpenAI API and /health are an engine's to answer through the
  // front; its control routes are the supervisor's (front/routes.h).
  if (!IsForwardedPath(writer->request().path)) {
    ++counters_.not_forwarded;
    writer->Send(http::HttpResponse::Json(404, http::ErrorJson(kNotForwardedMessage, "not_found_error")));
    return;
  }
  auto* call = new ProxyCall(this, std::move(writer));
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

void Proxy::Dispatch(ProxyCall* call) {
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
  call->queued = true;
  call->queue_pos = queue_.insert(queue_.end(), call);
  ArmQueueTimer();
}

void Proxy::Dequeue(ProxyCall* call) {
  if (!call->queued) return;
  call->queued = false;
  queue_.erase(call->queue_pos);
}

void Proxy::Forget(ProxyCall* call) {
  calls_.erase(call);
  flow_paused_.erase(call);
  MaybeDone();
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
  if (closing_) return;
  if (queue_.empty()) {
    queue_timer_->Stop();
    return;
  }
  int64_t next = INT64_MAX;
  for (ProxyCall* c : queue_) next = std::min(next, c->deadline_ms);
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
    if (c->deadline_ms <= now) expired.push_back(c);
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

void Proxy::BackendAnswered(Backend* b) {
  b->failures = 0;
  b->last_ok_ms = clock_->WallMs();
  if (first_ok_pending_.empty() || first_ok_pending_ != b->name) return;
  first_ok_pending_.clear();
  Emit({{"type", "event"}, {"kind", "first_ok"}, {"backend", b->name}, {"epoch", epoch_}, {"at_ms", clock_->WallMs()}});
}

void Proxy::Emit(nlohmann::json event) {
  if (event_log_.size() >= kEventLogSize) event_log_.pop_front();
  event_log_.push_back(event);
  if (events_) events_(event);
}

Status HedgeLimits::Check() const {
  if (after_ms < 0 || after_ms > 3'600'000) {
    return InvalidArgument("hedge_after_ms " + std::to_string(after_ms) +
                           " is out of range; give 0 (no hedging) or the silence in ms, up to 3600000");
  }
  if (percent < 0 || percent > 100) {
    return InvalidArgument("hedge_percent " + std::to_string(percent) +
                           " is out of range; give 0..100, the hedges earned per 100 requests (10 by default)");
  }
  if (burst < 1 || burst > 1'000'000) {
    return InvalidArgument("hedge_burst " + std::to_string(burst) +
                           " is out of range; give 1..1000000, the hedges that can be saved up (16 by default)");
  }
  return Status::Ok();
}

void Proxy::SetHedging(const HedgeLimits& h) {
  bool was_on = options_.hedge_after_ms > 0;
  options_.hedge_after_ms = h.after_ms;
  options_.hedge_percent = h.percent;
  options_.hedge_burst = h.burst;
  // Every loop does the same (the bucket is shared): both are idempotent.
  if (!was_on && h.after_ms > 0) shared_->FillHedges(h.burst);
  shared_->CapHedges(h.burst);
  if (h.after_ms <= 0) ShareSilence(nullptr, 0, 0);
  if (!closing_) hedger_->SetAfter(h.after_ms);
}

bool Proxy::TakeToken() { return shared_->TakeHedge(); }

void Proxy::ShareSilence(SharedBackend* b, int waiting, int silent) {
  if (b != shared_for_) {
    if (shared_for_) {  // this loop's counts move off the engine it counted before
      shared_for_->waiting.fetch_sub(shared_waiting_, std::memory_order_relaxed);
      shared_for_->silent.fetch_sub(shared_silent_, std::memory_order_relaxed);
    }
    shared_for_ = b;
    shared_waiting_ = shared_silent_ = 0;
  }
  if (!b) return;
  b->waiting.fetch_add(waiting - shared_waiting_, std::memory_order_relaxed);
  b->silent.fetch_add(silent - shared_silent_, std::memory_order_relaxed);
  shared_waiting_ = waiting;
  shared_silent_ = silent;
}

void Proxy::HedgeWon(Backend* b) {
  // The first win since the active engine last spoke: where a failover to
  // this engine began serving clients, if the supervisor then routes it.
  const int64_t since = active_ ? active_->shared->last_byte_ms.load() : 0;
  int64_t won = b->shared->hedge_win_ms.load();
  // The first loop to win since then sets it.
  while (won <= since && !b->shared->hedge_win_ms.compare_exchange_weak(won, clock_->WallMs())) {
  }
}

void Proxy::BackendSpoke(Backend* b) { b->shared->Spoke(clock_->WallMs(), now_ms()); }

void Proxy::Candidates(std::vector<HedgeCandidate>* out) {
  scanned_.assign(calls_.begin(), calls_.end());
  out->reserve(scanned_.size());
  for (const ProxyCall* c : scanned_) out->push_back(c->HedgeView());
}

Backend* Proxy::HedgeTarget(int64_t now) const {
  // The standby takes hedges only while the supervisor routes it (it does
  // so once its probes pass) and the front has not seen it fail.
  return standby_ && standby_->down_until_ms <= now ? standby_ : nullptr;
}

void Proxy::Idle() { ShareSilence(nullptr, 0, 0); }

bool Proxy::JudgeSilence(const HedgeScan& counts, int64_t now) {
  const int64_t after = hedger_->after_ms();
  // This loop's share of the counts, summed over the loops in the record.
  ShareSilence(active_ && counts.on_active > 0 ? active_->shared : nullptr, counts.on_active,
               counts.silent_on_active);
  // The active engine sent nothing at all, on any request of any loop, for
  // the whole wait, while at least two requests waited that long for it:
  // more likely the engine than the requests. (Requests younger than the
  // wait do not count against it: under steady traffic they always exist.)
  // Said once until it speaks again: the loop that flips the flag says it.
  SharedBackend* sa = active_ ? active_->shared : nullptr;
  if (!sa) return false;
  const int silent_all = sa->silent.load(std::memory_order_relaxed);
  bool expected = false;
  if (counts.silent_on_active > 0 && silent_all >= 2 && now - sa->last_byte_loop_ms.load() >= after &&
      sa->silent_reported.compare_exchange_strong(expected, true)) {
    const int waiting_all = sa->waiting.load(std::memory_order_relaxed);
    ++counters_.silent_reports;
    if (uint64_t held = 0; silent_log_.Allow(now, &held)) {
      spdlog::warn("front: {} of {} requests on the active engine {} have had no byte for {} ms{}", silent_all,
                   waiting_all, active_->name, after,
                   held > 0 ? " (" + std::to_string(held) + " more such reports in the last second)" : "");
    }
    Emit({{"type", "event"},
          {"kind", "silent"},
          {"backend", active_->name},
          {"silent", silent_all},
          {"inflight", waiting_all},
          {"after_ms", after},
          {"last_byte_ms", sa->last_byte_ms.load()},
          {"epoch", epoch_},
          {"at_ms", clock_->WallMs()}});
  }
  // On an engine reported silent (now or before), a request is not given
  // the whole wait again: it is hedged at once.
  return sa->silent_reported.load(std::memory_order_relaxed);
}

void Proxy::Hedge(size_t index, Backend* target) { scanned_[index]->Hedge(target); }

void Proxy::BudgetSpent(const std::vector<size_t>& indexes, size_t fresh, int64_t now) {
  for (size_t i : indexes) scanned_[i]->hedge_refused = true;  // counted once per request
  if (fresh == 0) return;
  counters_.hedge_refused += fresh;
  refused_since_log_ += fresh;
  // Checked every tick (every few ms at a small hedge_after_ms): said at
  // most once a second, with what it held back.
  if (uint64_t held = 0; refused_log_.Allow(now, &held)) {
    spdlog::warn("front: {} silent requests not hedged{}: the hedge budget is spent (hedge_percent {}, "
                 "hedge_burst {})",
                 refused_since_log_, held > 0 ? " since the last such warning" : "", options_.hedge_percent,
                 options_.hedge_burst);
    refused_since_log_ = 0;
  }
}

void Proxy::WatchFlow(ProxyCall* call) {
  flow_paused_.insert(call);
  if (!closing_ && !flow_timer_->active()) flow_timer_->Start(10, [this] { OnFlowTimer(); }, 10);
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
                   {"resumed", counters_.resumed},           {"switched_self", counters_.switched_self},
                   {"rejected_503", counters_.rejected_503}, {"client_closed", counters_.client_closed},
                   {"rejected_400", counters_.rejected_400}, {"hedged", counters_.hedged},
                   {"hedge_won", counters_.hedge_won},       {"hedge_lost", counters_.hedge_lost},
                   {"hedge_failed", counters_.hedge_failed}, {"hedge_refused", counters_.hedge_refused},
                   {"silent_reports", counters_.silent_reports},
                   {"silent_to_standby", counters_.silent_to_standby},
                   {"not_forwarded", counters_.not_forwarded}};
  j["hedging"] = {{"after_ms", options_.hedge_after_ms},
                  {"percent", options_.hedge_percent},
                  {"burst", options_.hedge_burst},
                  {"budget", shared_->hedge_budget()}};
  return j;
}

void Proxy::Close(std::function<void()> done) {
  if (done) done_ = std::move(done);
  if (closing_) {
    MaybeDone();
    return;
  }
  closing_ = true;
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
    MaybeDone();
  });
}

void Proxy::MaybeDone() {
  if (!closing_ || !pool_closed_ || !calls_.empty() || !done_) return;
  auto done = std::move(done_);
  done_ = nullptr;
  done();
}

}  // namespace wsup::front
