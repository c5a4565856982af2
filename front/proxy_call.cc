// ProxyCall (front/proxy_call.h): its start, its attempts, what it does when
// one fails, and its end.
#include "front/proxy_call.h"

#include <spdlog/spdlog.h>

#include <utility>

#include "front/call_policy.h"
#include "front/request_head.h"
#include "http/response.h"

namespace wsup::front {

void ProxyCall::Move(CallEvent e) {
  std::optional<CallState> next = NextCallState(state_, e);
  if (!next) {
    spdlog::error("front: request {}: no move for {} in state {}; this is a bug in the front", id(),
                  CallEventName(e), CallStateName(state_));
    return;
  }
  state_ = *next;
}

void ProxyCall::Start() {
  Guard g(this);
  start_ms_ = now_ms();
  start_us_ = now_us();
  deadline_ms_ = start_ms_ + options().queue_timeout_ms;
  writer_->OnClose([this] { OnClientGone(); });
  const http::HttpRequest& r = writer_->request();
  body_ = r.body;
  const bool chat = r.path == "/v1/chat/completions";
  if (r.method == "POST" && (r.path == "/v1/completions" || chat)) {
    // The one reading of the body (front/completion.h): past the shared
    // JSON limits it is refused here, before anything parses it and before
    // an engine spends a parse on it (the engine would refuse it with the
    // same words); a body that may ask for a stream is parsed once, into the
    // plan every resume and hedge body is made from. Everything else is
    // forwarded byte for byte.
    if (Status read = ReadCompletion(r.body, options().default_max_tokens, &plan_, chat); !read.ok()) {
      Reject400(read.error().message());
      return;
    }
    if (plan_.stream) {
      body_ = plan_.upstream_body;
      if (plan_.resumable) {
        sse_ = std::make_unique<CompletionStream>(!plan_.client_wants_token_ids, plan_.chat);
      } else {
        spdlog::debug("front: request {}: stream not resumable: {}", id(), plan_.not_resumable);
      }
    }
  }
  s_->router->Route(this);
}

void ProxyCall::Send(Backend* b) {
  Guard g(this);
  if (done()) return;
  Move(CallEvent::kSend);
  attempt_ = Attempt(b);
  ResetAttempt();
  BuildRequestHead(writer_->request(), b->name, body_, cut_, &head_, target_);
  last_byte_ms_ = now_ms();
  attempt_.Lend(s_->pool->Acquire(b, force_fresh_));
  force_fresh_ = false;
  attempt_.conn()->Send(this, head_, body_, writer_->request().method == "HEAD");
}

void ProxyCall::Queued(QueueSlot slot) {
  Move(CallEvent::kQueue);
  queue_slot_ = slot;
}

void ProxyCall::ResetAttempt() {
  answer_pending_ = false;
  if (resuming()) return;  // the client's head is out; only the engine side restarts
  mode_ = Mode::kNone;
  status_ = 0;
  resp_headers_.clear();
  resp_body_.clear();
}

StreamState ProxyCall::Stream() const {
  if (mode_ != Mode::kSse || !sse_) return StreamState::kNotStream;
  return StreamStateOf(sse_->done(), sse_->finished(), sse_->trackable(), sse_->error_seen(), TokensOwed(),
                       // Before the first token, the client's own prompt is an exact continuation.
                       plan_.prompt_ids_given || sse_->prompt_reported() || sse_->delivered().empty());
}

int64_t ProxyCall::TokensOwed() const {
  return sse_ ? plan_.max_tokens - static_cast<int64_t>(sse_->delivered().size()) : 0;
}

// What the call does next is one row of the failure table
// (front/call_policy.h); this carries it out.
void ProxyCall::OnUpstreamError(const UpstreamError& e) {
  Guard g(this);
  Backend* b = attempt_.Complete();  // the connection is closed
  flow_paused_ = false;
  FailureFacts facts;
  facts.stage = e.stage;
  facts.stale = e.reused && e.stage == UpstreamError::Stage::kAwaitingResponse && !stale_retry_used_;
  facts.hedge_pending = HedgePending();
  facts.delivered = writer_->started();
  facts.stream = Stream();
  const int64_t remaining = facts.stream == StreamState::kNotStream ? 0 : TokensOwed();
  facts.budget_left = (facts.delivered ? resumes_ : retries_) < options().max_retries;
  const FailureAction action = DecideFailure(facts);
  const std::string why = b->name + " " + e.Describe();
  if (JudgesEngine(facts)) s_->engines->Failed(b, why);

  switch (action) {
    case FailureAction::kAdoptHedge:
      spdlog::warn("front: request {}: {}; the hedge on {} carries on", id(), why, hedge_->attempt.backend()->name);
      ++counters().hedge_won;
      AdoptHedge();
      return;
    case FailureAction::kRetryFresh:
      // A kept-alive connection the engine had closed: not a failure of the engine.
      stale_retry_used_ = true;
      force_fresh_ = true;
      spdlog::debug("front: request {}: kept-alive connection to {} {}; retrying on a fresh one", id(), b->name,
                    e.Describe());
      Reroute(false);
      return;
    case FailureAction::kRedispatch:
      Reroute(false);  // it never reached an engine; bounded by the queue timeout
      return;
    case FailureAction::kRetry:
      ++retries_;
      ++counters().retried;
      cut_ = true;
      spdlog::warn("front: request {}: {}; sending it again", id(), why);
      Reroute(true);
      return;
    case FailureAction::kFail502:
      Fail502(e, b->name);
      return;
    case FailureAction::kResume:
    case FailureAction::kResumeFree:
      ResumeStream(action == FailureAction::kResume, remaining, why);
      return;
    case FailureAction::kEndStream:
      // Every token was delivered; only the end of the stream was lost.
      writer_->Write(sse_->SynthesizeEnd("length"));
      writer_->End();
      ++counters().ok;
      Finish();
      return;
    case FailureAction::kEndNoResume: {
      // The engine never said which tokens the prompt was: a continuation
      // would be a guess, and could give the client a wrong answer.
      const std::string msg = "the engine " + b->name + " failed mid-stream (" + e.Describe() +
                              ") and never reported the prompt's token ids (prompt_token_ids), so the stream cannot "
                              "be resumed; retry the request, or serve it with an engine that answers "
                              "return_token_ids (docs/front.md)";
      spdlog::warn("front: request {}: {}", id(), msg);
      ++counters().failed;
      ++counters().resume_refused;
      writer_->Write("data: " + http::ErrorJson(msg, "upstream_error") + "\n\ndata: [DONE]\n\n");
      writer_->End();
      Finish();
      return;
    }
    case FailureAction::kCloseStream:
      writer_->End();  // [DONE] went through; only the final chunk was lost
      ++counters().ok;
      Finish();
      return;
    case FailureAction::kAbortClient:
      // Part of the answer reached the client and the rest cannot be had: cut
      // the connection, so the client cannot take a truncated answer for a whole one.
      spdlog::warn(
          "front: request {}: {} after part of the answer reached the client; closing the client's connection", id(),
          why);
      ++counters().failed;
      writer_->Abort();
      Finish();
      return;
  }
}

void ProxyCall::Reroute(bool counted) {
  // The wait for an engine starts again: the first attempt may have run long.
  if (counted) deadline_ms_ = now_ms() + options().queue_timeout_ms;
  Move(resuming() ? CallEvent::kResume : CallEvent::kRetry);
  s_->router->Route(this);
}

void ProxyCall::ResumeStream(bool counted, int64_t remaining, const std::string& why) {
  if (counted) {
    ++resumes_;
    ++counters().resumed;
    if (plan_.chat) ++counters().resumed_chat;
  }
  sse_->BeginContinuation();
  Continuation(remaining, &resume_body_, &target_);
  body_ = resume_body_;
  // A continuation always follows a cut, also when an earlier try of it
  // never connected (not counted): the engine it reaches may adopt the
  // dead engine's KV only if it is told.
  cut_ = true;
  if (counted) deadline_ms_ = now_ms() + options().queue_timeout_ms;
  spdlog::warn("front: request {}: {}; resuming the stream after {} tokens ({} to go)", id(), why,
               sse_->delivered().size(), remaining);
  Move(CallEvent::kResume);
  s_->router->Route(this);
}

void ProxyCall::Continuation(int64_t remaining, std::string* body, std::string* target) const {
  if (PromptIds().empty() && sse_->delivered().empty()) {
    *body = plan_.upstream_body;
    target->clear();
    return;
  }
  *body = ResumeBody(plan_, PromptIds(), sse_->delivered(), remaining);
  *target = plan_.chat ? kResumeTarget : "";
}

void ProxyCall::Fail502(const UpstreamError& e, const std::string& backend) {
  ++counters().failed;
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
  ++counters().rejected_503;
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
  ++counters().rejected_400;
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
  if (done()) return;
  ++counters().client_closed;
  spdlog::debug("front: request {}: the client went away", id());
  Finish();
}

void ProxyCall::Finish() {
  if (done()) return;
  Move(CallEvent::kFinish);
  // What the client saw: the answer's status (0: none was started) and,
  // for the completion APIs, the whole request's time.
  ServingStats& serving = counters().serving;
  serving.Answer(writer_->request().path, writer_->status());
  serving.Duration(writer_->request().path, now_us() - start_us_);
  if (HedgePending()) EndHedge(nullptr);
  attempt_.Cancel();
  writer_->OnClose(nullptr);
  s_->router->Forget(this);  // out of the queue too
  if (depth_ == 0) delete this;
}

}  // namespace wsup::front
