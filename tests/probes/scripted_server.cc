#include "tests/probes/scripted_server.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <memory>

namespace wsup::test {

std::string RawResponse(int status, const std::string& body, const std::string& content_type) {
  return "HTTP/1.1 " + std::to_string(status) + " X\r\nContent-Type: " + content_type +
         "\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

class ScriptedServer::Conn {
 public:
  explicit Conn(ScriptedServer* server) : server_(server) {
    tcp_.data = this;
    timer_.data = this;
  }

  bool Accept(uv_stream_t* listener) {
    uv_tcp_init(server_->loop(), &tcp_);
    uv_timer_init(server_->loop(), &timer_);
    open_ = 2;
    if (uv_accept(listener, reinterpret_cast<uv_stream_t*>(&tcp_)) != 0) return false;
    uv_read_start(reinterpret_cast<uv_stream_t*>(&tcp_), &Conn::OnAlloc, &Conn::OnRead);
    return true;
  }

  void Close(bool reset = false) {
    if (closing_) return;
    closing_ = true;
    uv_close(reinterpret_cast<uv_handle_t*>(&timer_), &Conn::OnClosed);
    if (reset) {
      uv_tcp_close_reset(&tcp_, &Conn::OnClosed);
    } else {
      uv_close(reinterpret_cast<uv_handle_t*>(&tcp_), &Conn::OnClosed);
    }
  }

 private:
  static void OnAlloc(uv_handle_t* h, size_t, uv_buf_t* buf) {
    auto* self = static_cast<Conn*>(h->data);
    buf->base = self->buf_;
    buf->len = sizeof(self->buf_);
  }

  static void OnRead(uv_stream_t* s, ssize_t n, const uv_buf_t* buf) {
    auto* self = static_cast<Conn*>(s->data);
    if (self->closing_) return;
    if (n < 0) {
      self->Close();
      return;
    }
    std::vector<http::HttpRequest> done;
    if (!self->parser_.Feed(buf->base, static_cast<size_t>(n), &done)) {
      self->Close();
      return;
    }
    for (auto& r : done) {
      if (self->answering_) continue;  // one scripted answer per connection
      self->answering_ = true;
      self->reply_ = self->server_->Handle(r);
      if (self->reply_.hang) return;
      self->Next();
    }
  }

  // Writes the next piece now, or after the delay.
  void Next() {
    if (closing_) return;
    if (next_ >= reply_.pieces.size()) {
      Finish();
      return;
    }
    auto* w = new Write{std::move(reply_.pieces[next_++]), {}, this};
    w->req.data = w;
    uv_buf_t b = uv_buf_init(w->data.data(), static_cast<unsigned>(w->data.size()));
    if (uv_write(&w->req, reinterpret_cast<uv_stream_t*>(&tcp_), &b, 1, &Conn::OnWritten) != 0) {
      delete w;
      Close();
      return;
    }
    ++writes_;
  }

  struct Write {
    std::string data;
    uv_write_t req;
    Conn* conn;
  };

  static void OnWritten(uv_write_t* req, int status) {
    auto* w = static_cast<Write*>(req->data);
    Conn* self = w->conn;
    delete w;
    --self->writes_;
    if (self->closing_) return;
    if (status < 0) {
      self->Close();
      return;
    }
    if (self->reply_.piece_delay_ms > 0 && self->next_ < self->reply_.pieces.size()) {
      uv_timer_start(&self->timer_, [](uv_timer_t* t) { static_cast<Conn*>(t->data)->Next(); },
                     static_cast<uint64_t>(self->reply_.piece_delay_ms), 0);
    } else {
      self->Next();
    }
  }

  void Finish() {
    switch (reply_.after) {
      case ScriptedReply::After::kClose: Close(); break;
      case ScriptedReply::After::kReset: Close(true); break;
      case ScriptedReply::After::kKeepOpen: break;
    }
  }

  static void OnClosed(uv_handle_t* h) {
    auto* self = static_cast<Conn*>(h->data);
    if (--self->open_ == 0) {
      ScriptedServer* server = self->server_;
      server->Forget(self);
      delete self;
    }
  }

  ScriptedServer* server_;
  uv_tcp_t tcp_{};
  uv_timer_t timer_{};
  int open_ = 0;
  int writes_ = 0;
  bool closing_ = false;
  bool answering_ = false;
  size_t next_ = 0;
  ScriptedReply reply_;
  http::RequestParser parser_;
  char buf_[16 * 1024];
};

ScriptedServer::ScriptedServer(uv_loop_t* loop, Handler handler) : loop_(loop), handler_(std::move(handler)) {}

ScriptedServer::~ScriptedServer() {
  // Close() must have run and the loop turned; a leak here is the test's bug.
}

Status ScriptedServer::Listen() {
  listener_ = new uv_tcp_t{};
  listener_->data = this;
  uv_tcp_init(loop_, listener_);
  listener_open_ = true;
  sockaddr_in addr{};
  uv_ip4_addr("127.0.0.1", 0, &addr);
  int rc = uv_tcp_bind(listener_, reinterpret_cast<const sockaddr*>(&addr), 0);
  if (rc == 0) rc = uv_listen(reinterpret_cast<uv_stream_t*>(listener_), 64, &ScriptedServer::OnConnection);
  if (rc != 0) return IoError(std::string("scripted server: listen: ") + uv_strerror(rc));
  sockaddr_storage bound{};
  int len = sizeof bound;
  uv_tcp_getsockname(listener_, reinterpret_cast<sockaddr*>(&bound), &len);
  port_ = ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  return Status::Ok();
}

void ScriptedServer::OnConnection(uv_stream_t* s, int status) {
  auto* self = static_cast<ScriptedServer*>(s->data);
  if (status < 0 || self->closing_) return;
  auto* c = new Conn(self);
  self->conns_.insert(c);
  ++self->accepted_;
  if (!c->Accept(s)) c->Close();
}

void ScriptedServer::Forget(Conn* c) {
  conns_.erase(c);
  MaybeDone();
}

void ScriptedServer::Close(std::function<void()> done) {
  closing_ = true;
  done_ = std::move(done);
  if (listener_) {
    uv_close(reinterpret_cast<uv_handle_t*>(listener_), [](uv_handle_t* h) {
      auto* self = static_cast<ScriptedServer*>(h->data);
      delete reinterpret_cast<uv_tcp_t*>(h);
      self->listener_open_ = false;
      self->MaybeDone();
    });
    listener_ = nullptr;
  }
  auto conns = conns_;
  for (Conn* c : conns) c->Close();
  MaybeDone();
}

void ScriptedServer::MaybeDone() {
  if (closing_ && !listener_open_ && conns_.empty() && done_) {
    auto done = std::move(done_);
    done_ = nullptr;
    done();
  }
}

int UnusedPort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

bool RunUntil(uv_loop_t* loop, const std::function<bool()>& cond, int64_t limit_ms) {
  bool expired = false;
  uv_timer_t guard;
  uv_timer_init(loop, &guard);
  guard.data = &expired;
  uv_timer_start(&guard, [](uv_timer_t* t) { *static_cast<bool*>(t->data) = true; },
                 static_cast<uint64_t>(limit_ms), 0);
  while (!cond() && !expired) uv_run(loop, UV_RUN_ONCE);
  uv_close(reinterpret_cast<uv_handle_t*>(&guard), nullptr);
  uv_run(loop, UV_RUN_NOWAIT);  // lets the guard's close finish before it leaves scope
  return cond();
}

int CloseLoop(uv_loop_t* loop) {
  uv_run(loop, UV_RUN_NOWAIT);
  // Anything still open is a leak of the code under test; count and close it
  // so the test can assert zero.
  int open = 0;
  uv_walk(loop, [](uv_handle_t* h, void* arg) {
    if (!uv_is_closing(h)) {
      ++*static_cast<int*>(arg);
      uv_close(h, nullptr);
    }
  }, &open);
  uv_run(loop, UV_RUN_DEFAULT);
  int rc = uv_loop_close(loop);
  return open > 0 ? -open : rc;
}

}  // namespace wsup::test
