#include "http/client.h"

#include <http_parser.h>

#include <climits>
#include <cstring>
#include <memory>
#include <optional>

#include "http/parser_settings.h"

namespace wsup::http {

// ---------------------------------------------------------------------------
// SseParser

void SseParser::Feed(std::string_view bytes, const Sink& sink) {
  for (char c : bytes) {
    if (skip_lf_) {
      skip_lf_ = false;
      if (c == '\n') continue;  // the LF of a CRLF
    }
    if (c == '\r' || c == '\n') {
      skip_lf_ = c == '\r';
      Line(line_, sink);
      line_.clear();
    } else {
      line_ += c;
    }
  }
}

void SseParser::Line(std::string_view line, const Sink& sink) {
  if (line.empty()) {
    if (have_data_) sink(std::move(event_));
    event_ = ServerSentEvent{};
    have_data_ = false;
    return;
  }
  if (line.front() == ':') return;  // a comment (keep-alive)
  size_t colon = line.find(':');
  std::string_view field = line.substr(0, colon);
  std::string_view value = colon == std::string_view::npos ? std::string_view() : line.substr(colon + 1);
  if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  if (field == "data") {
    if (have_data_) event_.data += '\n';
    event_.data.append(value);
    have_data_ = true;
  } else if (field == "event") {
    event_.event = std::string(value);
  } else if (field == "id") {
    event_.id = std::string(value);
  }
  // "retry" and unknown fields are ignored, as the standard says.
}

// ---------------------------------------------------------------------------
// One request: a connection, a timer, a parser.

class HttpClient::Request {
  template <typename>
  friend const http_parser_settings* ResponseSettings();

 public:
  Request(HttpClient* client, RequestId id, std::string host, int port, ClientRequest req, ResponseCallback done)
      : client_(client),
        id_(id),
        host_(std::move(host)),
        port_(port),
        req_(std::move(req)),
        done_(std::move(done)) {
    tcp_.data = this;
    timer_.data = this;
    connect_req_.data = this;
    write_req_.data = this;
    http_parser_init(&parser_, HTTP_RESPONSE);
    parser_.data = this;
  }

  void Start() {
    uv_loop_t* loop = client_->loop();
    uv_timer_init(loop, &timer_);
    uv_tcp_init(loop, &tcp_);
    open_handles_ = 2;
    uv_timer_start(&timer_, &Request::OnTimer, static_cast<uint64_t>(std::max<int64_t>(0, req_.timeout_ms)), 0);

    sockaddr_storage addr{};
    std::string host = host_;
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
    if (host == "localhost") host = "127.0.0.1";
    if (port_ < 1 || port_ > 65535) {
      FailSoon(InvalidArgument(Prefix() + "port " + std::to_string(port_) + " is outside 1..65535"));
      return;
    }
    if (uv_ip4_addr(host.c_str(), port_, reinterpret_cast<sockaddr_in*>(&addr)) != 0 &&
        uv_ip6_addr(host.c_str(), port_, reinterpret_cast<sockaddr_in6*>(&addr)) != 0) {
      FailSoon(InvalidArgument(Prefix() + "\"" + host_ +
                               "\" is not an IP address; the client does not resolve names: use e.g. 127.0.0.1"));
      return;
    }
    int rc = uv_tcp_connect(&connect_req_, &tcp_, reinterpret_cast<const sockaddr*>(&addr), &Request::OnConnect);
    if (rc < 0) FailSoon(ConnectError(rc));
  }

  // Ends the request with `result` and closes its handles. Idempotent.
  void Finish(Result<HttpResponse> result) {
    if (finished_) return;
    finished_ = true;
    ResponseCallback done = std::move(done_);
    if (client_) client_->Forget(id_);
    client_ = nullptr;
    CloseHandles();
    if (done) done(std::move(result));  // may destroy the client or send more; `this` lives until the close callbacks
  }

