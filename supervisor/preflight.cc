#include "supervisor/preflight.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <uv.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/fs.h"
#include "common/log.h"
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

Status CheckEnginePorts(const Config& cfg, const std::optional<RuntimeState>& prev) {
  std::vector<int> ours;
  if (prev) {
    for (const auto& e : prev->engines) {
      if (e.proc.StillRunning()) ours.push_back(e.port);
    }
  }
  std::vector<PortClaim> claims;
  if (cfg.engine.primary_port != 0) claims.push_back({"engine.primary_port", cfg.engine.host, cfg.engine.primary_port});
  if (cfg.engine.standby_port != 0) claims.push_back({"engine.standby_port", cfg.engine.host, cfg.engine.standby_port});
  return CheckPortsFree(claims, ours);
}

Status CheckNodePaths(const Config& cfg, const std::string& holder) {
  // A missing model folder or engine program, a tp the model cannot be
  // split by, an unusable state folder: said once, located, before
  // anything is made or started.
  auto problems = CheckConfigPaths(cfg, holder);
  if (problems.empty()) return Status::Ok();
  std::string all;
  for (const auto& e : problems) all += (all.empty() ? "" : "\n") + e.message();
  return InvalidArgument(all);
}

Status PrepareNodeDirs(const Config& cfg) {
  // Checked before (CheckConfigPaths); a folder that still cannot be made
  // (another process changed it meanwhile) is a configuration that cannot
  // work all the same: exit 78, located at its key, never a restart loop.
  auto located = [&cfg](const char* key, const Status& st) -> Status {
    if (st.ok()) return st;
    auto where = cfg.where.find(key);
    return InvalidArgument((where == cfg.where.end() ? cfg.path + ":1:1" : where->second) + ": " + key + ": " +
                           st.error().message() + "; choose a folder this user can write");
  };
  // The ledger and the logs hold what the node did (and engine.env's names):
  // no other local user may read them.
  const std::string logs = JoinPath(cfg.node.state_dir, "logs");
  for (const auto& [dir, what] : {std::pair{cfg.node.state_dir, std::string("node.state_dir")},
                                  std::pair{logs, std::string("node.state_dir (its logs folder)")}}) {
    auto tightened = MakePrivateDir(dir, what);
    if (!tightened.ok()) return located("node.state_dir", Status(tightened.error()));
    if (*tightened) spdlog::warn("{} {}: other users could read it; made it private (mode 0700)", what, dir);
  }
  WSUP_RETURN_IF_ERROR(located("node.runtime_dir", MakeDirs(cfg.node.runtime_dir, 0700)));
  if (::chmod(cfg.node.runtime_dir.c_str(), 0700) != 0) {
    return located("node.runtime_dir", ErrnoError(cfg.node.runtime_dir + ": cannot make it private (chmod 0700)", errno));
  }
  return Status::Ok();
}

void RaiseOpenFileLimit() {
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur >= lim.rlim_max) return;
  lim.rlim_cur = lim.rlim_max;
  if (::setrlimit(RLIMIT_NOFILE, &lim) != 0) {
    spdlog::warn("cannot raise the open-file limit ({}); fewer engine-made layouts can be kept across a holder crash",
                 strerror(errno));
  }
}

}  // namespace wsup
