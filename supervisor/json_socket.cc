#include "supervisor/json_socket.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/unique_fd.h"

namespace wsup {

using nlohmann::json;

JsonConn::JsonConn(uv_loop_t* loop, uint32_t max_bytes) : pipe_(new uv_pipe_t), decoder_(max_bytes) {
  uv_pipe_init(loop, pipe_, 0);
  pipe_->data = this;
}

JsonConn::~JsonConn() = default;

void JsonConn::ReadPeerCred() {
  uv_os_fd_t fd;
  if (uv_fileno(reinterpret_cast<uv_handle_t*>(pipe_), &fd) != 0) return;
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
    peer_uid_ = cred.uid;
    peer_pid_ = cred.pid;
  }
}

void JsonConn::Start(MessageFn on_message, CloseFn on_close) {
  on_message_ = std::move(on_message);
  on_close_ = std::move(on_close);
  self_ = shared_from_this();
  uv_read_start(
      reinterpret_cast<uv_stream_t*>(pipe_),
      [](uv_handle_t*, size_t suggested, uv_buf_t* buf) {
        buf->base = new char[suggested];
        buf->len = suggested;
      },
      &JsonConn::OnRead);
}

void JsonConn::OnRead(uv_stream_t* s, ssize_t n, const uv_buf_t* buf) {
  auto* c = static_cast<JsonConn*>(s->data);
  std::unique_ptr<char[]> owned(buf->base);
  if (n == 0) return;
  auto keep = c->shared_from_this();
  if (n < 0) {
    c->Close(n == UV_EOF ? "peer closed" : uv_strerror(static_cast<int>(n)));
    return;
  }
  Status st = c->decoder_.Feed(buf->base, static_cast<size_t>(n));
  if (!st.ok()) {
    c->Close(st.error().message());
    return;
  }
  for (;;) {
    auto next = c->decoder_.Next();
    if (!next.ok()) {
      c->Close(next.error().message());
      return;
    }
    if (!next->has_value()) break;
    if (c->on_message_) c->on_message_(keep, **next);
    if (!c->alive()) return;
  }
}

void JsonConn::Send(const json& msg) {
  if (!alive()) return;
  auto frame = EncodeFrame(msg);
  if (!frame.ok()) {
    Close(frame.error().message());
    return;
  }
  struct Req {
    uv_write_t req;
    std::string bytes;
  };
  auto* r = new Req{{}, std::move(*frame)};
  uv_buf_t b = uv_buf_init(r->bytes.data(), static_cast<unsigned>(r->bytes.size()));
  int rc = uv_write(&r->req, reinterpret_cast<uv_stream_t*>(pipe_), &b, 1,
                    [](uv_write_t* w, int) { delete reinterpret_cast<Req*>(w); });
  if (rc != 0) {
    delete r;
    Close(uv_strerror(rc));
  }
}

void JsonConn::Close(const std::string& why) {
  if (closing_ || !pipe_) return;
  closing_ = true;
  auto cb = std::move(on_close_);
  // on_message_ may be running right now (Close() from inside a handler):
  // it is released in the close callback, not here.
  uv_close(reinterpret_cast<uv_handle_t*>(pipe_), [](uv_handle_t* h) {
    auto* c = static_cast<JsonConn*>(h->data);
    delete reinterpret_cast<uv_pipe_t*>(h);
    c->pipe_ = nullptr;
    c->on_message_ = nullptr;
    c->self_.reset();  // may delete c
  });
  if (cb) cb(why);
}

void JsonConn::Connect(uv_loop_t* loop, const std::string& path, uint32_t max_bytes,
                       std::function<void(Result<std::shared_ptr<JsonConn>>)> cb) {
  auto conn = std::make_shared<JsonConn>(loop, max_bytes);
  struct Req {
    uv_connect_t req;
    std::shared_ptr<JsonConn> conn;
    std::function<void(Result<std::shared_ptr<JsonConn>>)> cb;
    std::string path;
  };
  auto* r = new Req{{}, conn, std::move(cb), path};
  conn->self_ = conn;  // until the connect completes
  uv_pipe_connect(&r->req, conn->pipe_, path.c_str(), [](uv_connect_t* req, int status) {
    std::unique_ptr<Req> r(reinterpret_cast<Req*>(req));
    auto conn = r->conn;
    if (status != 0) {
      conn->Close("connect failed");
      r->cb(Error(Code::kUnavailable, r->path + ": cannot connect: " + uv_strerror(status)));
      return;
    }
    conn->self_.reset();
    r->cb(conn);
  });
}

