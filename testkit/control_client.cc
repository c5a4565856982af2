#include "testkit/control_client.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace wsup::test {

using nlohmann::json;
using Steady = std::chrono::steady_clock;

namespace {

int MsLeft(Steady::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Steady::now()).count();
  return left < 0 ? 0 : static_cast<int>(left);
}

Result<UniqueFd> ConnectUnix(const std::string& path) {
  sockaddr_un a{};
  if (path.size() >= sizeof(a.sun_path)) {
    return InvalidArgument(path + ": socket path too long (" + std::to_string(path.size()) + " bytes, at most " +
                           std::to_string(sizeof(a.sun_path) - 1) + "); use a shorter directory");
  }
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return IoError(std::string("socket: ") + std::strerror(errno));
  a.sun_family = AF_UNIX;
  std::memcpy(a.sun_path, path.c_str(), path.size() + 1);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    return Unavailable(path + ": cannot connect: " + std::strerror(errno) + "; is the process running?");
  }
  return fd;
}

Status SendAll(int fd, std::string_view bytes, const std::string& path) {
  size_t off = 0;
  while (off < bytes.size()) {
    ssize_t n = ::send(fd, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return IoError(path + ": send: " + std::strerror(errno));
    off += static_cast<size_t>(n);
  }
  return Status::Ok();
}

bool IsEvent(const json& m) { return m.is_object() && m.value("type", "") == "event"; }

}  // namespace

Status ControlClient::Connect(const std::string& path) {
  Close();
  path_ = path;
  auto fd = ConnectUnix(path);
  if (!fd.ok()) return fd.status();
  fd_ = std::move(*fd);
  return Status::Ok();
}

void ControlClient::Close() {
  fd_.Reset();
  decoder_ = FrameDecoder();
  eof_ = false;
}

Status ControlClient::SendRaw(std::string_view bytes) {
  if (!fd_.valid()) return Unavailable(path_ + ": not connected; call Connect() first");
  return SendAll(fd_.get(), bytes, path_);
}

Status ControlClient::Send(const json& msg) {
  auto frame = EncodeFrame(msg);
  if (!frame.ok()) return frame.status();
  return SendRaw(*frame);
}

Status ControlClient::Fill(Steady::time_point deadline) {
  if (eof_) return IoError(path_ + ": the peer closed the connection");
  for (;;) {
    pollfd p{fd_.get(), POLLIN, 0};
    int ready = ::poll(&p, 1, MsLeft(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready != 1) return Timeout(path_ + ": nothing arrived in time");
    char tmp[65536];
    ssize_t n = ::recv(fd_.get(), tmp, sizeof(tmp), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      eof_ = true;
      return IoError(path_ + ": the peer closed the connection");
    }
    return decoder_.Feed(tmp, static_cast<size_t>(n));
  }
}

Result<json> ControlClient::Next(Steady::time_point deadline) {
  if (!fd_.valid()) return Unavailable(path_ + ": not connected; call Connect() first");
  for (;;) {
    auto m = decoder_.Next();
    if (!m.ok()) return m.error();
    if (m->has_value()) return std::move(**m);
    if (Status s = Fill(deadline); !s.ok()) return s.error();
  }
}

Result<json> ControlClient::Reply(std::chrono::milliseconds limit) {
  auto deadline = Steady::now() + limit;
  for (;;) {
    auto m = Next(deadline);
    if (!m.ok()) return m.error();
    if (!IsEvent(*m)) return m;
    events_.push_back(std::move(*m));
  }
}

Result<json> ControlClient::Call(const json& msg, std::chrono::milliseconds limit) {
  if (!fd_.valid()) {
    if (path_.empty()) return Unavailable("a control client with no socket path; call Connect() first");
    if (Status s = Connect(path_); !s.ok()) return s.error();
  }
  if (Status s = Send(msg); !s.ok()) {
    Close();
    return s.error();
  }
  auto r = Reply(limit);
  if (!r.ok()) Close();  // the next call connects again
  return r;
}

Result<json> ControlClient::WaitEvent(const std::string& kind, const std::string& field, const std::string& value,
                                      std::chrono::milliseconds limit) {
  auto deadline = Steady::now() + limit;
  for (;;) {
    for (const auto& e : events_) {
      if (e.value("kind", "") != kind) continue;
      if (field.empty() || (e.contains(field) && e[field] == value)) return e;
    }
    auto m = Next(deadline);
    if (!m.ok()) return m.error();
    if (IsEvent(*m)) events_.push_back(std::move(*m));
  }
}

bool ControlClient::WaitClosed(std::chrono::milliseconds limit) {
  if (!fd_.valid()) return true;
  auto deadline = Steady::now() + limit;
  while (!eof_) {
    Status s = Fill(deadline);
    if (!s.ok() && !eof_ && s.code() == Code::kTimeout) return false;
    // A refused frame means nothing more can be read; only EOF ends this.
  }
  return true;
}

std::vector<json> ControlClient::TakeEvents() {
  std::vector<json> e = std::move(events_);
  events_.clear();
  return e;
}

Result<std::string> HaproxyCommand(const std::string& socket, const std::string& command,
                                   std::chrono::milliseconds limit) {
  auto fd = ConnectUnix(socket);
  if (!fd.ok()) return fd.error();
  if (Status s = SendAll(fd->get(), command + "\n", socket); !s.ok()) return s.error();
  auto deadline = Steady::now() + limit;
  std::string out;
  for (;;) {
    pollfd p{fd->get(), POLLIN, 0};
    int ready = ::poll(&p, 1, MsLeft(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready != 1) return Timeout(socket + ": '" + command + "' got no complete answer in time");
    char tmp[65536];
    ssize_t n = ::recv(fd->get(), tmp, sizeof(tmp), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return out;  // HAProxy closes after one command
    out.append(tmp, static_cast<size_t>(n));
  }
}

}  // namespace wsup::test
