#include "supervisor/preflight.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#include <algorithm>
#include <cerrno>

#include "supervisor/process.h"

namespace wsup {

namespace {

// The socket address of host:port; host "localhost" is the loopback literal.
Result<std::pair<sockaddr_storage, socklen_t>> Resolve(const ListenAddress& addr, const std::string& key) {
  bool v6 = addr.ipv6();
  sockaddr_storage ss{};
  std::string host = addr.host == "localhost" ? (v6 ? "::1" : "127.0.0.1") : addr.host;
  if (v6) {
    auto* s6 = reinterpret_cast<sockaddr_in6*>(&ss);
    if (uv_ip6_addr(host.c_str(), addr.port, s6) != 0) {
      return InvalidArgument(key + " " + addr.ToString() + ": not an IPv6 address; use an address literal");
    }
    return std::make_pair(ss, static_cast<socklen_t>(sizeof *s6));
  }
  auto* s4 = reinterpret_cast<sockaddr_in*>(&ss);
  if (uv_ip4_addr(host.c_str(), addr.port, s4) != 0) {
    return InvalidArgument(key + " " + addr.ToString() + ": not an IPv4 address; use an address literal");
  }
  return std::make_pair(ss, static_cast<socklen_t>(sizeof *s4));
}

std::string Holders(int port) {
  auto owners = ListeningPortOwners(port);
  if (!owners.ok() || owners->empty()) return "another process";
  std::string s;
  for (pid_t p : *owners) s += (s.empty() ? "" : ", ") + DescribeProcess(p);
  return s;
}

}  // namespace

Result<UniqueFd> BindListenSocket(const ListenAddress& addr, const std::string& key, int* bound_port) {
  WSUP_ASSIGN_OR_RETURN(auto sa, Resolve(addr, key));
  UniqueFd fd(::socket(addr.ipv6() ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return ErrnoError("socket for " + key + " " + addr.ToString(), errno);
  int one = 1;
  if (::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0) {
    return ErrnoError(key + " " + addr.ToString() + ": setsockopt SO_REUSEADDR", errno);
  }
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&sa.first), sa.second) != 0) {
    int e = errno;
    if (e == EADDRINUSE) {
      return InvalidArgument(key + " = " + std::to_string(addr.port) + ": " + addr.ToString() + " is in use by " +
                             Holders(addr.port) +
                             "; another node or program listens there: give this node another port (0 lets the "
                             "kernel choose), or stop what holds it");
    }
    return ErrnoError(key + " " + addr.ToString() + ": cannot bind (is the address one of this machine's?)", e);
  }
  if (::listen(fd.get(), 1024) != 0) return ErrnoError(key + " " + addr.ToString() + ": listen", errno);
  sockaddr_storage got{};
  socklen_t glen = sizeof got;
  if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&got), &glen) != 0) {
    return ErrnoError(key + " " + addr.ToString() + ": getsockname", errno);
  }
  *bound_port = ntohs(addr.ipv6() ? reinterpret_cast<sockaddr_in6*>(&got)->sin6_port
                                  : reinterpret_cast<sockaddr_in*>(&got)->sin_port);
  return fd;
}

Status CheckPortsFree(const std::vector<PortClaim>& claims, const std::vector<int>& ours) {
  for (const auto& c : claims) {
    if (std::find(ours.begin(), ours.end(), c.port) != ours.end()) continue;
    int bound = 0;
    auto fd = BindListenSocket(ListenAddress{c.host, c.port}, c.key, &bound);
    if (!fd.ok()) return fd.error();
    // Closed at once: the engine binds it itself when it starts.
  }
  return Status::Ok();
}

Result<int> PickFreePort(const std::string& host) {
  int port = 0;
  WSUP_ASSIGN_OR_RETURN(UniqueFd fd, BindListenSocket(ListenAddress{host, 0}, "engine.host", &port));
  return port;
}

}  // namespace wsup
