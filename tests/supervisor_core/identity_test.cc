// What the supervisor uses to know its own processes from others: who
// listens on a port, whether a process group holds a listening socket, a
// process's run state; the port preflight; and `wsup stop`'s search for
// what a dead supervisor left. Real processes, real sockets, loopback only.
#include <catch2/catch.hpp>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>

#include "supervisor/preflight.h"
#include "supervisor/process.h"
#include "supervisor/runtime_state.h"
#include "testkit/test_util.h"

namespace wsup {
namespace {

using namespace std::chrono_literals;

struct Listener {
  int fd = -1;
  int port = 0;
  Listener() {
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(fd, 4) == 0);
    socklen_t len = sizeof a;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
  }
  ~Listener() { ::close(fd); }
};

// A child (its own session, via SpawnChild) that listens on a kernel-chosen
// loopback port, in itself or in a grandchild, and prints the port.
struct ListeningChild {
  test::TempDir dir;
  pid_t pid = 0;
  int port = 0;
  explicit ListeningChild(bool in_grandchild) {
    std::string py =
        "import socket,time; s=socket.socket(); s.bind(('127.0.0.1',0)); s.listen(); "
        "print(s.getsockname()[1], flush=True); time.sleep(120)";
    ChildSpec spec;
    spec.argv = in_grandchild ? std::vector<std::string>{"/bin/sh", "-c", "python3 -c \"" + py + "\" & wait"}
                              : std::vector<std::string>{"python3", "-c", py};
    spec.log_path = dir.Join("out.log");
    auto p = SpawnChild(spec);
    REQUIRE(p.ok());
    pid = *p;
    REQUIRE(test::WaitFor([&] { return !test::ReadAll(spec.log_path).empty(); }, 20s));
    port = std::atoi(test::ReadAll(spec.log_path).c_str());
    REQUIRE(port > 0);
  }
  ~ListeningChild() {
    ::kill(-pid, SIGKILL);
    int st = 0;
    ::waitpid(pid, &st, 0);
  }
};

TEST_CASE("identity: the process group that listens on a port is known by its socket, another is not") {
  for (bool grandchild : {false, true}) {
    INFO((grandchild ? "listening in a grandchild" : "listening in the child"));
    ListeningChild c(grandchild);
    Listener ours;
    auto yes = GroupListensOn(c.pid, c.port);
    REQUIRE(yes.ok());
    CHECK(*yes);
    // A port someone else (this test) listens on is not the child's.
    auto no = GroupListensOn(c.pid, ours.port);
    REQUIRE(no.ok());
    CHECK_FALSE(*no);
    auto owners = ListeningPortOwners(ours.port);
    REQUIRE(owners.ok());
    CHECK(std::find(owners->begin(), owners->end(), ::getpid()) != owners->end());
    auto child_owners = ListeningPortOwners(c.port);
    REQUIRE(child_owners.ok());
    CHECK(child_owners->size() == 1);
    CHECK(DescribeProcess(::getpid()).find(std::to_string(::getpid())) != std::string::npos);
  }
  CHECK_FALSE(GroupListensOn(1, 80).ok());  // never the init process's group
  CHECK_FALSE(ListeningPortOwners(70000).ok());
}

TEST_CASE("identity: a stopped process shows as stopped, a gone one as not found") {
  ListeningChild c(false);
  REQUIRE(::kill(c.pid, SIGSTOP) == 0);
  CHECK(test::WaitFor([&] { auto s = ProcessRunState(c.pid); return s.ok() && *s == 'T'; }, 5s));
  ::kill(c.pid, SIGCONT);
  CHECK(test::WaitFor([&] { auto s = ProcessRunState(c.pid); return s.ok() && *s != 'T'; }, 5s));
  CHECK(ProcessRunState(999999999).error().code() == Code::kNotFound);
}

TEST_CASE("preflight: a port in use is refused with its key, its holder and the fix - a free one passes") {
  Listener held;
  auto st = CheckPortsFree({{"engine.primary_port", "127.0.0.1", held.port}}, {});
  REQUIRE_FALSE(st.ok());
  CHECK(st.error().code() == Code::kInvalidArgument);
  std::string m = st.error().message();
  INFO(m);
  CHECK(m.find("engine.primary_port = " + std::to_string(held.port)) != std::string::npos);
  CHECK(m.find("in use by pid " + std::to_string(::getpid())) != std::string::npos);
  CHECK(m.find("another port") != std::string::npos);
  // The node's own (adopted) engine's port is not in the way.
  CHECK(CheckPortsFree({{"engine.primary_port", "127.0.0.1", held.port}}, {held.port}).ok());
  int free_port = 0;
  {
    Listener gone;
    free_port = gone.port;
  }
  CHECK(CheckPortsFree({{"engine.standby_port", "127.0.0.1", free_port}}, {}).ok());
  auto bad = BindListenSocket(ListenAddress{"not-an-address", 1}, "front.listen", &free_port);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().message().find("front.listen") != std::string::npos);
}

RuntimeState StateNaming(pid_t supervisor, pid_t engine) {
  RuntimeState st;
  st.config_path = "/x.toml";
  st.node_name = "leftovers";
  st.supervisor = ProcessRef{supervisor, 1};  // start time 1: not a live process
  auto ref = ProcessRef::Of(engine);
  REQUIRE(ref.ok());
  st.engines.push_back({"a", *ref, 1234, "active", 0, "hit", "nonce"});
  return st;
}

TEST_CASE("leftovers: what a dead supervisor left is stopped through the runtime dir, then the file goes") {
  test::TempDir run;
  ListeningChild engine(false);
  REQUIRE(StateNaming(999999999, engine.pid).Save(RuntimeState::PathIn(run.path())).ok());
  auto r = StopLeftovers(run.path(), 5000);
  REQUIRE(r.ok());
  REQUIRE(r->size() == 1);
  CHECK((*r)[0].find("engine a pid " + std::to_string(engine.pid)) != std::string::npos);
  int st = 0;
  CHECK(::waitpid(engine.pid, &st, 0) == engine.pid);
  CHECK(test::ReadAll(RuntimeState::PathIn(run.path())).empty());
  // Nothing left: nothing to stop, no error.
  auto again = StopLeftovers(run.path(), 1000);
  REQUIRE(again.ok());
  CHECK(again->empty());
}

TEST_CASE("leftovers: a supervisor that still runs is not bypassed") {
  test::TempDir run;
  ListeningChild sup(false);
  ListeningChild engine(false);
  RuntimeState st = StateNaming(sup.pid, engine.pid);
  auto ref = ProcessRef::Of(sup.pid);
  REQUIRE(ref.ok());
  st.supervisor = *ref;
  REQUIRE(st.Save(RuntimeState::PathIn(run.path())).ok());
  auto r = StopLeftovers(run.path(), 1000);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message().find("does not answer") != std::string::npos);
  CHECK(::kill(engine.pid, 0) == 0);  // untouched
}

TEST_CASE("leftovers: a damaged state file is an error that says what to do") {
  test::TempDir run;
  {
    FILE* f = std::fopen(RuntimeState::PathIn(run.path()).c_str(), "w");
    std::fputs("{not json", f);
    std::fclose(f);
  }
  auto r = StopLeftovers(run.path(), 1000);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().message().find("remove the file") != std::string::npos);
}

}  // namespace
}  // namespace wsup