  // Ends the request without running its callback (the client is going away).
  void Abort() {
    finished_ = true;
    done_ = nullptr;
    req_.on_head = nullptr;
    req_.on_data = nullptr;
    req_.on_event = nullptr;
    client_ = nullptr;
    CloseHandles();
  }

  std::string Prefix() const {
    std::string h = host_.find(':') != std::string::npos && host_.front() != '[' ? "[" + host_ + "]" : host_;
    return h + ":" + std::to_string(port_) + ": " + req_.method + " " + req_.target + ": ";
  }

 private:
  Error ConnectError(int rc) const {
    std::string what = uv_strerror(rc);
    if (rc == UV_ECONNREFUSED)
      return Unavailable(Prefix() + "connection refused: nothing listens on that port; is the server running?");
    return Unavailable(Prefix() + "cannot connect: " + what);
  }

  // A failure found before any I/O: reported from the timer, never inside Send().
  void FailSoon(Error e) {
    pending_ = std::move(e);
    uv_timer_start(&timer_, &Request::OnTimer, 0, 0);
  }

  void CloseHandles() {
    if (closing_) return;
    closing_ = true;
    if (open_handles_ == 0) {
      delete this;  // Start() never ran
      return;
    }
    uv_close(reinterpret_cast<uv_handle_t*>(&timer_), &Request::OnClosed);
    uv_close(reinterpret_cast<uv_handle_t*>(&tcp_), &Request::OnClosed);
  }

  static void OnClosed(uv_handle_t* h) {
    auto* self = static_cast<Request*>(h->data);
    if (--self->open_handles_ == 0) delete self;
  }

  static void OnTimer(uv_timer_t* t) {
    auto* self = static_cast<Request*>(t->data);
    if (self->pending_) {
      Error e = std::move(*self->pending_);
      self->pending_.reset();
      self->Finish(std::move(e));
      return;
    }
    self->Finish(Timeout(self->Prefix() + "no complete response within " + std::to_string(self->req_.timeout_ms) +
                         " ms"));
  }

  static void OnConnect(uv_connect_t* c, int status) {
    auto* self = static_cast<Request*>(c->data);
    if (self->finished_) return;  // cancelled while connecting
    if (status < 0) {
      self->Finish(self->ConnectError(status));
      return;
    }
    uv_tcp_nodelay(&self->tcp_, 1);
    self->Serialize();
    uv_buf_t buf = uv_buf_init(self->out_.data(), static_cast<unsigned>(self->out_.size()));
    int rc = uv_write(&self->write_req_, reinterpret_cast<uv_stream_t*>(&self->tcp_), &buf, 1, &Request::OnWrite);
    if (rc < 0) {
      self->Finish(IoError(self->Prefix() + "cannot send the request: " + uv_strerror(rc)));
      return;
    }
    rc = uv_read_start(reinterpret_cast<uv_stream_t*>(&self->tcp_), &Request::OnAlloc, &Request::OnRead);
    if (rc < 0) self->Finish(IoError(self->Prefix() + "cannot read: " + uv_strerror(rc)));
  }

  void Serialize() {
    std::string host = host_.find(':') != std::string::npos && host_.front() != '[' ? "[" + host_ + "]" : host_;
    out_ = req_.method + " " + req_.target + " HTTP/1.1\r\nHost: " + host + ":" + std::to_string(port_) +
           "\r\nConnection: close\r\n";
    bool has_length = false;
    for (const auto& h : req_.headers) {
      if (HeaderNameEquals(h.name, "Host") || HeaderNameEquals(h.name, "Connection")) continue;
      if (HeaderNameEquals(h.name, "Content-Length")) {
        has_length = true;
        continue;
      }
      out_ += h.name + ": " + h.value + "\r\n";
    }
    (void)has_length;  // always ours: a caller's length could disagree with the body
    if (!req_.body.empty() || req_.method == "POST" || req_.method == "PUT")
      out_ += "Content-Length: " + std::to_string(req_.body.size()) + "\r\n";
    out_ += "\r\n";
    out_ += req_.body;
  }

