#include "front/proxy.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <strings.h>

#include "front/completion.h"
#include "front/sse_relay.h"

namespace wsup::front {

namespace {

using http::Header;
using http::HeaderNameEquals;

// Headers that describe one hop of the exchange (RFC 9110 7.6.1), and the
// framing headers each side writes for itself.
bool IsHopByHop(std::string_view name) {
  static constexpr std::string_view kNames[] = {
      "Connection",          "Keep-Alive", "Proxy-Connection", "Proxy-Authenticate", "Proxy-Authorization",
      "TE",                  "Trailer",    "Transfer-Encoding", "Upgrade",           "Content-Length",
  };
  for (std::string_view n : kNames) {
    if (HeaderNameEquals(name, n)) return true;
  }
  return false;
}

// True when `name` is one of the comma-separated tokens of a Connection
// header value (those headers are hop-by-hop too).
bool ListedIn(std::string_view connection_value, std::string_view name) {
  size_t pos = 0;
  while (pos <= connection_value.size()) {
    size_t comma = connection_value.find(',', pos);
    if (comma == std::string_view::npos) comma = connection_value.size();
    std::string_view tok = connection_value.substr(pos, comma - pos);
    while (!tok.empty() && (tok.front() == ' ' || tok.front() == '\t')) tok.remove_prefix(1);
    while (!tok.empty() && (tok.back() == ' ' || tok.back() == '\t')) tok.remove_suffix(1);
    if (!tok.empty() && HeaderNameEquals(tok, name)) return true;
    pos = comma + 1;
  }
  return false;
}

const std::string* FindHeader(const std::vector<Header>& headers, std::string_view name) {
  for (const auto& h : headers) {
    if (HeaderNameEquals(h.name, name)) return &h.value;
  }
  return nullptr;
}

bool StartsWithNoCase(std::string_view s, std::string_view prefix) {
  return s.size() >= prefix.size() && ::strncasecmp(s.data(), prefix.data(), prefix.size()) == 0;
}

}  // namespace

// One client request on its way through the front. Lives from Handle()
// until its answer is complete, the client is gone, or the proxy closes.
// Entry points from callbacks hold a Guard, so that a call that finishes
// inside one of them (the client vanished during a write) is deleted only
// when the outermost entry returns.
class ProxyCall final : public UpstreamListener {
 public:
  ProxyCall(Proxy* proxy, std::shared_ptr<http::ResponseWriter> writer)
      : proxy_(proxy), writer_(std::move(writer)) {}

  void Start();
  // Sends the request to `b` (from Proxy::Dispatch or the queue).
  void Attempt(Backend* b);
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

  int64_t deadline_ms = 0;
  std::list<ProxyCall*>::iterator queue_pos;
  bool queued = false;

 private:
  enum class Mode { kNone, kBuffer, kStream, kSse };

  struct Guard {
    explicit Guard(ProxyCall* c) : c_(c) { ++c_->depth_; }
    ~Guard() {
      if (--c_->depth_ == 0 && c_->finished_) delete c_;
    }
    ProxyCall* c_;
  };

  void OnClientGone();
  void BuildHead(const Backend* b);
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

