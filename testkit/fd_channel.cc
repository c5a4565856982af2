#include "testkit/fd_channel.h"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

namespace wsup::test {
namespace {

constexpr uint32_t kMagic = 0x77737570;  // "wsup"
constexpr size_t kMaxFds = 253;          // SCM_MAX_FD
constexpr uint64_t kMaxPayload = 1ull << 30;

struct Header {
  uint32_t magic;
  uint32_t nfds;
  uint64_t len;
};

Status WaitReadable(int sock, std::chrono::steady_clock::time_point deadline) {
  for (;;) {
    auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return Timeout("socket " + std::to_string(sock) + ": no message in time");
    struct pollfd p = {sock, POLLIN, 0};
    int r = ::poll(&p, 1, static_cast<int>(left.count()));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return ErrnoError("poll", errno);
    if (r > 0) return {};
  }
}

}  // namespace

Result<std::pair<UniqueFd, UniqueFd>> SocketPair() {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return ErrnoError("socketpair", errno);
  return std::make_pair(UniqueFd(sv[0]), UniqueFd(sv[1]));
}

Status SendMessage(int sock, const std::string& payload, const std::vector<int>& fds) {
  if (fds.size() > kMaxFds) return InvalidArgument("fd_channel: at most 253 fds per message");
  Header h{kMagic, static_cast<uint32_t>(fds.size()), payload.size()};
  struct iovec iov = {&h, sizeof h};
  struct msghdr msg = {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<char> control(CMSG_SPACE(sizeof(int) * kMaxFds), 0);
  if (!fds.empty()) {
    msg.msg_control = control.data();
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    struct cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  ssize_t n;
  do {
    n = ::sendmsg(sock, &msg, MSG_NOSIGNAL);
  } while (n < 0 && errno == EINTR);
  if (n != static_cast<ssize_t>(sizeof h)) return ErrnoError("fd_channel: sendmsg", n < 0 ? errno : EIO);
  size_t off = 0;
  while (off < payload.size()) {
    ssize_t w = ::send(sock, payload.data() + off, payload.size() - off, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return ErrnoError("fd_channel: send", errno);
    off += static_cast<size_t>(w);
  }
  return {};
}

Status RecvMessage(int sock, std::string* payload, std::vector<UniqueFd>* fds,
                   std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  Header h{};
  std::vector<char> control(CMSG_SPACE(sizeof(int) * kMaxFds), 0);
  struct iovec iov = {&h, sizeof h};
  struct msghdr msg = {};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control.data();
  msg.msg_controllen = control.size();
  WSUP_RETURN_IF_ERROR(WaitReadable(sock, deadline));
  ssize_t n;
  do {
    n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | MSG_WAITALL);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return ErrnoError("fd_channel: recvmsg", errno);
  if (n == 0) return IoError("fd_channel: the peer closed the socket");
  for (struct cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < k; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
        if (fds)
          fds->emplace_back(fd);
        else
          UniqueFd closer(fd);
      }
    }
  }
  if (n != static_cast<ssize_t>(sizeof h) || h.magic != kMagic || h.len > kMaxPayload) {
    return Corrupt("fd_channel: bad message header");
  }
  if (msg.msg_flags & MSG_CTRUNC) return Corrupt("fd_channel: fds were truncated");
  payload->assign(h.len, '\0');
  size_t off = 0;
  while (off < h.len) {
    WSUP_RETURN_IF_ERROR(WaitReadable(sock, deadline));
    ssize_t r = ::recv(sock, payload->data() + off, h.len - off, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return ErrnoError("fd_channel: recv", errno);
    if (r == 0) return IoError("fd_channel: the peer closed the socket mid-message");
    off += static_cast<size_t>(r);
  }
  return {};
}

}  // namespace wsup::test
