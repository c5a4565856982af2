#include "http/server.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cassert>
#include <cstring>
#include <deque>
#include <random>
#include <vector>

namespace wsup::http {

namespace {

constexpr size_t kReadBufferSize = size_t{64} * 1024;

// X-Request-Id values are echoed into our own headers: only visible ASCII,
// bounded, so a peer cannot inject header lines.
bool UsableRequestId(const std::string& id) {
  if (id.empty() || id.size() > 200) return false;
  for (char c : id) {
    if (c <= 0x20 || c >= 0x7f) return false;
  }
  return true;
}

}  // namespace

// One accepted connection. Owns its tcp and timer handles; deletes itself in
// the close callback of the last one (see Close()).
class Connection {
 public:
  explicit Connection(HttpServer* server)
      : server_(server), parser_(server->options().limits) {
    tcp_.data = this;
    timer_.data = this;
    shutdown_req_.data = this;
    parser_.on_headers = [this](const HttpRequest& r) { OnHeaders(r); };
  }

  // Initializes both handles (they must be closed from here on) and accepts.
  bool Accept(uv_stream_t* listener) {
    uv_tcp_init(server_->loop(), &tcp_);
    uv_timer_init(server_->loop(), &timer_);
    open_handles_ = 2;
    int rc = uv_accept(listener, reinterpret_cast<uv_stream_t*>(&tcp_));
    if (rc < 0) {
      spdlog::warn("http: accept failed: {}", uv_strerror(rc));
      return false;
    }
    return Accepted();
  }

  // The same for a socket accepted elsewhere (another loop's acceptor).
  bool Open(int fd) {
    uv_tcp_init(server_->loop(), &tcp_);
    uv_timer_init(server_->loop(), &timer_);
    open_handles_ = 2;
    int rc = uv_tcp_open(&tcp_, fd);
    if (rc < 0) {
      spdlog::warn("http: cannot take accepted socket {}: {}", fd, uv_strerror(rc));
      ::close(fd);
      return false;
    }
    return Accepted();
  }

  bool Accepted() {
    uv_tcp_nodelay(&tcp_, 1);
    int64_t now = Now();
    request_start_ms_ = now;
    last_activity_ms_ = now;
    awaiting_first_byte_ = true;
    return true;
  }

  void Start() {
    SetReading(true);
    UpdateTimer();
  }

  // Hard close: pending writes are dropped, the current writer is detached.
  void Close() {
    if (phase_ == Phase::kClosed) return;
    phase_ = Phase::kClosed;
    if (current_) {
      auto w = std::move(current_);
      w->Detach();
    }
    queue_.clear();
    uv_close(reinterpret_cast<uv_handle_t*>(&tcp_), &Connection::OnHandleClosed);
    uv_close(reinterpret_cast<uv_handle_t*>(&timer_), &Connection::OnHandleClosed);
  }

  // Called by the writer with response bytes.
  void Write(std::string data) {
    if (phase_ == Phase::kClosed || data.empty()) return;
    if (queued_bytes_ == 0) {
      // Nothing queued before it: hand the bytes to the socket now. A write
      // the socket takes whole needs no request and no completion, and
      // leaves libuv's watcher alone (no epoll_ctl per response). Errors
      // and the rest of a partial write go the queued way below.
      uv_buf_t now = uv_buf_init(data.data(), static_cast<unsigned>(data.size()));
      int n = uv_try_write(reinterpret_cast<uv_stream_t*>(&tcp_), &now, 1);
      if (n == static_cast<int>(data.size())) {
        last_write_progress_ms_ = Now();
        UpdateTimer();
        return;
      }
      if (n > 0) data.erase(0, static_cast<size_t>(n));
    }
    auto* w = new WriteReq;
    w->conn = this;
    w->data = std::move(data);
    uv_buf_t buf = uv_buf_init(w->data.data(), static_cast<unsigned>(w->data.size()));
    if (queued_bytes_ == 0) last_write_progress_ms_ = Now();
    queued_bytes_ += w->data.size();
    int rc = uv_write(&w->req, reinterpret_cast<uv_stream_t*>(&tcp_), &buf, 1, &Connection::OnWritten);
    if (rc < 0) {
      queued_bytes_ -= w->data.size();
      delete w;
      spdlog::debug("http: write failed: {}", uv_strerror(rc));
      Close();
      return;
    }
    UpdateTimer();
  }

