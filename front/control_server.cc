#include "front/control_server.h"

#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "front/control_frame.h"

namespace wsup::front {

namespace {

nlohmann::json ErrorReply(const std::string& message) { return {{"ok", false}, {"error", message}}; }

// True when something accepts connections on the socket at `path`.
bool SomeoneListens(const std::string& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path, path.c_str(), path.size() + 1);
  bool live = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  ::close(fd);
  return live;
}

}  // namespace

class ControlServer::Client {
 public:
  explicit Client(ControlServer* server) : server_(server) { pipe_.data = this; }

  bool Accept(uv_loop_t* loop, uv_stream_t* listener) {
    uv_pipe_init(loop, &pipe_, 0);
    int rc = uv_accept(listener, reinterpret_cast<uv_stream_t*>(&pipe_));
    if (rc < 0) {
      spdlog::warn("control: accept on {} failed: {}", server_->path(), uv_strerror(rc));
      return false;
    }
    return true;
  }

  void Start() {
    int rc = uv_read_start(reinterpret_cast<uv_stream_t*>(&pipe_), &Client::OnAlloc, &Client::OnRead);
    if (rc < 0) Close();
  }

  void Send(const nlohmann::json& msg) {
    if (closed_ || closing_after_write_) return;
    auto* w = new WriteReq;
    w->client = this;
    w->data = EncodeControlFrame(msg);
    if (queued_bytes_ + w->data.size() > kMaxQueuedBytes) {
      delete w;
      spdlog::warn("control: a client on {} reads neither replies nor events ({} bytes queued); dropping it",
                   server_->path(), queued_bytes_);
      Close();
      return;
    }
    queued_bytes_ += w->data.size();
    uv_buf_t buf = uv_buf_init(w->data.data(), static_cast<unsigned>(w->data.size()));
    int rc = uv_write(&w->req, reinterpret_cast<uv_stream_t*>(&pipe_), &buf, 1, &Client::OnWritten);
    if (rc < 0) {
      queued_bytes_ -= w->data.size();
      delete w;
      Close();
    }
  }

  // Sends a last reply, then closes once it is written.
  void SendAndClose(const nlohmann::json& msg) {
    Send(msg);
    if (closed_) return;
    closing_after_write_ = true;
    uv_read_stop(reinterpret_cast<uv_stream_t*>(&pipe_));
    if (queued_bytes_ == 0) Close();
  }

  void Close() {
    if (closed_) return;
    closed_ = true;
    uv_close(reinterpret_cast<uv_handle_t*>(&pipe_), [](uv_handle_t* h) {
      auto* self = static_cast<Client*>(h->data);
      ControlServer* server = self->server_;
      server->Forget(self);
      delete self;
      server->MaybeDone();
    });
  }

 private:
  struct WriteReq {
    uv_write_t req;
    Client* client;
    std::string data;
  };

  static void OnAlloc(uv_handle_t*, size_t, uv_buf_t* buf) {
    static thread_local std::vector<char> shared(16 * 1024);
    *buf = uv_buf_init(shared.data(), static_cast<unsigned>(shared.size()));
  }

  static void OnRead(uv_stream_t* s, ssize_t nread, const uv_buf_t* buf) {
    auto* self = static_cast<Client*>(s->data);
    if (nread == 0) return;
    if (nread < 0) {
      self->Close();
      return;
    }
    self->OnData(buf->base, static_cast<size_t>(nread));
  }

  static void OnWritten(uv_write_t* req, int status) {
    auto* w = reinterpret_cast<WriteReq*>(req);
    Client* self = w->client;
    self->queued_bytes_ -= w->data.size();
    delete w;
    if (self->closed_) return;
    if (status < 0 || (self->closing_after_write_ && self->queued_bytes_ == 0)) self->Close();
  }

  void OnData(const char* data, size_t len) {
    if (closing_after_write_) return;
    Status st = decoder_.Feed(data, len);
    // Complete messages before a bad prefix are still answered, in order.
    while (!closed_ && !closing_after_write_) {
      std::optional<std::string> body = decoder_.Next();
      if (!body) break;
      auto msg = ParseControlMessage(*body);
      if (!msg.ok()) {
        Send(ErrorReply(msg.error().message()));
        continue;
      }
      nlohmann::json reply;
      try {
        reply = server_->Handle(*msg);
      } catch (const std::exception& e) {
        reply = ErrorReply(std::string("control: internal error while handling the message: ") + e.what());
      }
      Send(reply);
    }
    if (!st.ok() && !closed_) {
      spdlog::warn("control: dropping a client on {}: {}", server_->path(), st.error().message());
      SendAndClose(ErrorReply(st.error().message()));
    }
  }