JsonServer::JsonServer(uv_loop_t* loop, std::string path, Handler handler, size_t max_clients, uint32_t max_bytes)
    : loop_(loop), path_(std::move(path)), handler_(std::move(handler)), max_clients_(max_clients),
      max_bytes_(max_bytes) {}

JsonServer::~JsonServer() { Close(); }

Status JsonServer::Listen() {
  // A stale socket file (nobody accepts) is replaced; a live one means another
  // process serves this path.
  struct stat st{};
  if (::lstat(path_.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return InvalidArgument(path_ + ": exists and is not a socket; remove it or choose another runtime_dir");
    }
    UniqueFd probe(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_un sa{};
    sa.sun_family = AF_UNIX;
    std::strncpy(sa.sun_path, path_.c_str(), sizeof sa.sun_path - 1);
    if (::connect(probe.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0) {
      return Refused(path_ + ": another process is serving this socket (is a supervisor already running? "
                             "see `wsup status`)");
    }
    ::unlink(path_.c_str());
  }
  listener_ = new uv_pipe_t;
  uv_pipe_init(loop_, listener_, 0);
  listener_->data = this;
  mode_t old = ::umask(0177);
  int rc = uv_pipe_bind(listener_, path_.c_str());
  ::umask(old);
  if (rc == 0) rc = uv_listen(reinterpret_cast<uv_stream_t*>(listener_), 64, &JsonServer::OnConnection);
  if (rc != 0) {
    uv_close(reinterpret_cast<uv_handle_t*>(listener_), [](uv_handle_t* h) { delete reinterpret_cast<uv_pipe_t*>(h); });
    listener_ = nullptr;
    return IoError(path_ + ": cannot listen: " + uv_strerror(rc));
  }
  ::chmod(path_.c_str(), 0600);
  return Status::Ok();
}

void JsonServer::OnConnection(uv_stream_t* s, int status) {
  auto* self = static_cast<JsonServer*>(s->data);
  if (status != 0) return;
  auto conn = std::make_shared<JsonConn>(self->loop_, self->max_bytes_);
  if (uv_accept(s, reinterpret_cast<uv_stream_t*>(conn->pipe())) != 0) {
    conn->Close("accept failed");
    return;
  }
  conn->ReadPeerCred();
  if (conn->peer_uid() != ::geteuid()) {
    conn->Send(json{{"type", "error"},
                    {"message", "refused: this control socket accepts only uid " + std::to_string(::geteuid()) +
                                    "; run wsup as that user"}});
    conn->Close("foreign uid " + std::to_string(conn->peer_uid()));
    return;
  }
  if (self->conns_.size() >= self->max_clients_) {
    conn->Send(json{{"type", "error"}, {"message", "too many control clients; try again"}});
    conn->Close("too many clients");
    return;
  }
  self->conns_.insert(conn);
  std::weak_ptr<JsonConn> weak = conn;
  conn->Start([self](const std::shared_ptr<JsonConn>& c, const json& msg) { self->handler_(c, msg); },
              [self, weak](const std::string&) {
                if (auto c = weak.lock()) self->conns_.erase(c);
              });
}

void JsonServer::Close() {
  auto conns = conns_;
  for (const auto& c : conns) c->Close("server closing");
  conns_.clear();
  if (listener_) {
    uv_close(reinterpret_cast<uv_handle_t*>(listener_), [](uv_handle_t* h) { delete reinterpret_cast<uv_pipe_t*>(h); });
    listener_ = nullptr;
    ::unlink(path_.c_str());
  }
}

Result<json> JsonCall(const std::string& path, const json& request, int timeout_ms) {
  auto ch = Channel::Connect(path, timeout_ms);
  if (!ch.ok()) {
    struct stat st{};
    if (::stat(path.c_str(), &st) != 0) return Unavailable(path + ": no such control socket");
    return Unavailable(path + ": nothing accepts connections there");
  }
  auto reply = ch->Call(request, timeout_ms);
  if (!reply.ok()) return reply.error();
  return std::move(reply->msg);
}

}  // namespace wsup