  // Called by the writer once its response is complete.
  void ResponseFinished(bool close_after) {
    current_.reset();
    if (phase_ != Phase::kOpen) return;
    last_activity_ms_ = Now();
    if (close_after) {
      BeginFinalClose();
      return;
    }
    Pump();
  }

  size_t queued_bytes() const { return queued_bytes_; }
  HttpServer* server() const { return server_; }

 private:
  enum class Phase {
    kOpen,      // reading requests, answering them
    kDraining,  // the last answer is queued; waiting for the socket to take it
    kLinger,    // FIN sent; reading and dropping input until EOF or linger_ms
    kClosed,    // uv_close() called
  };

  struct WriteReq {
    uv_write_t req;
    Connection* conn;
    std::string data;
  };

  int64_t Now() const { return static_cast<int64_t>(uv_now(server_->loop())); }
  const ServerOptions& opts() const { return server_->options(); }

  static void OnHandleClosed(uv_handle_t* h) {
    auto* self = static_cast<Connection*>(h->data);
    if (--self->open_handles_ == 0) {
      HttpServer* server = self->server_;
      server->Forget(self);
      delete self;
      server->MaybeDone();
    }
  }

  static void OnAlloc(uv_handle_t* h, size_t, uv_buf_t* buf) {
    // One shared buffer: the loop thread consumes each read before the next.
    static thread_local std::vector<char> shared(kReadBufferSize);
    *buf = uv_buf_init(shared.data(), static_cast<unsigned>(shared.size()));
  }

  static void OnRead(uv_stream_t* s, ssize_t nread, const uv_buf_t* buf) {
    auto* self = static_cast<Connection*>(s->data);
    if (nread == 0) return;  // EAGAIN
    if (nread < 0) {
      self->OnReadEnd(static_cast<int>(nread));
      return;
    }
    self->OnData(buf->base, static_cast<size_t>(nread));
  }

  static void OnWritten(uv_write_t* req, int status) {
    auto* w = reinterpret_cast<WriteReq*>(req);
    Connection* self = w->conn;
    self->queued_bytes_ -= w->data.size();
    delete w;
    if (self->phase_ == Phase::kClosed) return;  // cancelled by Close()
    if (status < 0) {
      spdlog::debug("http: write failed: {}", uv_strerror(status));
      self->Close();
      return;
    }
    self->last_write_progress_ms_ = self->Now();
    if (self->phase_ == Phase::kDraining && self->queued_bytes_ == 0) {
      self->StartLinger();
      return;
    }
    self->UpdateTimer();
  }

  static void OnShutdown(uv_shutdown_t* req, int status) {
    auto* self = static_cast<Connection*>(req->data);
    self->shutdown_pending_ = false;
    if (self->phase_ == Phase::kClosed) return;
    if (status < 0 || self->peer_eof_) self->Close();
  }

  static void OnTimer(uv_timer_t* t) {
    auto* c = static_cast<Connection*>(t->data);
    c->armed_ms_ = INT64_MAX;
    c->OnTimeout();
  }

  void SetReading(bool on) {
    if (on == reading_ || phase_ == Phase::kClosed) return;
    if (on) {
      int rc = uv_read_start(reinterpret_cast<uv_stream_t*>(&tcp_), &Connection::OnAlloc, &Connection::OnRead);
      if (rc < 0) {
        spdlog::debug("http: read start failed: {}", uv_strerror(rc));
        Close();
        return;
      }
    } else {
      uv_read_stop(reinterpret_cast<uv_stream_t*>(&tcp_));
    }
    reading_ = on;
  }