  ControlServer* server_;
  uv_pipe_t pipe_;
  ControlFrameDecoder decoder_;
  size_t queued_bytes_ = 0;
  bool closed_ = false;
  bool closing_after_write_ = false;
};

ControlServer::ControlServer(uv_loop_t* loop, std::string path, Handler handler)
    : loop_(loop), path_(std::move(path)), handler_(std::move(handler)) {}

ControlServer::~ControlServer() {
  // Handles point at this object: Close() must have finished first.
  if (listener_ != nullptr || !clients_.empty()) {
    spdlog::error("control: server on {} destroyed while open; call Close() and let the loop run", path_);
  }
}

Status ControlServer::Listen() {
  if (listener_) return Internal("control: Listen() called twice on " + path_);
  if (path_.empty() || path_.size() >= sizeof(sockaddr_un::sun_path)) {
    return InvalidArgument("control socket path '" + path_ + "' is empty or longer than " +
                           std::to_string(sizeof(sockaddr_un::sun_path) - 1) +
                           " bytes; pass a shorter --control path");
  }
  struct stat st {};
  if (::lstat(path_.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return InvalidArgument("control socket path " + path_ +
                             " exists and is not a socket; remove it or pass another --control path");
    }
    if (SomeoneListens(path_)) {
      return Refused("control socket " + path_ +
                     " is in use by a running process (another wsup-front?); stop it or pass another --control path");
    }
    ::unlink(path_.c_str());  // stale: left by a front that died
  }
  listener_ = new uv_pipe_t;
  uv_pipe_init(loop_, listener_, 0);
  listener_->data = this;
  listener_closed_ = false;
  // The socket is born 0600: no window in which another user could connect.
  mode_t old = ::umask(0177);
  int rc = uv_pipe_bind(listener_, path_.c_str());
  ::umask(old);
  if (rc == 0) {
    unlink_on_close_ = true;
    ::chmod(path_.c_str(), 0600);
    rc = uv_listen(reinterpret_cast<uv_stream_t*>(listener_), 16, &ControlServer::OnConnection);
  }
  if (rc < 0) {
    uv_close(reinterpret_cast<uv_handle_t*>(listener_), [](uv_handle_t* h) {
      auto* self = static_cast<ControlServer*>(h->data);
      delete reinterpret_cast<uv_pipe_t*>(h);
      self->listener_closed_ = true;
      self->MaybeDone();
    });
    listener_ = nullptr;
    return IoError("control: cannot listen on " + path_ + ": " + uv_strerror(rc) +
                   "; check that its directory exists and is writable, or pass another --control path");
  }
  return Status::Ok();
}

void ControlServer::OnConnection(uv_stream_t* listener, int status) {
  auto* self = static_cast<ControlServer*>(listener->data);
  if (status < 0) {
    spdlog::warn("control: accept error on {}: {}", self->path_, uv_strerror(status));
    return;
  }
  auto* c = new Client(self);
  self->clients_.insert(c);
  if (!c->Accept(self->loop_, listener) || self->closing_) {
    c->Close();
    return;
  }
  if (self->clients_.size() > kMaxClients) {
    spdlog::warn("control: more than {} clients on {}; refusing one", kMaxClients, self->path_);
    c->SendAndClose(ErrorReply("control: too many clients are connected to " + self->path_ +
                               "; close idle ones and retry"));
    return;
  }
  c->Start();
}

void ControlServer::Broadcast(const nlohmann::json& msg) {
  std::vector<Client*> all(clients_.begin(), clients_.end());
  for (Client* c : all) c->Send(msg);
}

void ControlServer::Close(std::function<void()> done) {
  if (done) done_ = std::move(done);
  closing_ = true;
  if (listener_) {
    uv_pipe_t* l = listener_;
    listener_ = nullptr;
    uv_close(reinterpret_cast<uv_handle_t*>(l), [](uv_handle_t* h) {
      auto* self = static_cast<ControlServer*>(h->data);
      delete reinterpret_cast<uv_pipe_t*>(h);
      self->listener_closed_ = true;
      self->MaybeDone();
    });
    if (unlink_on_close_) ::unlink(path_.c_str());
    unlink_on_close_ = false;
  }
  std::vector<Client*> all(clients_.begin(), clients_.end());
  for (Client* c : all) c->Close();
  MaybeDone();
}

void ControlServer::Forget(Client* c) { clients_.erase(c); }

void ControlServer::MaybeDone() {
  if (!closing_ || !listener_closed_ || !clients_.empty() || !done_) return;
  auto done = std::move(done_);
  done_ = nullptr;
  done();
}

}  // namespace wsup::front
