#include "front/address.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <charconv>
#include <cstring>

namespace wsup::front {

std::string HostPort::ToString() const {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

Result<HostPort> ParseHostPort(std::string_view text, std::string_view what, bool allow_port_zero) {
  auto bad = [&](const std::string& why) {
    return InvalidArgument(std::string(what) + ": '" + std::string(text.substr(0, 100)) + "' " + why +
                           "; write a numeric address and port such as 127.0.0.1:8001 or [::1]:8001");
  };
  size_t colon = text.rfind(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == text.size()) return bad("has no HOST:PORT form");
  std::string_view host = text.substr(0, colon);
  std::string_view port_text = text.substr(colon + 1);
  if (host.front() == '[') {
    if (host.size() < 3 || host.back() != ']') return bad("has an unclosed '['");
    host = host.substr(1, host.size() - 2);
  } else if (host.find(':') != std::string_view::npos) {
    return bad("is an IPv6 address without brackets");
  }
  int port = -1;
  auto [end, ec] = std::from_chars(port_text.data(), port_text.data() + port_text.size(), port);
  if (ec != std::errc() || end != port_text.data() + port_text.size() || port < 0 || port > 65535) {
    return bad("has a port that is not a number from 1 to 65535");
  }
  if (port == 0 && !allow_port_zero) return bad("has port 0, which only a listen address may use");
  HostPort hp;
  hp.host = std::string(host);
  hp.port = port;
  if (hp.host.find(':') != std::string::npos) {
    auto* a6 = reinterpret_cast<sockaddr_in6*>(&hp.addr);
    a6->sin6_family = AF_INET6;
    a6->sin6_port = htons(static_cast<uint16_t>(port));
    if (inet_pton(AF_INET6, hp.host.c_str(), &a6->sin6_addr) != 1) return bad("is not a numeric IPv6 address");
  } else {
    auto* a4 = reinterpret_cast<sockaddr_in*>(&hp.addr);
    a4->sin_family = AF_INET;
    a4->sin_port = htons(static_cast<uint16_t>(port));
    if (inet_pton(AF_INET, hp.host.c_str(), &a4->sin_addr) != 1) return bad("is not a numeric IPv4 address");
  }
  return hp;
}

Result<HostPort> SocketName(int fd) {
  HostPort hp;
  socklen_t len = sizeof(hp.addr);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&hp.addr), &len) != 0) {
    return ErrnoError("getsockname on fd " + std::to_string(fd), errno);
  }
  char buf[INET6_ADDRSTRLEN] = {};
  if (hp.addr.ss_family == AF_INET6) {
    auto* a6 = reinterpret_cast<sockaddr_in6*>(&hp.addr);
    inet_ntop(AF_INET6, &a6->sin6_addr, buf, sizeof(buf));
    hp.port = ntohs(a6->sin6_port);
  } else if (hp.addr.ss_family == AF_INET) {
    auto* a4 = reinterpret_cast<sockaddr_in*>(&hp.addr);
    inet_ntop(AF_INET, &a4->sin_addr, buf, sizeof(buf));
    hp.port = ntohs(a4->sin_port);
  } else {
    return InvalidArgument("fd " + std::to_string(fd) +
                           " is not an IPv4 or IPv6 socket; pass a listening TCP socket with --listen-fd");
  }
  hp.host = buf;
  return hp;
}

}  // namespace wsup::front