  void OnReadEnd(int err) {
    SetReading(false);
    if (err != UV_EOF) {
      spdlog::debug("http: read failed: {}", uv_strerror(err));
      Close();
      return;
    }
    peer_eof_ = true;
    switch (phase_) {
      case Phase::kOpen:
        if (!current_ && queue_.empty()) {
          if (parser_.failed()) {
            Pump();
          } else {
            Close();
          }
        } else if (opts().serve_half_closed) {
          // A peer that half-closes may still read the answers it is owed.
          UpdateTimer();
        } else {
          // The client hung up on its answer: closing runs the writer's
          // OnClose, which cancels the work (see ServerOptions).
          spdlog::debug("http: the peer closed its connection with a request in flight; cancelling it");
          Close();
        }
        break;
      case Phase::kDraining:
        UpdateTimer();
        break;
      case Phase::kLinger:
        if (!shutdown_pending_) Close();
        break;
      case Phase::kClosed:
        break;
    }
  }

  void OnData(const char* data, size_t len) {
    int64_t now = Now();
    last_activity_ms_ = now;
    if (phase_ != Phase::kOpen) return;  // draining or lingering: drop input
    if (awaiting_first_byte_) {
      awaiting_first_byte_ = false;
      request_start_ms_ = now;
    }
    bool was_in_request = parser_.in_request();
    fed_.clear();
    bool ok = parser_.Feed(data, len, &fed_);
    if (parser_.in_request() && (!was_in_request || !fed_.empty())) request_start_ms_ = now;
    for (auto& r : fed_) {
      const std::string* id = r.FindHeader("X-Request-Id");
      r.request_id = (id && UsableRequestId(*id)) ? *id : server_->NextRequestId();
      queue_.push_back(std::move(r));
    }
    fed_.clear();
    if (!ok) SetReading(false);
    Pump();
  }

  void OnHeaders(const HttpRequest& r) {
    headers_done_ms_ = Now();
    // "100 Continue" only when it cannot land inside another response.
    if (r.expect_continue && r.version_minor >= 1 && !current_ && queue_.empty() && fed_.empty() &&
        queued_bytes_ == 0) {
      Write("HTTP/1.1 100 Continue\r\n\r\n");
    }
  }

  // Hands queued requests to the handler one at a time, in order; sends the
  // parse error once everything before it is answered.
  void Pump() {
    if (in_pump_) return;
    in_pump_ = true;
    while (phase_ == Phase::kOpen && !current_) {
      if (!queue_.empty()) {
        HttpRequest req = std::move(queue_.front());
        queue_.pop_front();
        current_ = std::make_shared<ResponseWriter>(this, std::move(req));
        std::shared_ptr<ResponseWriter> w = current_;
        server_->Dispatch(std::move(w));
        continue;
      }
      if (parser_.failed()) {
        SendError(parser_.error().status, parser_.error().message);
        break;
      }
      if (peer_eof_) {
        Close();
        break;
      }
      break;
    }
    in_pump_ = false;
    if (phase_ == Phase::kOpen) {
      SetReading(!peer_eof_ && !parser_.failed() && queue_.size() < opts().max_pipelined);
      UpdateTimer();
    }
  }

  // An answer the server owes by itself (the request never reached a handler).
  void SendError(int status, const std::string& message) {
    std::string body = ErrorJson(message, status == 408 ? "timeout_error" : "invalid_request_error");
    std::vector<Header> h = {{"Content-Type", "application/json"},
                             {"Content-Length", std::to_string(body.size())},
                             {"Connection", "close"},
                             {"Server", opts().server_name}};
    Write(SerializeHead(status, h) + body);
    BeginFinalClose();
  }

  void BeginFinalClose() {
    if (phase_ != Phase::kOpen) return;
    phase_ = Phase::kDraining;
    queue_.clear();
    // Keep reading (and dropping) so unread input does not turn our close into a reset.
    if (!peer_eof_) SetReading(true);
    if (queued_bytes_ == 0) {
      StartLinger();
    } else {
      UpdateTimer();
    }
  }

  void StartLinger() {
    phase_ = Phase::kLinger;
    linger_start_ms_ = Now();
    int rc = uv_shutdown(&shutdown_req_, reinterpret_cast<uv_stream_t*>(&tcp_), &Connection::OnShutdown);
    if (rc < 0) {
      Close();
      return;
    }
    shutdown_pending_ = true;
    if (peer_eof_) {
      // Nothing more will arrive; close once the FIN is out (OnShutdown).
      UpdateTimer();
      return;
    }
    UpdateTimer();
  }

