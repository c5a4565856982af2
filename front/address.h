// HostPort: the "HOST:PORT" strings the front is steered with (--listen,
// --active, --standby, set_routes), parsed once into a numeric socket
// address so that no request ever resolves a name.
//
// Only numeric addresses are accepted ("127.0.0.1:8001", "[::1]:8001"):
// the front talks to engines on the same node, and a DNS lookup on the
// request path would add latency and a failure mode for nothing.
//
// Plain values; any thread.
#pragma once

#include <sys/socket.h>

#include <string>
#include <string_view>

#include "common/status.h"

namespace wsup::front {

struct HostPort {
  std::string host;  // numeric, without brackets
  int port = 0;
  sockaddr_storage addr{};  // host and port as a socket address

  // "127.0.0.1:8001" or "[::1]:8001".
  std::string ToString() const;
};

// Parses "HOST:PORT". `what` names the flag or field in errors. A port of 0
// is accepted only when allow_port_zero (a listen address).
Result<HostPort> ParseHostPort(std::string_view text, std::string_view what, bool allow_port_zero = false);

// "HOST:PORT" of a bound socket (getsockname), for logs and status.
Result<HostPort> SocketName(int fd);

}  // namespace wsup::front
