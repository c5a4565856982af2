#include "front/upstream.h"

#include <spdlog/spdlog.h>

#include <cassert>

namespace wsup::front {

namespace {

constexpr size_t kReadBufferSize = size_t{64} * 1024;

}  // namespace

std::string UpstreamError::Describe() const {
  std::string what;
  switch (code) {
    case UV_ECONNREFUSED: what = "refused the connection"; break;
    case UV_ECONNRESET: what = "reset the connection"; break;
    case UV_EOF: what = "closed the connection"; break;
    case UV_ETIMEDOUT: what = "did not accept the connection in time"; break;
    case UV_EPROTO: what = "sent a malformed response (" + detail + ")"; break;
    case UV_ESRCH: what = detail.empty() ? std::string("died") : "died (" + detail + ")"; break;
    default: what = std::string("failed: ") + uv_strerror(code); break;
  }
  switch (stage) {
    case Stage::kConnect: return what;
    case Stage::kAwaitingResponse: return what + " before answering";
    case Stage::kMidResponse: return what + " in the middle of its response";
  }
  return what;
}

// ---- UpstreamConn ----

UpstreamConn::UpstreamConn(UpstreamPool* pool, Backend* backend) : pool_(pool), backend_(backend) {
  tcp_.data = this;
  timer_.data = this;
  connect_req_.data = this;
  write_req_.data = this;
  parser_.data = this;
}

void UpstreamConn::Connect() {
  uv_tcp_init(pool_->loop(), &tcp_);
  uv_timer_init(pool_->loop(), &timer_);
  open_handles_ = 2;
  state_ = State::kConnecting;
  uv_tcp_nodelay(&tcp_, 1);
  int rc = uv_tcp_connect(&connect_req_, &tcp_, reinterpret_cast<const sockaddr*>(&backend_->addr.addr),
                          &UpstreamConn::OnConnect);
  if (rc < 0) {
    // Reported from the timer, never from inside the caller's Send().
    pending_error_ = rc;
    uv_timer_start(&timer_, &UpstreamConn::OnTimer, 0, 0);
    return;
  }
  uv_timer_start(&timer_, &UpstreamConn::OnTimer, static_cast<uint64_t>(pool_->options().connect_timeout_ms), 0);
}

void UpstreamConn::OnConnect(uv_connect_t* req, int status) {
  auto* self = static_cast<UpstreamConn*>(req->data);
  if (self->state_ == State::kClosed) return;
  if (status < 0) {
    self->Fail(status);
    return;
  }
  uv_timer_stop(&self->timer_);
  uv_tcp_nodelay(&self->tcp_, 1);
  self->StartReading();
  if (self->state_ == State::kClosed) return;
  if (self->listener_) {
    self->state_ = State::kBusy;
    self->StartWrite();
  } else {
    // Connected for a caller that gave up meanwhile: keep it for the next.
    self->state_ = State::kBusy;
    self->pool_->Release(self);
  }
}

void UpstreamConn::Send(UpstreamListener* listener, std::string_view head, std::string_view body,
                        bool head_request) {
  assert(listener_ == nullptr && state_ != State::kClosed);
  listener_ = listener;
  head_ = head;
  body_ = body;
  head_request_ = head_request;
  response_started_ = false;
  skip_interim_ = false;
  complete_ = false;
  headers_.clear();
  header_bytes_ = 0;
  last_was_value_ = false;
  http_parser_init(&parser_, HTTP_RESPONSE);
  parser_.data = this;
  if (state_ == State::kConnecting) return;  // written once connected
  state_ = State::kBusy;
  StartWrite();
}

void UpstreamConn::StartWrite() {
  uv_buf_t bufs[2];
  unsigned n = 0;
  bufs[n++] = uv_buf_init(const_cast<char*>(head_.data()), static_cast<unsigned>(head_.size()));
  if (!body_.empty()) bufs[n++] = uv_buf_init(const_cast<char*>(body_.data()), static_cast<unsigned>(body_.size()));
  // Most requests fit the socket buffer: written now, with no write request
  // and no epoll_ctl. What the socket did not take (or an error) goes
  // through uv_write, which reports it.
  int wrote = uv_try_write(reinterpret_cast<uv_stream_t*>(&tcp_), bufs, n);
  if (wrote > 0) {
    size_t skip = static_cast<size_t>(wrote);
    unsigned first = 0;
    while (first < n && skip >= bufs[first].len) skip -= bufs[first++].len;
    if (first == n) return;  // all of it
    bufs[first].base += skip;
    bufs[first].len -= skip;
    for (unsigned i = first; i < n; ++i) bufs[i - first] = bufs[i];
    n -= first;
  }
  int rc = uv_write(&write_req_, reinterpret_cast<uv_stream_t*>(&tcp_), bufs, n, &UpstreamConn::OnWritten);
  if (rc < 0) {
    Fail(rc);
    return;
  }
  writing_ = true;
}

void UpstreamConn::OnWritten(uv_write_t* req, int status) {
  auto* self = static_cast<UpstreamConn*>(req->data);
  self->writing_ = false;
  if (self->state_ == State::kClosed) return;
  if (status < 0) {
    self->keep_alive_ = false;
    if (!self->listener_) {
      self->Close();
    } else if (!self->response_started_) {
      self->Fail(status);
    }
    // else: the peer answered before taking the whole body (413, say); the
    // read side reports what arrived.
    return;
  }
  // A response that completed before its request finished writing could not
  // return to the pool until now.
  if (self->complete_ && self->state_ == State::kBusy && !self->listener_) self->pool_->Release(self);
}

void UpstreamConn::StartReading() {
  if (reading_ || paused_ || state_ == State::kClosed) return;
  int rc = uv_read_start(reinterpret_cast<uv_stream_t*>(&tcp_), &UpstreamConn::OnAlloc, &UpstreamConn::OnRead);
  if (rc < 0) {
    Fail(rc);
    return;
  }
  reading_ = true;
}

void UpstreamConn::PauseReading() {
  if (paused_ || state_ == State::kClosed) return;
  paused_ = true;
  if (reading_) uv_read_stop(reinterpret_cast<uv_stream_t*>(&tcp_));
  reading_ = false;
}

void UpstreamConn::ResumeReading() {
  if (!paused_) return;
  paused_ = false;
  StartReading();
}

void UpstreamConn::OnAlloc(uv_handle_t*, size_t, uv_buf_t* buf) {
  // One buffer for all upstream reads: each is consumed before the next.
  static thread_local std::vector<char> shared(kReadBufferSize);
  *buf = uv_buf_init(shared.data(), static_cast<unsigned>(shared.size()));
}

void UpstreamConn::OnRead(uv_stream_t* s, ssize_t nread, const uv_buf_t* buf) {
  auto* self = static_cast<UpstreamConn*>(s->data);
  if (nread == 0 || self->state_ == State::kClosed) return;
  if (nread == UV_EOF) {
    self->OnEof();
    return;
  }
  if (nread < 0) {
    if (self->state_ == State::kIdle) {
      self->Close();
    } else {
      self->Fail(static_cast<int>(nread));
    }
    return;
  }
  self->OnData(buf->base, static_cast<size_t>(nread));
}

void UpstreamConn::OnData(const char* data, size_t len) {
  if (state_ != State::kBusy || !listener_) {
    // Bytes nobody asked for: the framing of this connection is lost.
    spdlog::debug("front: {} sent {} bytes outside a response; closing that connection", backend_->name, len);
    Close();
    return;
  }
  response_started_ = true;
  size_t parsed = http_parser_execute(&parser_, http::ResponseSettings<UpstreamConn>(), data, len);
  if (state_ == State::kClosed) return;  // the listener aborted, or Fail() ran
  if (complete_) {
    if (parsed < len) keep_alive_ = false;  // trailing garbage: never reuse
    Finish();
    return;
  }
  auto err = static_cast<http_errno>(parser_.http_errno);
  if (err != HPE_OK) {
    Fail(UV_EPROTO, protocol_error_.empty() ? http_errno_description(err) : protocol_error_);
  }
}

void UpstreamConn::OnEof() {
  if (state_ != State::kBusy || !listener_) {
    Close();
    return;
  }
  // A body framed by the connection's end completes here.
  http_parser_execute(&parser_, http::ResponseSettings<UpstreamConn>(), nullptr, 0);
  if (state_ == State::kClosed) return;
  if (complete_) {
    keep_alive_ = false;
    Finish();
    return;
  }
  Fail(UV_EOF);
}

void UpstreamConn::OnTimer(uv_timer_t* t) {
  auto* self = static_cast<UpstreamConn*>(t->data);
  switch (self->state_) {
    case State::kConnecting:
      self->Fail(self->pending_error_ != 0 ? self->pending_error_ : UV_ETIMEDOUT);
      break;
    case State::kIdle:
      self->Close();  // kept long enough unused
      break;
    default:
      break;
  }
}

int UpstreamConn::ProtocolError(std::string detail) {
  if (protocol_error_.empty()) protocol_error_ = std::move(detail);
  return -1;
}

int UpstreamConn::OnHeaderField(http_parser* p, const char* at, size_t len) {
  auto* self = static_cast<UpstreamConn*>(p->data);
  self->header_bytes_ += len + 4;
  if (self->header_bytes_ > self->pool_->options().max_header_bytes) {
    return self->ProtocolError("response headers larger than " +
                               std::to_string(self->pool_->options().max_header_bytes) + " bytes");
  }
  if (self->headers_.empty() || self->last_was_value_) {
    if (self->headers_.size() >= self->pool_->options().max_headers) {
      return self->ProtocolError("more than " + std::to_string(self->pool_->options().max_headers) +
                                 " response headers");
    }
    self->headers_.push_back(http::Header{});
  }
  self->headers_.back().name.append(at, len);
  self->last_was_value_ = false;
  return 0;
}

int UpstreamConn::OnHeaderValue(http_parser* p, const char* at, size_t len) {
  auto* self = static_cast<UpstreamConn*>(p->data);
  self->header_bytes_ += len;
  if (self->header_bytes_ > self->pool_->options().max_header_bytes) {
    return self->ProtocolError("response headers larger than " +
                               std::to_string(self->pool_->options().max_header_bytes) + " bytes");
  }
  if (self->headers_.empty()) return self->ProtocolError("a header value without a name");
  self->headers_.back().value.append(at, len);
  self->last_was_value_ = true;
  return 0;
}

int UpstreamConn::OnHeadersComplete(http_parser* p) {
  auto* self = static_cast<UpstreamConn*>(p->data);
  int status = static_cast<int>(p->status_code);
  if (status >= 100 && status < 200) {
    // An interim answer (103 Early Hints): not forwarded; the final one follows.
    self->skip_interim_ = true;
    self->headers_.clear();
    self->header_bytes_ = 0;
    self->last_was_value_ = false;
    return 0;
  }
  self->keep_alive_ = http_should_keep_alive(p) != 0;
  self->listener_->OnUpstreamHead(status, &self->headers_);
  if (self->state_ == State::kClosed) return -1;
  // A HEAD response announces a length it does not send.
  return self->head_request_ ? 1 : 0;
}

int UpstreamConn::OnBody(http_parser* p, const char* at, size_t len) {
  auto* self = static_cast<UpstreamConn*>(p->data);
  self->listener_->OnUpstreamBody(std::string_view(at, len));
  return self->state_ == State::kClosed ? -1 : 0;
}

int UpstreamConn::OnMessageComplete(http_parser* p) {
  auto* self = static_cast<UpstreamConn*>(p->data);
  if (self->skip_interim_) {
    self->skip_interim_ = false;
    return 0;
  }
  self->complete_ = true;
  self->keep_alive_ = self->keep_alive_ && http_should_keep_alive(p) != 0;
  http_parser_pause(p, 1);  // one response per request; anything after is an error
  return 0;
}

void UpstreamConn::Finish() {
  UpstreamListener* l = listener_;
  listener_ = nullptr;
  ++served_;
  if (!keep_alive_) {
    Close();
  } else if (!writing_) {
    pool_->Release(this);
  }
  // else: returns to the pool when its write completes (OnWritten).
  if (l) l->OnUpstreamDone();
}

void UpstreamConn::Fail(int code, std::string detail) {
  if (state_ == State::kClosed) return;
  UpstreamError e;
  e.code = code;
  e.reused = served_ > 0;
  e.detail = std::move(detail);
  e.stage = state_ == State::kConnecting ? UpstreamError::Stage::kConnect
            : response_started_          ? UpstreamError::Stage::kMidResponse
                                         : UpstreamError::Stage::kAwaitingResponse;
  UpstreamListener* l = listener_;
  listener_ = nullptr;
  Close();
  if (l) l->OnUpstreamError(e);
}

void UpstreamConn::Abort() {
  listener_ = nullptr;
  Close();
}

bool UpstreamConn::Cut(int code, std::string detail) {
  if (state_ == State::kClosed) return false;
  const bool had = listener_ != nullptr;
  if (had) {
    Fail(code, std::move(detail));
  } else {
    Close();
  }
  return had;
}

void UpstreamConn::BecomeIdle() {
  state_ = State::kIdle;
  listener_ = nullptr;
  uv_timer_start(&timer_, &UpstreamConn::OnTimer, static_cast<uint64_t>(pool_->options().idle_timeout_ms), 0);
}

void UpstreamConn::TakeFromIdle() {
  uv_timer_stop(&timer_);
  state_ = State::kBusy;
}

void UpstreamConn::Close() {
  if (state_ == State::kClosed) return;
  bool was_idle = state_ == State::kIdle;
  state_ = State::kClosed;
  listener_ = nullptr;
  if (was_idle) {
    auto& idle = backend_->idle;
    for (size_t i = 0; i < idle.size(); ++i) {
      if (idle[i] == this) {
        idle.erase(idle.begin() + static_cast<ptrdiff_t>(i));
        break;
      }
    }
  }
  uv_close(reinterpret_cast<uv_handle_t*>(&tcp_), &UpstreamConn::OnClosed);
  uv_close(reinterpret_cast<uv_handle_t*>(&timer_), &UpstreamConn::OnClosed);
}

void UpstreamConn::OnClosed(uv_handle_t* h) {
  auto* self = static_cast<UpstreamConn*>(h->data);
  if (--self->open_handles_ > 0) return;
  UpstreamPool* pool = self->pool_;
  pool->Forget(self);
  delete self;
}

// ---- UpstreamPool ----

UpstreamPool::UpstreamPool(uv_loop_t* loop, UpstreamOptions options) : loop_(loop), options_(options) {}

UpstreamPool::~UpstreamPool() {
  if (!all_.empty()) spdlog::error("front: upstream pool destroyed with {} open connections", all_.size());
}

Backend* UpstreamPool::Get(const HostPort& addr) {
  std::string name = addr.ToString();
  auto it = backends_.find(name);
  if (it != backends_.end()) return it->second.get();
  auto b = std::make_unique<Backend>();
  b->name = name;
  b->addr = addr;
  Backend* raw = b.get();
  backends_.emplace(std::move(name), std::move(b));
  return raw;
}

UpstreamConn* UpstreamPool::Acquire(Backend* b, bool fresh) {
  if (!fresh && !b->idle.empty()) {
    UpstreamConn* c = b->idle.back();
    b->idle.pop_back();
    c->TakeFromIdle();
    return c;
  }
  auto* c = new UpstreamConn(this, b);
  all_.insert(c);
  ++b->conns;
  c->Connect();
  return c;
}

void UpstreamPool::Release(UpstreamConn* c) {
  Backend* b = c->backend();
  if (close_.closing() || b->idle.size() >= options_.max_idle_per_backend || !b->routed) {
    c->Close();
    return;
  }
  c->BecomeIdle();
  b->idle.push_back(c);
}

void UpstreamPool::Forget(UpstreamConn* c) {
  all_.erase(c);
  --c->backend()->conns;
  close_.Check();
}

void UpstreamPool::Collect() {
  for (auto it = backends_.begin(); it != backends_.end();) {
    Backend* b = it->second.get();
    if (!b->routed) {
      std::vector<UpstreamConn*> idle = b->idle;
      for (UpstreamConn* c : idle) c->Close();
    }
    if (!b->routed && b->inflight == 0 && b->conns == 0) {
      it = backends_.erase(it);
    } else {
      ++it;
    }
  }
}

size_t UpstreamPool::CutBackend(Backend* b, int code, const std::string& detail) {
  // Copied: a listener that hears of the cut may open new connections (to
  // other engines). Nothing is freed before uv_close's callbacks, so every
  // pointer stays valid through the walk.
  std::vector<UpstreamConn*> mine;
  for (UpstreamConn* c : all_) {
    if (c->backend() == b) mine.push_back(c);
  }
  size_t cut = 0;
  for (UpstreamConn* c : mine) cut += c->Cut(code, detail) ? 1 : 0;
  return cut;
}

Backend* UpstreamPool::Find(const std::string& name) const {
  auto it = backends_.find(name);
  return it == backends_.end() ? nullptr : it->second.get();
}

void UpstreamPool::Close(std::function<void()> done) {
  if (!close_.Begin(std::move(done))) return;
  std::vector<UpstreamConn*> all(all_.begin(), all_.end());
  for (UpstreamConn* c : all) c->Abort();
  close_.Check();
}

}  // namespace wsup::front