  void OnTimeout() {
    if (phase_ == Phase::kClosed) return;
    int64_t now = Now();
    if (phase_ == Phase::kLinger) {
      if (now - linger_start_ms_ >= opts().linger_ms) {
        Close();
        return;
      }
      UpdateTimer();
      return;
    }
    if (queued_bytes_ > 0 && now - last_write_progress_ms_ >= opts().write_timeout_ms) {
      spdlog::debug("http: peer took no response bytes for {} ms; closing", opts().write_timeout_ms);
      Close();
      return;
    }
    if (phase_ == Phase::kDraining) {
      UpdateTimer();
      return;
    }
    if (awaiting_first_byte_) {
      if (now - request_start_ms_ >= opts().header_timeout_ms) {
        Close();
        return;
      }
    } else if (parser_.in_request() && !parser_.failed()) {
      bool headers = parser_.headers_done();
      int64_t limit = headers ? opts().body_timeout_ms : opts().header_timeout_ms;
      int64_t since = headers ? headers_done_ms_ : request_start_ms_;
      if (now - since >= limit) {
        if (!current_ && queue_.empty()) {
          SendError(408, std::string(headers ? "the request body" : "the request headers") +
                             " did not arrive within " + std::to_string(limit) +
                             " ms; send the whole request promptly");
        } else {
          Close();
        }
        return;
      }
    } else if (!current_ && queue_.empty() && queued_bytes_ == 0) {
      if (now - last_activity_ms_ >= opts().idle_timeout_ms) {
        Close();
        return;
      }
    }
    UpdateTimer();
  }

  // Arms the one timer for the earliest deadline that applies now. Lazily:
  // a timer already set to fire earlier is left alone (it fires, finds
  // nothing due and arms for what is due then), so a keep-alive request,
  // whose deadlines only move later, costs no timer operation; re-arming
  // for every request was two heap operations per request.
  void UpdateTimer() {
    if (phase_ == Phase::kClosed) return;
    int64_t deadline = INT64_MAX;
    auto consider = [&](int64_t d) { deadline = std::min(deadline, d); };
    if (queued_bytes_ > 0) consider(last_write_progress_ms_ + opts().write_timeout_ms);
    if (phase_ == Phase::kLinger) {
      consider(linger_start_ms_ + opts().linger_ms);
    } else if (phase_ == Phase::kOpen) {
      if (awaiting_first_byte_) {
        consider(request_start_ms_ + opts().header_timeout_ms);
      } else if (parser_.in_request() && !parser_.failed()) {
        if (parser_.headers_done()) {
          consider(headers_done_ms_ + opts().body_timeout_ms);
        } else {
          consider(request_start_ms_ + opts().header_timeout_ms);
        }
      } else if (!current_ && queue_.empty() && queued_bytes_ == 0) {
        consider(last_activity_ms_ + opts().idle_timeout_ms);
      }
    }
    if (deadline >= armed_ms_) return;  // it fires first and looks again
    armed_ms_ = deadline;
    int64_t delay = std::max<int64_t>(0, deadline - Now());
    uv_timer_start(&timer_, &Connection::OnTimer, static_cast<uint64_t>(delay), 0);
  }

