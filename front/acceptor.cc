#include "front/acceptor.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace wsup::front {

namespace {

// Connections taken per wake-up before the loop gets a turn for other work.
constexpr int kAcceptBatch = 64;
// Out of fds (or memory): accepting again at once would spin on the same error.
constexpr uint64_t kPauseMs = 100;

}  // namespace

Acceptor::Acceptor(uv_loop_t* loop, OnSocket on_socket) : loop_(loop), on_socket_(std::move(on_socket)) {}

Acceptor::~Acceptor() {
  if (open_handles_ != 0 || fd_ >= 0) spdlog::error("front: acceptor destroyed while open; Close() it first");
}

Status Acceptor::Listen(const std::string& host, int port, int backlog) {
  sockaddr_storage addr{};
  socklen_t len;
  if (host.find(':') != std::string::npos) {
    if (uv_ip6_addr(host.c_str(), port, reinterpret_cast<sockaddr_in6*>(&addr)) < 0)
      len = 0;
    else
      len = sizeof(sockaddr_in6);
  } else {
    if (uv_ip4_addr(host.c_str(), port, reinterpret_cast<sockaddr_in*>(&addr)) < 0)
      len = 0;
    else
      len = sizeof(sockaddr_in);
  }
  if (len == 0) {
    return InvalidArgument("--listen: '" + host +
                           "' is not a numeric IPv4 or IPv6 address; pass one such as "
                           "127.0.0.1 or ::1");
  }
  int fd = ::socket(addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return IoError(std::string("--listen: socket() failed: ") + std::strerror(errno));
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&addr), len) != 0) {
    int err = errno;
    ::close(fd);
    return IoError("--listen: cannot listen on " + host + ":" + std::to_string(port) + ": " +
                   std::strerror(err) +
                   "; pick another port (0 lets the kernel choose) or stop the process using it");
  }
  fd_ = fd;
  return Start(backlog);
}

Status Acceptor::Adopt(int fd, int backlog) {
  int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) {
    return IoError("--listen-fd " + std::to_string(fd) + ": " + std::strerror(errno) +
                   "; pass a bound, listening TCP socket");
  }
  ::fcntl(fd, F_SETFD, FD_CLOEXEC);
  fd_ = fd;
  return Start(backlog);
}

Status Acceptor::Start(int backlog) {
  if (::listen(fd_, backlog) != 0) {
    return IoError(std::string("cannot accept on the listening socket: ") + std::strerror(errno) +
                   "; pass a bound TCP socket");
  }
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return IoError(std::string("getsockname on the listening socket failed: ") + std::strerror(errno));
  }
  port_ = addr.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
                                     : ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  int rc = uv_poll_init(loop_, &poll_, fd_);
  if (rc < 0) return IoError(std::string("cannot watch the listening socket: ") + uv_strerror(rc));
  poll_.data = this;
  uv_timer_init(loop_, &pause_);
  pause_.data = this;
  open_handles_ = 2;
  started_ = true;
  uv_poll_start(&poll_, UV_READABLE, &Acceptor::OnPoll);
  return Status::Ok();
}

void Acceptor::OnPoll(uv_poll_t* p, int status, int) {
  auto* self = static_cast<Acceptor*>(p->data);
  if (status < 0) {
    spdlog::warn("front: the listening socket reports {}", uv_strerror(status));
    self->Pause();
    return;
  }
  self->OnReadable();
}

void Acceptor::OnReadable() {
  for (int i = 0; i < kAcceptBatch && !close_.closing(); ++i) {
    int fd = ::accept4(fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      ++accepted_;
      on_socket_(fd);
      continue;
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK) return;
    if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO) continue;
    // EMFILE, ENFILE, ENOBUFS, ENOMEM: connections wait in the backlog.
    int64_t now = static_cast<int64_t>(uv_now(loop_));
    if (now - last_warning_ms_ >= 10'000) {
      last_warning_ms_ = now;
      spdlog::warn(
          "front: cannot accept a connection: {}; pausing accepts for {} ms (raise the fd limit, "
          "or lower --max-connections)",
          std::strerror(errno), kPauseMs);
    }
    Pause();
    return;
  }
}

void Acceptor::Pause() {
  if (close_.closing()) return;
  uv_poll_stop(&poll_);
  uv_timer_start(
      &pause_,
      [](uv_timer_t* t) {
        auto* self = static_cast<Acceptor*>(t->data);
        if (!self->close_.closing()) uv_poll_start(&self->poll_, UV_READABLE, &Acceptor::OnPoll);
      },
      kPauseMs, 0);
}

void Acceptor::Close(std::function<void()> done) {
  if (!close_.Begin(std::move(done))) return;
  if (started_) {
    auto closed = [](uv_handle_t* h) {
      auto* self = static_cast<Acceptor*>(h->data);
      if (--self->open_handles_ == 0) {
        // The poll handle is gone: the fd can be closed now, not before.
        ::close(self->fd_);
        self->fd_ = -1;
        self->close_.Check();
      }
    };
    uv_close(reinterpret_cast<uv_handle_t*>(&poll_), closed);
    uv_close(reinterpret_cast<uv_handle_t*>(&pause_), closed);
    return;
  }
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  close_.Check();
}

}  // namespace wsup::front
