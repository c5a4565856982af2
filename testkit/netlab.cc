#include "testkit/netlab.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "testkit/test_util.h"

namespace wsup::test {

namespace {

constexpr const char* kIp = "/usr/sbin/ip";
constexpr const char* kPrefix = "wsupnl-";

Status Ip(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {kIp};
  argv.insert(argv.end(), args.begin(), args.end());
  RunResult r = Run(argv, std::chrono::seconds(20));
  if (r.exit_code != 0) {
    std::string cmd;
    for (const auto& a : argv) cmd += (cmd.empty() ? "" : " ") + a;
    return Error(Code::kUnavailable, "netlab: `" + cmd + "` exited " + std::to_string(r.exit_code) + ": " + r.output);
  }
  return Status::Ok();
}

// Where a failure cannot be returned (a destructor, a sweep): said on
// stderr, and what stays is the next Sweep()'s.
void Say(const Status& st) {
  if (!st.ok()) std::fprintf(stderr, "%s\n", st.error().message().c_str());
}

}  // namespace

Result<std::unique_ptr<NetLab>> NetLab::Create(int nodes) {
  if (nodes < 1 || nodes > 32) {
    return Error(Code::kInvalidArgument, "netlab: 1 to 32 nodes, not " + std::to_string(nodes));
  }
  if (::access(kIp, X_OK) != 0) {
    return Error(Code::kUnavailable, std::string("netlab: ") + kIp + " is missing; install iproute2");
  }
  Sweep();
  static std::atomic<int> labs{0};
  const int id = labs.fetch_add(1);
  const std::string base = kPrefix + std::to_string(::getpid()) + "-" + std::to_string(id) + "-";
  std::unique_ptr<NetLab> lab(new NetLab(id, base + "sw"));
  // The switch: a namespace with a bridge, so the host's namespace is
  // never touched.
  Status st = Ip({"netns", "add", lab->switch_});
  if (!st.ok()) {
    return Error(Code::kUnavailable, st.error().message() +
                                         "; making network namespaces needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN)");
  }
  WSUP_RETURN_IF_ERROR(Ip({"-n", lab->switch_, "link", "add", "br0", "type", "bridge"}));
  WSUP_RETURN_IF_ERROR(Ip({"-n", lab->switch_, "link", "set", "br0", "up"}));
  for (int i = 0; i < nodes; ++i) {
    const std::string node = base + "n" + std::to_string(i);
    WSUP_RETURN_IF_ERROR(Ip({"netns", "add", node}));
    lab->nodes_.push_back(node);
    const std::string port = "v" + std::to_string(i);
    WSUP_RETURN_IF_ERROR(
        Ip({"-n", lab->switch_, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", node}));
    WSUP_RETURN_IF_ERROR(Ip({"-n", lab->switch_, "link", "set", port, "master", "br0"}));
    WSUP_RETURN_IF_ERROR(Ip({"-n", lab->switch_, "link", "set", port, "up"}));
    WSUP_RETURN_IF_ERROR(Ip({"-n", node, "addr", "add", lab->addr(i) + "/24", "dev", "eth0"}));
    WSUP_RETURN_IF_ERROR(Ip({"-n", node, "link", "set", "eth0", "up"}));
    WSUP_RETURN_IF_ERROR(Ip({"-n", node, "link", "set", "lo", "up"}));
  }
  return lab;
}

NetLab::~NetLab() {
  // Deleting a namespace deletes its end of each veth pair, and so the pair.
  for (const auto& n : nodes_) Say(Ip({"netns", "delete", n}));
  Say(Ip({"netns", "delete", switch_}));
}

std::string NetLab::addr(int i) const { return "10.213.0." + std::to_string(i + 1); }

std::vector<std::string> NetLab::Command(int i, const std::vector<std::string>& argv) const {
  std::vector<std::string> out = {kIp, "netns", "exec", ns(i)};
  out.insert(out.end(), argv.begin(), argv.end());
  return out;
}

Status NetLab::Link(int i, bool up) {
  if (i < 0 || i >= nodes()) return Error(Code::kInvalidArgument, "netlab: no node " + std::to_string(i));
  return Ip({"-n", switch_, "link", "set", "v" + std::to_string(i), up ? "up" : "down"});
}

Status NetLab::Cut(int i) { return Link(i, false); }
Status NetLab::Heal(int i) { return Link(i, true); }

void NetLab::Sweep() {
  RunResult r = Run({kIp, "netns", "list"}, std::chrono::seconds(20));
  if (r.exit_code != 0) return;
  std::istringstream lines(r.output);
  std::string line;
  while (std::getline(lines, line)) {
    const std::string name = line.substr(0, line.find(' '));
    if (name.rfind(kPrefix, 0) != 0) continue;
    const pid_t pid = static_cast<pid_t>(std::atoi(name.c_str() + std::string(kPrefix).size()));
    if (pid > 0 && (::kill(pid, 0) == 0 || errno == EPERM)) continue;  // its test still runs
    Say(Ip({"netns", "delete", name}));
  }
}

}  // namespace wsup::test
