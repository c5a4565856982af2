// ProxyCall (front/proxy_call.h): the engine's answer on its way to the
// client. An answer announcing a Content-Length up to buffer_limit_bytes is
// buffered and sent in one piece (so a cut before its end can be retried
// invisibly); others are streamed as they come; a resumable event stream
// goes through the relay that tracks its tokens (front/sse_relay.h). A client
// that reads slower than the engine writes pauses reading from the engine.
#include "front/proxy_call.h"

#include <spdlog/spdlog.h>

#include <cstdint>

#include "front/request_head.h"

namespace wsup::front {

void ProxyCall::OnUpstreamHead(int status, std::vector<http::Header>* headers) {
  Guard g(this);
  Heard();
  const bool event_stream = IsEventStream(*headers);
  if (state_ == CallState::kResumeSent) {
    if (status / 100 == 2 && event_stream) {
      Move(CallEvent::kHead);
      answer_pending_ = true;
      return;  // the continuation's events follow the ones already sent
    }
    const std::string* content_type = FindHeader(*headers, "Content-Type");
    spdlog::warn("front: request {}: resuming the stream on {} got status {} ({}); closing the client's connection",
                 id(), attempt_.backend()->name, status, content_type ? *content_type : "no content type");
    ++counters().failed;
    writer_->Abort();
    Finish();
    return;
  }
  Move(CallEvent::kHead);
  status_ = status;
  // A 2xx head of a whole answer is a good answer; a stream's (or a big
  // body's) head only says the engine took the request: that one is good at
  // its first body byte (OnUpstreamBody), as clients see it.
  answer_pending_ = status / 100 == 2;
  size_t announced = SIZE_MAX;
  resp_headers_ = RelayedHeaders(headers, &announced);
  const bool bodiless = writer_->request().method == "HEAD" || status == 204 || status == 304;
  if (sse_ && status / 100 == 2 && event_stream) {
    mode_ = Mode::kSse;
    writer_->StartStream(status, std::move(resp_headers_));
  } else if (bodiless || announced <= options().buffer_limit_bytes) {
    mode_ = Mode::kBuffer;
    if (answer_pending_) {
      answer_pending_ = false;
      s_->engines->Answered(attempt_.backend());
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
    s_->engines->Answered(attempt_.backend());
  }
  switch (mode_) {
    case Mode::kBuffer:
      resp_body_.append(data);
      break;
    case Mode::kStream:
      writer_->Write(data);
      CheckFlow();
      break;
    case Mode::kSse: {
      out_.clear();
      const size_t before = sse_->delivered().size();
      sse_->Feed(data, &out_);
      if (!out_.empty()) writer_->Write(out_);
      CountTokens(sse_->delivered().size() - before);
      CheckFlow();
      break;
    }
    case Mode::kNone:
      break;
  }
}

void ProxyCall::CountTokens(size_t tokens) {
  if (tokens == 0) return;
  // Tokens reached the client with this write: the first of a stream is
  // its time to first token, the rest share the gap since the tokens before.
  const int64_t now = now_us();
  const std::string& path = writer_->request().path;
  ServingStats& serving = counters().serving;
  if (last_token_us_ == 0) {
    serving.FirstToken(path, now - start_us_);
    if (tokens > 1) serving.Tokens(path, 0, tokens - 1);
  } else {
    serving.Tokens(path, now - last_token_us_, tokens);
  }
  last_token_us_ = now;
}

void ProxyCall::OnUpstreamDone() {
  Guard g(this);
  // A 2xx answer that ended with no body byte (an empty stream) is good too.
  if (answer_pending_) {
    answer_pending_ = false;
    s_->engines->Answered(attempt_.backend());
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
  ++counters().ok;
  spdlog::debug("front: request {} {} {} -> {} in {} ms", id(), writer_->request().method, writer_->request().target,
                status_, now_ms() - start_ms_);
  Finish();
}

void ProxyCall::Heard() {
  last_byte_ms_ = now_ms();
  if (attempt_) s_->engines->Spoke(attempt_.backend());
  // The engine the call was sent to spoke first: the hedge is not needed.
  if (HedgePending()) EndHedge("the active engine answered first");
}

void ProxyCall::CheckFlow() {
  if (!attempt_.conn() || flow_paused_ || writer_->queued_bytes() < options().client_buffer_high) return;
  flow_paused_ = true;
  attempt_.conn()->PauseReading();
  s_->router->WatchFlow(this);
}

bool ProxyCall::ResumeIfDrained(size_t low) {
  if (!flow_paused_) return true;
  if (writer_->queued_bytes() > low) return false;
  flow_paused_ = false;
  if (attempt_.conn()) attempt_.conn()->ResumeReading();
  return true;
}

}  // namespace wsup::front
