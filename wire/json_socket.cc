#include "wire/json_socket.h"

#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "common/unique_fd.h"

namespace wsup {

using nlohmann::json;

namespace {

// `words` with each "{key}" replaced by its value.
std::string Fill(const std::string& words, std::initializer_list<std::pair<const char*, std::string>> values) {
  std::string out = words;
  for (const auto& [key, value] : values) {
    std::string mark = std::string("{") + key + "}";
    for (size_t at = out.find(mark); at != std::string::npos; at = out.find(mark, at + value.size())) {
      out.replace(at, mark.size(), value);
    }
  }
  return out;
}

// True when something accepts connections on the socket at `path`.
bool SomeoneListens(const std::string& path) {
  UniqueFd probe(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!probe.valid()) return false;
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  std::strncpy(sa.sun_path, path.c_str(), sizeof sa.sun_path - 1);
  return ::connect(probe.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0;
}

// One read buffer for every connection on the thread: the decoder copies
// what it keeps, so nothing outlives the read callback.
void AllocShared(uv_handle_t*, size_t, uv_buf_t* buf) {
  static thread_local std::vector<char> shared(64 * 1024);
  *buf = uv_buf_init(shared.data(), static_cast<unsigned>(shared.size()));
}

}  // namespace

json TypedErrorReply(const std::string& message) { return json{{"type", "error"}, {"message", message}}; }

// ---------------------------------------------------------------- JsonConn

JsonConn::JsonConn(uv_loop_t* loop, uint32_t max_bytes)
    : JsonConn(loop, JsonConnOptions{.frames = FrameDialect{.max_bytes = max_bytes}}) {}

JsonConn::JsonConn(uv_loop_t* loop, JsonConnOptions options, std::string where)
    : options_(std::move(options)), where_(std::move(where)), pipe_(new uv_pipe_t), decoder_(options_.frames) {
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
  Hold();
  int rc = uv_read_start(reinterpret_cast<uv_stream_t*>(pipe_), &AllocShared, &JsonConn::OnRead);
  if (rc != 0) Close(uv_strerror(rc));
}

void JsonConn::OnRead(uv_stream_t* s, ssize_t n, const uv_buf_t* buf) {
  auto* c = static_cast<JsonConn*>(s->data);
  if (n == 0) return;
  auto keep = c->shared_from_this();
  if (n < 0) {
    c->Close(n == UV_EOF ? "peer closed" : uv_strerror(static_cast<int>(n)));
    return;
  }
  c->OnData(buf->base, static_cast<size_t>(n));
}

void JsonConn::OnData(const char* data, size_t len) {
  if (closing_after_write_) return;
  auto keep = shared_from_this();
  Status fed = decoder_.Feed(data, len);
  // Messages that came whole before a bad prefix are still handled, in order.
  for (;;) {
    auto next = decoder_.Next();
    if (!next.ok()) {
      if (!options_.answer_bad_messages || decoder_.failed()) {
        Refuse(next.error().message());
        return;
      }
      Send(options_.error_reply(next.error().message()));
      if (!alive() || closing_after_write_) return;
      continue;
    }
    if (!next->has_value()) break;
    if (on_message_) on_message_(keep, **next);
    if (!alive() || closing_after_write_) return;
  }
  if (!fed.ok()) Refuse(fed.error().message());
}

void JsonConn::Refuse(const std::string& why) {
  if (!options_.answer_bad_messages) {
    Close(why);
    return;
  }
  if (!options_.log_name.empty()) spdlog::warn("{}: dropping a client on {}: {}", options_.log_name, where_, why);
  SendAndClose(options_.error_reply(why), why);
}

void JsonConn::Send(const json& msg) {
  if (!alive() || closing_after_write_) return;
  auto frame = EncodeFrame(msg);
  if (!frame.ok()) {
    Close(frame.error().message());
    return;
  }
  if (options_.max_queued_bytes > 0 && queued_bytes_ + frame->size() > options_.max_queued_bytes) {
    if (!options_.log_name.empty()) {
      spdlog::warn("{}: a client on {} reads neither replies nor events ({} bytes queued); dropping it",
                   options_.log_name, where_, queued_bytes_);
    }
    Close("the peer reads nothing (" + std::to_string(queued_bytes_) + " bytes queued)");
    return;
  }
  struct Req {
    uv_write_t req;
    JsonConn* conn;
    std::string bytes;
  };
  Hold();  // the write callback needs this
  auto* r = new Req{{}, this, std::move(*frame)};
  queued_bytes_ += r->bytes.size();
  uv_buf_t b = uv_buf_init(r->bytes.data(), static_cast<unsigned>(r->bytes.size()));
  // Write callbacks run before the close callback, so `conn` is alive in them.
  int rc = uv_write(&r->req, reinterpret_cast<uv_stream_t*>(pipe_), &b, 1, [](uv_write_t* w, int status) {
    std::unique_ptr<Req> r(reinterpret_cast<Req*>(w));
    JsonConn* c = r->conn;
    c->queued_bytes_ -= r->bytes.size();
    if (c->closing_ || !c->pipe_) return;
    if (status < 0) {
      c->Close(uv_strerror(status));
    } else if (c->closing_after_write_ && c->queued_bytes_ == 0) {
      c->Close(c->close_why_);
    }
  });
  if (rc != 0) {
    queued_bytes_ -= r->bytes.size();
    delete r;
    Close(uv_strerror(rc));
  }
}

void JsonConn::SendAndClose(const json& msg, const std::string& why) {
  Send(msg);
  if (!alive() || closing_after_write_) return;
  closing_after_write_ = true;
  close_why_ = why;
  uv_read_stop(reinterpret_cast<uv_stream_t*>(pipe_));
  if (queued_bytes_ == 0) Close(why);
}

void JsonConn::Hold() {
  if (!self_) self_ = shared_from_this();
}

void JsonConn::Close(const std::string& why) {
  if (closing_ || !pipe_) return;
  closing_ = true;
  Hold();  // until the close callback
  auto cb = std::move(on_close_);
  // on_message_ may be running right now (Close() from inside a handler):
  // it is released in the close callback, not here.
  uv_close(reinterpret_cast<uv_handle_t*>(pipe_), [](uv_handle_t* h) {
    auto* c = static_cast<JsonConn*>(h->data);
    delete reinterpret_cast<uv_pipe_t*>(h);
    c->pipe_ = nullptr;
    c->on_message_ = nullptr;
    auto closed = std::move(c->on_handle_closed_);
    auto self = std::move(c->self_);  // may be the last reference to c
    self.reset();
    if (closed) closed();
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

// ---------------------------------------------------------------- JsonServer

// What is still open: the listener and every connection's handle. Close
// callbacks hold it, so they never touch a server that is gone.
struct JsonServer::Handles {
  size_t open = 0;
  bool closing = false;
  std::function<void()> done;
  void Closed() {
    --open;
    MaybeDone();
  }
  void MaybeDone() {
    if (!closing || open != 0 || !done) return;
    auto d = std::move(done);
    done = nullptr;
    d();
  }
};

namespace {

// The listening pipe (its data), the server it accepts for, and what its
// close callback must tell.
struct Listener {
  uv_pipe_t pipe;
  JsonServer* server;
  std::function<void()> closed;
};

void CloseListener(uv_pipe_t* p) {
  uv_close(reinterpret_cast<uv_handle_t*>(p), [](uv_handle_t* h) {
    std::unique_ptr<Listener> l(static_cast<Listener*>(h->data));
    auto closed = std::move(l->closed);
    l.reset();
    closed();
  });
}

}  // namespace

JsonServer::JsonServer(uv_loop_t* loop, std::string path, Handler handler, size_t max_clients, uint32_t max_bytes)
    : JsonServer(loop, std::move(path), std::move(handler),
                 JsonServerOptions{.conn = JsonConnOptions{.frames = FrameDialect{.max_bytes = max_bytes}},
                                   .max_clients = max_clients}) {}

JsonServer::JsonServer(uv_loop_t* loop, std::string path, Handler handler, JsonServerOptions options)
    : loop_(loop), path_(std::move(path)), handler_(std::move(handler)), options_(std::move(options)),
      handles_(std::make_shared<Handles>()) {}

JsonServer::~JsonServer() { Close(); }

std::string JsonServer::Words(const std::string& words, const std::string& why) const {
  return Fill(words, {{"path", path_},
                      {"why", why},
                      {"uid", std::to_string(::geteuid())},
                      {"max", std::to_string(sizeof(sockaddr_un::sun_path) - 1)}});
}

Status JsonServer::Listen() {
  if (listener_) return Internal(path_ + ": Listen() called twice");
  const JsonServerWords& w = options_.words;
  if (!w.path_too_long.empty() && (path_.empty() || path_.size() >= sizeof(sockaddr_un::sun_path))) {
    return InvalidArgument(Words(w.path_too_long));
  }
  // A stale socket file (nobody accepts) is replaced; a live one means another
  // process serves this path.
  struct stat st{};
  if (::lstat(path_.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) return InvalidArgument(Words(w.not_a_socket));
    if (SomeoneListens(path_)) return Refused(Words(w.in_use));
    ::unlink(path_.c_str());
  }
  auto* l = new Listener;
  uv_pipe_init(loop_, &l->pipe, 0);
  l->pipe.data = l;
  l->server = this;
  l->closed = [h = handles_] { h->Closed(); };
  ++handles_->open;
  mode_t old = ::umask(0177);
  int rc = uv_pipe_bind(&l->pipe, path_.c_str());
  ::umask(old);
  if (rc == 0) {
    ::chmod(path_.c_str(), 0600);
    rc = uv_listen(reinterpret_cast<uv_stream_t*>(&l->pipe), options_.backlog, &JsonServer::OnConnection);
  }
  if (rc != 0) {
    CloseListener(&l->pipe);
    return IoError(Words(w.cannot_listen, uv_strerror(rc)));
  }
  listener_ = &l->pipe;
  return Status::Ok();
}

void JsonServer::OnConnection(uv_stream_t* s, int status) {
  JsonServer* self = static_cast<Listener*>(s->data)->server;
  const std::string& log = self->options_.conn.log_name;
  if (status != 0) {
    if (!log.empty()) spdlog::warn("{}: accept error on {}: {}", log, self->path_, uv_strerror(status));
    return;
  }
  auto conn = std::make_shared<JsonConn>(self->loop_, self->options_.conn, self->path_);
  ++self->handles_->open;
  conn->on_handle_closed_ = [h = self->handles_] { h->Closed(); };
  int rc = uv_accept(s, reinterpret_cast<uv_stream_t*>(conn->pipe()));
  if (rc != 0) {
    if (!log.empty()) spdlog::warn("{}: accept on {} failed: {}", log, self->path_, uv_strerror(rc));
    conn->Close("accept failed");
    return;
  }
  conn->ReadPeerCred();
  if (self->options_.same_uid_only && conn->peer_uid() != ::geteuid()) {
    conn->SendAndClose(self->options_.conn.error_reply(self->Words(self->options_.words.foreign_uid)),
                       "foreign uid " + std::to_string(conn->peer_uid()));
    return;
  }
  if (self->conns_.size() >= self->options_.max_clients) {
    if (!log.empty()) {
      spdlog::warn("{}: more than {} clients on {}; refusing one", log, self->options_.max_clients, self->path_);
    }
    conn->SendAndClose(self->options_.conn.error_reply(self->Words(self->options_.words.too_many_clients)),
                       "too many clients");
    return;
  }
  self->conns_.insert(conn);
  std::weak_ptr<JsonConn> weak = conn;
  conn->Start([self](const std::shared_ptr<JsonConn>& c, const json& msg) { self->handler_(c, msg); },
              [self, weak](const std::string&) {
                if (auto c = weak.lock()) self->conns_.erase(c);
              });
}

void JsonServer::Broadcast(const json& msg) {
  std::vector<std::shared_ptr<JsonConn>> all(conns_.begin(), conns_.end());
  for (const auto& c : all) c->Send(msg);
}

void JsonServer::Close(std::function<void()> done) {
  if (done) handles_->done = std::move(done);
  handles_->closing = true;
  auto conns = conns_;
  for (const auto& c : conns) c->Close("server closing");
  conns_.clear();
  if (listener_) {
    CloseListener(listener_);
    listener_ = nullptr;
    ::unlink(path_.c_str());
  }
  handles_->MaybeDone();
}

}  // namespace wsup