  static void OnWrite(uv_write_t* w, int status) {
    auto* self = static_cast<Request*>(w->data);
    if (self->finished_ || status == 0) return;
    // A server may answer and close before reading the whole request (413):
    // keep reading; what arrives decides. Only an unanswered failure is final.
    if (status == UV_EPIPE || status == UV_ECONNRESET) {
      self->write_failed_ = uv_strerror(status);
      return;
    }
    self->Finish(IoError(self->Prefix() + "cannot send the request: " + uv_strerror(status)));
  }

  static void OnAlloc(uv_handle_t* h, size_t, uv_buf_t* buf) {
    auto* self = static_cast<Request*>(h->data);
    buf->base = self->read_buf_;
    buf->len = sizeof(self->read_buf_);
  }

  static void OnRead(uv_stream_t* s, ssize_t n, const uv_buf_t* buf) {
    auto* self = static_cast<Request*>(s->data);
    if (self->finished_) return;
    if (n > 0) {
      self->Parse(buf->base, static_cast<size_t>(n));
      return;
    }
    if (n == 0) return;
    if (n == UV_EOF) {
      // Tells the parser the stream ended: completes an until-close body.
      // Any other state means the response was cut short (reported below).
      http_parser_execute(&self->parser_, ResponseSettings<Request>(), nullptr, 0);
      if (!self->finished_) {
        std::string why = self->got_bytes_ ? "the server closed the connection before the response was complete"
                                           : "the server closed the connection without answering";
        if (!self->write_failed_.empty()) why += " (sending failed: " + self->write_failed_ + ")";
        self->Finish(IoError(self->Prefix() + why));
      }
      return;
    }
    self->Finish(IoError(self->Prefix() + "connection broken: " + uv_strerror(static_cast<int>(n))));
  }

  void Parse(const char* data, size_t len) {
    got_bytes_ = got_bytes_ || len > 0;
    size_t used = http_parser_execute(&parser_, ResponseSettings<Request>(), data, len);
    if (finished_) return;
    if (HTTP_PARSER_ERRNO(&parser_) != HPE_OK || (len > 0 && used != len && !parser_.upgrade)) {
      if (fail_) {
        Error e = std::move(*fail_);
        fail_.reset();
        Finish(std::move(e));
        return;
      }
      auto err = HTTP_PARSER_ERRNO(&parser_);
      Finish(Corrupt(Prefix() + "malformed response: " + http_errno_description(err) + " (" +
                     http_errno_name(err) + ")"));
    }
  }

  // --- http-parser callbacks (return non-zero to stop) ---

  static Request* Self(http_parser* p) { return static_cast<Request*>(p->data); }

  static int OnHeaderField(http_parser* p, const char* at, size_t len) {
    Request* self = Self(p);
    if (self->in_value_ || self->resp_.headers.empty()) {
      self->resp_.headers.push_back({});
      self->in_value_ = false;
    }
    self->resp_.headers.back().name.append(at, len);
    return 0;
  }

  static int OnHeaderValue(http_parser* p, const char* at, size_t len) {
    Request* self = Self(p);
    if (self->resp_.headers.empty()) self->resp_.headers.push_back({});
    self->in_value_ = true;
    self->resp_.headers.back().value.append(at, len);
    return 0;
  }

