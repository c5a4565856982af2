#include "tests/front/front_harness.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cstring>
#include <filesystem>

namespace wsup::test {

using nlohmann::json;
using SteadyClock = std::chrono::steady_clock;

namespace {
int MsLeft(SteadyClock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyClock::now()).count();
  return left < 0 ? 0 : static_cast<int>(left);
}
}  // namespace

ControlClient::~ControlClient() {
  if (fd_ >= 0) ::close(fd_);
}

bool ControlClient::Connect(const std::string& path) {
  fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd_ < 0) return false;
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (path.size() >= sizeof(a.sun_path)) return false;
  std::memcpy(a.sun_path, path.c_str(), path.size() + 1);
  return ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
}

bool ControlClient::SendRaw(std::string_view bytes) {
  size_t off = 0;
  while (off < bytes.size()) {
    ssize_t n = ::send(fd_, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

bool ControlClient::Send(const json& msg) {
  std::string body = msg.dump();
  auto n = static_cast<uint32_t>(body.size());
  std::string frame(4, '\0');
  for (int i = 0; i < 4; ++i) frame[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return SendRaw(frame + body);
}

bool ControlClient::Fill(size_t n, SteadyClock::time_point deadline) {
  while (buf_.size() < n) {
    if (eof_) return false;
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, MsLeft(deadline)) != 1) return false;
    char tmp[4096];
    ssize_t r = ::recv(fd_, tmp, sizeof(tmp), 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      eof_ = true;
      return false;
    }
    buf_.append(tmp, static_cast<size_t>(r));
  }
  return true;
}

std::optional<json> ControlClient::ReadMessage(SteadyClock::time_point deadline) {
  if (!Fill(4, deadline)) return std::nullopt;
  const auto* u = reinterpret_cast<const unsigned char*>(buf_.data());
  uint32_t n = u[0] | (u[1] << 8) | (u[2] << 16) | (static_cast<uint32_t>(u[3]) << 24);
  if (!Fill(4 + n, deadline)) return std::nullopt;
  json j = json::parse(buf_.substr(4, n), nullptr, false);
  buf_.erase(0, 4 + n);
  if (j.is_discarded()) return std::nullopt;
  return j;
}

std::optional<json> ControlClient::Reply(std::chrono::milliseconds limit) {
  auto deadline = SteadyClock::now() + limit;
  for (;;) {
    auto m = ReadMessage(deadline);
    if (!m) return std::nullopt;
    if (m->is_object() && m->value("type", "") == "event") {
      events_.push_back(*m);
      continue;
    }
    return m;
  }
}

std::optional<json> ControlClient::Call(const json& msg) {
  if (!Send(msg)) return std::nullopt;
  return Reply();
}

std::optional<json> ControlClient::WaitEvent(const std::string& kind, const std::string& field,
                                             const std::string& value, std::chrono::milliseconds limit) {
  auto deadline = SteadyClock::now() + limit;
  for (;;) {
    for (const auto& e : events_) {
      if (e.value("kind", "") != kind) continue;
      if (field.empty() || (e.contains(field) && e[field] == value)) return e;
    }
    auto m = ReadMessage(deadline);
    if (!m) return std::nullopt;
    if (m->is_object() && m->value("type", "") == "event") events_.push_back(*m);
  }
}

bool ControlClient::WaitClosed(std::chrono::milliseconds limit) {
  auto deadline = SteadyClock::now() + limit;
  while (!eof_) {
    if (!Fill(buf_.size() + 1, deadline) && !eof_) return false;
  }
  return true;
}

json SetRoutes(const std::string& active, const std::string& standby, int64_t epoch) {
  return {{"type", "set_routes"},
          {"active", active.empty() ? json(nullptr) : json(active)},
          {"standby", standby.empty() ? json(nullptr) : json(standby)},
          {"epoch", epoch}};
}

std::unique_ptr<FrontProcess> FrontProcess::Start(const std::vector<std::string>& args,
                                                  const std::vector<int>& extra_fds) {
  auto f = std::make_unique<FrontProcess>();
  f->control_ = f->dir_.Join("ctl.sock");
  f->log_ = f->dir_.Join("front.log");
  std::vector<std::string> argv = {BinPath("wsup-front"), "--control", f->control_};
  bool has_listen = false;
  for (const auto& a : args) has_listen = has_listen || a == "--listen" || a == "--listen-fd";
  if (!has_listen) {
    argv.push_back("--listen");
    argv.push_back("127.0.0.1:0");
  }
  argv.insert(argv.end(), args.begin(), args.end());
  f->child_ = Child::Start(argv, f->log_, extra_fds);
  bool up = WaitFor(
      [&] {
        std::string log = ReadAll(f->log_);
        size_t pos = log.find("listening on ");
        if (pos == std::string::npos) return false;
        size_t colon = log.find(':', pos + 13);
        size_t nl = log.find('\n', pos);
        if (colon == std::string::npos || nl == std::string::npos) return false;
        f->port_ = std::atoi(log.substr(colon + 1, nl - colon - 1).c_str());
        return f->port_ > 0;
      },
      std::chrono::seconds(10));
  INFO(ReadAll(f->log_));
  REQUIRE(up);
  return f;
}

RefusingPort::RefusingPort() {
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  socklen_t len = sizeof(a);
  ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
  port_ = ntohs(a.sin_port);
}

RefusingPort::~RefusingPort() {
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace wsup::test