  UpstreamConn* conn_ = nullptr;
  Backend* backend_ = nullptr;
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

void ProxyCall::BuildHead(const Backend* b) {
  const http::HttpRequest& r = writer_->request();
  const std::string* connection = r.FindHeader("Connection");
  head_.clear();
  head_.reserve(128 + r.target.size() + r.headers.size() * 48);
  head_ += r.method;
  head_ += ' ';
  head_ += r.target;
  head_ += " HTTP/1.1\r\n";
  bool have_host = false;
  for (const auto& h : r.headers) {
    if (IsHopByHop(h.name) || HeaderNameEquals(h.name, "Expect") || HeaderNameEquals(h.name, "X-Request-Id")) continue;
    if (connection && ListedIn(*connection, h.name)) continue;
    if (HeaderNameEquals(h.name, "Host")) have_host = true;
    head_ += h.name;
    head_ += ": ";
    head_ += h.value;
    head_ += "\r\n";
  }
  if (!have_host) {
    head_ += "Host: ";
    head_ += b->name;
    head_ += "\r\n";
  }
  head_ += "X-Request-Id: ";
  head_ += r.request_id;
  head_ += "\r\n";
  if (!body_.empty() || r.method == "POST" || r.method == "PUT" || r.method == "PATCH") {
    char len[32];
    auto [end, ec] = std::to_chars(len, len + sizeof(len), body_.size());
    (void)ec;
    head_ += "Content-Length: ";
    head_.append(len, end);
    head_ += "\r\n";
  }
  head_ += "\r\n";
}

void ProxyCall::Attempt(Backend* b) {
  Guard g(this);
  if (finished_) return;
  backend_ = b;
  ++b->inflight;
  ResetAttempt();
  BuildHead(b);
  conn_ = proxy_->pool().Acquire(b, force_fresh_);
  force_fresh_ = false;
  conn_->Send(this, head_, body_, writer_->request().method == "HEAD");
}

void ProxyCall::ResetAttempt() {
  if (resuming_) return;  // the client's head is out; only the engine side restarts
  mode_ = Mode::kNone;
  status_ = 0;
  resp_headers_.clear();
  resp_body_.clear();
}

void ProxyCall::OnUpstreamHead(int status, std::vector<Header>* headers) {
  Guard g(this);
  const std::string* content_type = FindHeader(*headers, "Content-Type");
  bool event_stream = content_type && StartsWithNoCase(*content_type, "text/event-stream");
  if (resuming_) {
    if (status / 100 == 2 && event_stream) {
      proxy_->BackendAnswered(backend_);
      return;  // the continuation's events follow the ones already sent
    }
    spdlog::warn("front: request {}: resuming the stream on {} got status {} ({}); closing the client's connection",
                 id(), backend_->name, status, content_type ? *content_type : "no content type");
    ++proxy_->mutable_counters().failed;
    writer_->Abort();
    Finish();
    return;
  }
  status_ = status;
  if (status / 100 == 2) proxy_->BackendAnswered(backend_);
  // Copied: the headers are moved out below. (Usually "keep-alive": no allocation.)
  std::string connection;
  if (const std::string* c = FindHeader(*headers, "Connection")) connection = *c;
  bool chunked = FindHeader(*headers, "Transfer-Encoding") != nullptr;
  size_t announced = SIZE_MAX;
  if (const std::string* length = FindHeader(*headers, "Content-Length"); length && !chunked) {
    size_t n = 0;
    auto [end, ec] = std::from_chars(length->data(), length->data() + length->size(), n);
    if (ec == std::errc() && end == length->data() + length->size()) announced = n;
  }
  resp_headers_.reserve(headers->size());
  for (auto& h : *headers) {
    if (IsHopByHop(h.name) || HeaderNameEquals(h.name, "X-Request-Id") || HeaderNameEquals(h.name, "Server")) continue;
    if (!connection.empty() && ListedIn(connection, h.name)) continue;
    resp_headers_.push_back(std::move(h));
  }
  bool bodiless = writer_->request().method == "HEAD" || status == 204 || status == 304;
  if (sse_ && status / 100 == 2 && event_stream) {
    mode_ = Mode::kSse;
    writer_->StartStream(status, std::move(resp_headers_));
  } else if (bodiless || announced <= proxy_->options().buffer_limit_bytes) {
    mode_ = Mode::kBuffer;
    if (announced != SIZE_MAX && !bodiless) resp_body_.reserve(announced);
  } else {
    mode_ = Mode::kStream;
    writer_->StartStream(status, std::move(resp_headers_));
  }
}

void ProxyCall::OnUpstreamBody(std::string_view data) {
  Guard g(this);
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
  conn_ = nullptr;
  --backend_->inflight;
  backend_ = nullptr;
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

void ProxyCall::OnUpstreamError(const UpstreamError& e) {
  Guard g(this);
  Backend* b = backend_;
  conn_ = nullptr;
  backend_ = nullptr;
  --b->inflight;
  if (flow_paused_) flow_paused_ = false;
  // A kept-alive connection the engine had closed: not a failure of the
  // engine. Try once more on a fresh connection before judging it.
  if (e.reused && e.stage == UpstreamError::Stage::kAwaitingResponse && !stale_retry_used_) {
    stale_retry_used_ = true;
    force_fresh_ = true;
    spdlog::debug("front: request {}: kept-alive connection to {} {}; retrying on a fresh one", id(), b->name,
                  e.Describe());
    proxy_->Dispatch(this);
    return;
  }
  std::string why = b->name + " " + e.Describe();
  proxy_->BackendFailed(b, why);
  auto& counters = proxy_->mutable_counters();

  if (!writer_->started()) {
    // Nothing reached the client: the request can be sent again.
    if (e.stage == UpstreamError::Stage::kConnect) {
      proxy_->Dispatch(this);  // it never reached an engine; bounded by the queue timeout
      return;
    }
    if (retries_ < proxy_->options().max_retries) {
      ++retries_;
      ++counters.retried;
      // The wait for an engine starts again: the first attempt may have run long.
      deadline_ms = proxy_->now_ms() + proxy_->options().queue_timeout_ms;
      spdlog::warn("front: request {}: {}; sending it again", id(), why);
      proxy_->Dispatch(this);
      return;
    }
    Fail502(e, b->name);
    return;
  }

  if (mode_ == Mode::kSse && !sse_->done()) {
    int64_t remaining = plan_.max_tokens - static_cast<int64_t>(sse_->delivered().size());
    if (sse_->finished() || (remaining <= 0 && sse_->trackable())) {
      // Every token was delivered; only the end of the stream was lost.
      writer_->Write(sse_->SynthesizeEnd("length"));
      writer_->End();
      ++counters.ok;
      Finish();
      return;
    }
    if (sse_->trackable() && !sse_->error_seen()) {
      bool counts = e.stage != UpstreamError::Stage::kConnect;
      if (!counts || resumes_ < proxy_->options().max_retries) {
        if (counts) {
          ++resumes_;
          ++counters.resumed;
        }
        sse_->BeginContinuation();
        resume_body_ = ResumeBody(plan_, sse_->delivered(), remaining);
        body_ = resume_body_;
        resuming_ = true;
        if (counts) deadline_ms = proxy_->now_ms() + proxy_->options().queue_timeout_ms;
        spdlog::warn("front: request {}: {}; resuming the stream after {} tokens ({} to go)", id(), why,
                     sse_->delivered().size(), remaining);
        proxy_->Dispatch(this);
        return;
      }
    }
  } else if (mode_ == Mode::kSse) {
    writer_->End();  // [DONE] went through; only the final chunk was lost
    ++counters.ok;
    Finish();
    return;
  }
  // Part of the answer reached the client and the rest cannot be had: cut
  // the connection, so the client cannot take a truncated answer for a whole one.
  spdlog::warn("front: request {}: {} after part of the answer reached the client; closing the client's connection",
               id(), why);
  ++counters.failed;
  writer_->Abort();
  Finish();
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
  if (!conn_ || flow_paused_ || writer_->queued_bytes() < proxy_->options().client_buffer_high) return;
  flow_paused_ = true;
  conn_->PauseReading();
  proxy_->WatchFlow(this);
}

bool ProxyCall::ResumeIfDrained(size_t low) {
  if (!flow_paused_) return true;
  if (writer_->queued_bytes() > low) return false;
  flow_paused_ = false;
  if (conn_) conn_->ResumeReading();
  return true;
}

void ProxyCall::Finish() {
  if (finished_) return;
  finished_ = true;
  if (conn_) {
    conn_->Abort();
    conn_ = nullptr;
  }
  if (backend_) {
    --backend_->inflight;
    backend_ = nullptr;
  }
  if (queued) proxy_->Dequeue(this);
  writer_->OnClose(nullptr);
  proxy_->Forget(this);
  if (depth_ == 0) delete this;
}

// ---- Proxy ----

Proxy::Proxy(uv_loop_t* loop, ProxyOptions options, EventSink events, Clock* clock)
    : loop_(loop),
      options_(std::move(options)),
      events_(std::move(events)),
      clock_(clock),
      pool_(loop, options_.upstream) {
  uv_timer_init(loop_, &queue_timer_);
  uv_timer_init(loop_, &flow_timer_);
  queue_timer_.data = this;
  flow_timer_.data = this;
  open_timers_ = 2;
}

Proxy::~Proxy() {
  if (open_timers_ != 0 || !calls_.empty()) spdlog::error("front: proxy destroyed while open; call Close() first");
}

void Proxy::Handle(std::shared_ptr<http::ResponseWriter> writer) {
  ++counters_.requests;
  if (closing_) {
    writer->Send(http::HttpResponse::Json(503, http::ErrorJson("the front is shutting down; retry", "unavailable")));
    return;
  }
  auto* call = new ProxyCall(this, std::move(writer));
  calls_.insert(call);
  call->Start();
}

Backend* Proxy::Pick() const {
  if (active_ && active_->down_until_ms <= now_ms()) return active_;
  return nullptr;
}

void Proxy::Dispatch(ProxyCall* call) {
  if (Backend* b = Pick(); b && queue_.empty()) {
    call->Attempt(b);
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
    call->Attempt(b);
  }
  ArmQueueTimer();
}

void Proxy::ArmQueueTimer() {
  if (closing_) return;
  if (queue_.empty()) {
    uv_timer_stop(&queue_timer_);
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
  uv_timer_start(
      &queue_timer_, [](uv_timer_t* t) { static_cast<Proxy*>(t->data)->OnQueueTimer(); },
      static_cast<uint64_t>(delay), 0);
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
  Backend* new_active = active ? pool_.Get(*active) : nullptr;
  Backend* new_standby = standby ? pool_.Get(*standby) : nullptr;
  // The supervisor vouches for what it routes: forget earlier failures.
  for (Backend* b : {new_active, new_standby}) {
    if (b) {
      b->down_until_ms = 0;
      b->failures = 0;
    }
  }
  if (new_active != active_) {
    first_ok_pending_ = new_active ? new_active->name : "";
    spdlog::info("front: route change (epoch {}): active {} -> {}", epoch, active_ ? active_->name : "none",
                 new_active ? new_active->name : "none");
  }
  SetRouted(active_, false);
  SetRouted(standby_, false);
  active_ = new_active;
  standby_ = new_standby;
  SetRouted(active_, true);
  SetRouted(standby_, true);
  epoch_ = epoch;
  pool_.Collect();
  WakeQueue();
  return Status::Ok();
}

void Proxy::BackendFailed(Backend* b, const std::string& why) {
  int64_t now = now_ms();
  ++b->failures;
  int64_t backoff = options_.down_backoff_ms;
  for (int i = 1; i < b->failures && backoff < options_.down_backoff_max_ms; ++i) backoff *= 2;
  b->down_until_ms = now + std::min(backoff, options_.down_backoff_max_ms);
  b->last_error = why;
  const int64_t wall = clock_->WallMs();
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
  ++counters_.switched_self;
  first_ok_pending_ = active_->name;
  spdlog::warn("front: switched from {} to {} by itself: {}", from->name, active_->name, why);
  Emit({{"type", "event"},
        {"kind", "switched"},
        {"from", from->name},
        {"to", active_->name},
        {"reason", why},
        {"epoch", epoch_},
        {"at_ms", wall}});
  WakeQueue();
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

void Proxy::WatchFlow(ProxyCall* call) {
  flow_paused_.insert(call);
  if (!uv_is_active(reinterpret_cast<uv_handle_t*>(&flow_timer_)) && !closing_) {
    uv_timer_start(
        &flow_timer_, [](uv_timer_t* t) { static_cast<Proxy*>(t->data)->OnFlowTimer(); }, 10, 10);
  }
}

void Proxy::OnFlowTimer() {
  std::vector<ProxyCall*> paused(flow_paused_.begin(), flow_paused_.end());
  for (ProxyCall* c : paused) {
    if (c->ResumeIfDrained(options_.client_buffer_low)) flow_paused_.erase(c);
  }
  if (flow_paused_.empty()) uv_timer_stop(&flow_timer_);
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
                   {"rejected_400", counters_.rejected_400}};
  return j;
}

void Proxy::Close(std::function<void()> done) {
  if (done) done_ = std::move(done);
  if (closing_) {
    MaybeDone();
    return;
  }
  closing_ = true;
  std::vector<ProxyCall*> all(calls_.begin(), calls_.end());
  for (ProxyCall* c : all) c->Cancel();
  queue_.clear();
  auto closed = [](uv_handle_t* h) {
    auto* self = static_cast<Proxy*>(h->data);
    --self->open_timers_;
    self->MaybeDone();
  };
  uv_close(reinterpret_cast<uv_handle_t*>(&queue_timer_), closed);
  uv_close(reinterpret_cast<uv_handle_t*>(&flow_timer_), closed);
  pool_.Close([this] {
    pool_closed_ = true;
    MaybeDone();
  });
}

void Proxy::MaybeDone() {
  if (!closing_ || open_timers_ != 0 || !pool_closed_ || !calls_.empty() || !done_) return;
  auto done = std::move(done_);
  done_ = nullptr;
  done();
}

}  // namespace wsup::front