  static int OnHeadersComplete(http_parser* p) {
    Request* self = Self(p);
    self->resp_.status = static_cast<int>(p->status_code);
    if (p->status_code >= 100 && p->status_code < 200) return 0;  // interim; the real answer follows
    for (const auto& h : self->resp_.headers) {
      if (HeaderNameEquals(h.name, "Content-Type") && h.value.rfind("text/event-stream", 0) == 0) self->sse_ = true;
    }
    if (self->req_.on_head) {
      HttpResponse head;
      head.status = self->resp_.status;
      head.headers = self->resp_.headers;
      self->req_.on_head(head);
      if (self->finished_) return 1;
    }
    if (self->req_.method == "HEAD") return 1;  // no body follows, whatever Content-Length says
    if (p->content_length != ULLONG_MAX && !self->Streaming() && p->content_length > self->req_.max_body_bytes) {
      self->fail_ = Refused(self->Prefix() + "the response body is " + std::to_string(p->content_length) +
                            " bytes, over the limit of " + std::to_string(self->req_.max_body_bytes));
      return -1;
    }
    return 0;
  }

  bool Streaming() const { return req_.on_data || (req_.on_event && sse_); }

  static int OnBody(http_parser* p, const char* at, size_t len) {
    Request* self = Self(p);
    if (p->status_code >= 100 && p->status_code < 200) return 0;
    std::string_view data(at, len);
    if (self->req_.on_event && self->sse_) {
      self->sse_parser_.Feed(data, [self](const ServerSentEvent& ev) {
        if (!self->finished_ && self->req_.on_event) self->req_.on_event(ev);
      });
      return self->finished_ ? -1 : 0;
    }
    if (self->req_.on_data) {
      self->req_.on_data(data);
      return self->finished_ ? -1 : 0;
    }
    if (self->resp_.body.size() + len > self->req_.max_body_bytes) {
      self->fail_ = Refused(self->Prefix() + "the response body passed the limit of " +
                            std::to_string(self->req_.max_body_bytes) + " bytes");
      return -1;
    }
    self->resp_.body.append(data);
    return 0;
  }

  static int OnMessageComplete(http_parser* p) {
    Request* self = Self(p);
    if (p->status_code >= 100 && p->status_code < 200 && p->status_code != 101) {
      self->resp_ = HttpResponse{};  // drop the interim response
      self->in_value_ = false;
      return 0;
    }
    HttpResponse r = std::move(self->resp_);
    self->Finish(std::move(r));
    return -1;  // stop: nothing after the response matters
  }

  HttpClient* client_;
  RequestId id_;
  std::string host_;
  int port_;
  ClientRequest req_;
  ResponseCallback done_;

  uv_tcp_t tcp_{};
  uv_timer_t timer_{};
  uv_connect_t connect_req_{};
  uv_write_t write_req_{};
  int open_handles_ = 0;
  bool closing_ = false;
  bool finished_ = false;
  std::optional<Error> pending_;
  std::optional<Error> fail_;  // set by a parser callback that stopped the parser
  std::string out_;
  std::string write_failed_;
  char read_buf_[64 * 1024];

  http_parser parser_{};
  HttpResponse resp_;
  bool in_value_ = false;
  bool got_bytes_ = false;
  bool sse_ = false;
  SseParser sse_parser_;
};

// ---------------------------------------------------------------------------

HttpClient::HttpClient(uv_loop_t* loop) : loop_(loop) {}

HttpClient::~HttpClient() {
  auto requests = std::move(requests_);
  requests_.clear();
  for (auto& [id, r] : requests) r->Abort();
}

HttpClient::RequestId HttpClient::Send(const std::string& host, int port, ClientRequest request,
                                       ResponseCallback done) {
  RequestId id = next_id_++;
  auto* r = new Request(this, id, host, port, std::move(request), std::move(done));
  requests_[id] = r;
  r->Start();
  return id;
}

bool HttpClient::Cancel(RequestId id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return false;
  Request* r = it->second;
  r->Finish(Unavailable(r->Prefix() + "cancelled"));
  return true;
}

void HttpClient::CancelAll() {
  std::vector<RequestId> ids;
  ids.reserve(requests_.size());
  for (const auto& [id, r] : requests_) ids.push_back(id);
  for (RequestId id : ids) Cancel(id);
}

}  // namespace wsup::http