  HttpServer* server_;
  uv_tcp_t tcp_;
  uv_timer_t timer_;
  int64_t armed_ms_ = INT64_MAX;  // loop time the timer fires at; INT64_MAX: not armed
  uv_shutdown_t shutdown_req_;
  int open_handles_ = 0;
  Phase phase_ = Phase::kOpen;
  RequestParser parser_;
  std::vector<HttpRequest> fed_;
  std::deque<HttpRequest> queue_;
  std::shared_ptr<ResponseWriter> current_;
  bool reading_ = false;
  bool peer_eof_ = false;
  bool in_pump_ = false;
  bool awaiting_first_byte_ = false;
  bool shutdown_pending_ = false;
  size_t queued_bytes_ = 0;
  int64_t request_start_ms_ = 0;
  int64_t headers_done_ms_ = 0;
  int64_t last_activity_ms_ = 0;
  int64_t last_write_progress_ms_ = 0;
  int64_t linger_start_ms_ = 0;
};

// ---- ResponseWriter ----

std::vector<Header> ResponseWriter::FramingHeaders(bool chunked, size_t content_length, bool have_length) {
  std::vector<Header> h;
  if (have_length) h.push_back({"Content-Length", std::to_string(content_length)});
  if (chunked) h.push_back({"Transfer-Encoding", "chunked"});
  h.push_back({"Connection", request_.keep_alive ? "keep-alive" : "close"});
  h.push_back({"X-Request-Id", request_.request_id});
  h.push_back({"Server", conn_->server()->options().server_name});
  return h;
}

void ResponseWriter::Send(HttpResponse response) {
  if (!started_ && status_ == 0) status_ = response.status;
  if (!conn_ || started_) return;
  started_ = true;
  finished_ = true;
  std::vector<Header> headers = std::move(response.headers);
  for (auto& h : FramingHeaders(false, response.body.size(), true)) headers.push_back(std::move(h));
  std::string out = SerializeHead(response.status, headers);
  if (request_.method != "HEAD") out += response.body;
  Connection* c = conn_;
  conn_ = nullptr;
  c->Write(std::move(out));
  c->ResponseFinished(!request_.keep_alive);
}

void ResponseWriter::StartStream(int status, std::vector<Header> headers) {
  if (!started_ && status_ == 0) status_ = status;
  if (!conn_ || started_) return;
  started_ = true;
  // HTTP/1.0 has no chunked framing: the body ends when the connection does.
  chunked_ = !(request_.version_major == 1 && request_.version_minor == 0);
  if (!chunked_) request_.keep_alive = false;
  for (auto& h : FramingHeaders(chunked_, 0, false)) headers.push_back(std::move(h));
  conn_->Write(SerializeHead(status, headers));
}

void ResponseWriter::Write(std::string_view data) {
  if (!conn_ || !started_ || finished_ || data.empty()) return;
  if (request_.method == "HEAD") return;
  conn_->Write(chunked_ ? EncodeChunk(data) : std::string(data));
}

void ResponseWriter::End() {
  if (!conn_ || !started_ || finished_) return;
  finished_ = true;
  Connection* c = conn_;
  conn_ = nullptr;
  if (chunked_ && request_.method != "HEAD") c->Write(EncodeChunk({}));
  c->ResponseFinished(!request_.keep_alive);
}

void ResponseWriter::Abort() {
  if (!conn_) return;
  finished_ = true;
  Connection* c = conn_;
  conn_ = nullptr;
  c->Close();
}

size_t ResponseWriter::queued_bytes() const { return conn_ ? conn_->queued_bytes() : 0; }

void ResponseWriter::Detach() {
  if (!conn_) return;
  conn_ = nullptr;
  if (on_close_) {
    auto cb = std::move(on_close_);
    on_close_ = nullptr;
    cb();
  }
}

// ---- HttpServer ----

HttpServer::HttpServer(uv_loop_t* loop, ServerOptions options, Handler handler)
    : loop_(loop), options_(std::move(options)), handler_(std::move(handler)) {
  std::random_device rd;
  id_salt_ = (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

HttpServer::~HttpServer() {
  // Handles hold pointers to this server: it must be closed (Close() and its
  // callbacks run) before it is destroyed.
  assert(listener_ == nullptr && connections_.empty());
}

Status HttpServer::Listen() {
  if (listener_) return Internal("http: Listen() called twice");
  sockaddr_storage addr{};
  int rc;
  if (options_.host.find(':') != std::string::npos) {
    rc = uv_ip6_addr(options_.host.c_str(), options_.port, reinterpret_cast<sockaddr_in6*>(&addr));
  } else {
    rc = uv_ip4_addr(options_.host.c_str(), options_.port, reinterpret_cast<sockaddr_in*>(&addr));
  }
  if (rc < 0) {
    return InvalidArgument("http: '" + options_.host + "' is not a numeric IPv4 or IPv6 address; pass one such as 127.0.0.1 or ::1");
  }
  listener_ = new uv_tcp_t;
  uv_tcp_init(loop_, listener_);
  listener_->data = this;
  listener_closed_ = false;
  rc = uv_tcp_bind(listener_, reinterpret_cast<const sockaddr*>(&addr), 0);
  if (rc == 0) rc = uv_listen(reinterpret_cast<uv_stream_t*>(listener_), options_.backlog, &HttpServer::OnConnection);
  if (rc < 0) {
    uv_close(reinterpret_cast<uv_handle_t*>(listener_), [](uv_handle_t* h) { delete reinterpret_cast<uv_tcp_t*>(h); });
    listener_ = nullptr;
    listener_closed_ = true;
    return IoError("http: cannot listen on " + options_.host + ":" + std::to_string(options_.port) + ": " +
                   uv_strerror(rc) + "; pick another port (0 lets the kernel choose) or stop the process using it");
  }
  return StartAccepting();
}

Status HttpServer::Adopt(int fd) {
  if (listener_) return Internal("http: Adopt() on a server that already listens");
  listener_ = new uv_tcp_t;
  uv_tcp_init(loop_, listener_);
  listener_->data = this;
  listener_closed_ = false;
  int rc = uv_tcp_open(listener_, fd);
  if (rc == 0) rc = uv_listen(reinterpret_cast<uv_stream_t*>(listener_), options_.backlog, &HttpServer::OnConnection);
  if (rc < 0) {
    uv_close(reinterpret_cast<uv_handle_t*>(listener_), [](uv_handle_t* h) { delete reinterpret_cast<uv_tcp_t*>(h); });
    listener_ = nullptr;
    listener_closed_ = true;
    return IoError("http: cannot accept on inherited fd " + std::to_string(fd) + ": " + uv_strerror(rc) +
                   "; pass a bound, listening TCP socket");
  }
  return StartAccepting();
}

Status HttpServer::StartAccepting() {
  sockaddr_storage addr{};
  int len = sizeof(addr);
  int rc = uv_tcp_getsockname(listener_, reinterpret_cast<sockaddr*>(&addr), &len);
  if (rc < 0) return IoError(std::string("http: getsockname failed: ") + uv_strerror(rc));
  if (addr.ss_family == AF_INET6) {
    port_ = ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
  } else {
    port_ = ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  }
  return Status::Ok();
}

void HttpServer::OnConnection(uv_stream_t* listener, int status) {
  auto* self = static_cast<HttpServer*>(listener->data);
  if (status < 0) {
    spdlog::warn("http: accept error on port {}: {}", self->port_, uv_strerror(status));
    return;
  }
  auto* c = new Connection(self);
  self->connections_.insert(c);
  if (!c->Accept(listener) || self->close_.closing() || self->connections_.size() > self->options_.max_connections) {
    c->Close();
    return;
  }
  c->Start();
}

void HttpServer::AdoptConnection(int fd) {
  auto* c = new Connection(this);
  connections_.insert(c);
  if (!c->Open(fd) || close_.closing() || connections_.size() > options_.max_connections) {
    c->Close();
    return;
  }
  c->Start();
}

void HttpServer::Close(std::function<void()> done) {
  if (!close_.Begin(std::move(done))) return;
  if (listener_) {
    uv_tcp_t* l = listener_;
    listener_ = nullptr;
    uv_close(reinterpret_cast<uv_handle_t*>(l), [](uv_handle_t* h) {
      auto* server = static_cast<HttpServer*>(h->data);
      delete reinterpret_cast<uv_tcp_t*>(h);
      server->listener_closed_ = true;
      server->MaybeDone();
    });
  }
  std::vector<Connection*> all(connections_.begin(), connections_.end());
  for (Connection* c : all) c->Close();
  MaybeDone();
}

void HttpServer::Forget(Connection* c) { connections_.erase(c); }

std::string HttpServer::NextRequestId() {
  // 16 hex digits: the salt's low half, then the counter's (by hand: this
  // runs for every request, and snprintf was a visible share of the front's
  // own time).
  static constexpr char kHex[] = "0123456789abcdef";
  const uint64_t v = ((id_salt_ & 0xffffffffu) << 32) | (++request_counter_ & 0xffffffffu);
  std::string id(16, '0');
  for (int i = 15, shift = 0; i >= 0; --i, shift += 4) id[i] = kHex[(v >> shift) & 0xf];
  return id;
}

}  // namespace wsup::http
