// FrontLink (supervisor/front_link.h) on its own: fake processes and fake
// timers, a real loop, and an in-process JSON server standing in for the
// front's control socket. Each row of the front's table (child_fsm.h) is
// driven here and its effect checked: what is spawned, signalled, sent over
// the link, and told to the owner through the hooks.
#include <catch2/catch.hpp>
#include <signal.h>

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "supervisor/front_link.h"
#include "tests/supervisor_core/logic_rig.h"
#include "wire/json_socket.h"

namespace wsup {
namespace {

using logic::FakeProcs;
using logic::FakeTimers;
using nlohmann::json;

// The front's side of the control socket: what the supervisor sent, and the
// connection to answer on or close.
struct FakeFrontSocket {
  FakeFrontSocket(uv_loop_t* loop, const std::string& path)
      : server(loop, path, [this](const std::shared_ptr<JsonConn>& c, const json& m) {
          conn = c;
          got.push_back(m);
          if (m.value("type", "") == "status" && status_reply) c->Send(*status_reply);
        }) {}
  ~FakeFrontSocket() { server.Close(); }
  std::vector<json> Of(const std::string& type) const {
    std::vector<json> out;
    for (const auto& m : got) {
      if (m.value("type", "") == type) out.push_back(m);
    }
    return out;
  }
  JsonServer server;
  std::shared_ptr<JsonConn> conn;
  std::vector<json> got;
  std::optional<json> status_reply;
};

struct FrontRig : logic::PartRig {
  // What the hooks were told.
  bool stopping = false;
  int saves = 0, exits = 0, crash_loops = 0;
  std::vector<std::string> fatal, down;
  std::vector<FrontMessage> messages;
  FrontLink::Routes wanted{"127.0.0.1:7001", "127.0.0.1:7002"};
  std::vector<ChildSpec> specs;
  std::unique_ptr<FrontLink> front;
  std::unique_ptr<FakeFrontSocket> sock;

  FrontRig() {
    cfg.front.listen = ListenAddress{"127.0.0.1", 0};
    procs.on_spawn = [this](pid_t, const std::string&, const ChildSpec& spec) { specs.push_back(spec); };
    FrontLink::Hooks h;
    h.stopping = [this] { return stopping; };
    h.fatal = [this](const std::string& why) { fatal.push_back(why); };
    h.save_state = [this] { saves++; };
    h.down = [this](const std::string& why) { down.push_back(why); };
    h.crash_looping = [this] { crash_loops++; };
    h.routes = [this] { return wanted; };
    h.message = [this](const FrontMessage& m) { messages.push_back(m); };
    h.exited = [this] { exits++; };
    front = std::make_unique<FrontLink>(&loop, procs, timers, clock, cfg, dir.path(), std::move(h));
  }
  ~FrontRig() {
    front.reset();
    sock.reset();
  }
  std::string SocketPath() const { return dir.Join("front.sock"); }
  void Listen() {
    sock = std::make_unique<FakeFrontSocket>(&loop, SocketPath());
    REQUIRE(sock->server.Listen().ok());
  }
  bool Ready() { return Until([&] { return front->state() == ChildState::kReady; }); }
  // Binds, listens as the front, starts it and waits until it is linked.
  void StartLinked() {
    REQUIRE(front->Bind().ok());
    Listen();
    front->Start();
    REQUIRE(Ready());
  }
};

bool HasArg(const ChildSpec& spec, const std::string& flag, const std::string& value) {
  for (size_t i = 0; i + 1 < spec.argv.size(); ++i) {
    if (spec.argv[i] == flag && spec.argv[i + 1] == value) return true;
  }
  return false;
}

TEST_CASE("front link: idle --spawn--> starting, link refused --link_lost--> starting, --up--> ready pushes the "
          "routes", "[front_link]") {
  FrontRig r;
  REQUIRE(r.front->Bind().ok());
  CHECK(r.front->port() > 0);
  r.front->Start();
  CHECK(r.front->state() == ChildState::kStarting);
  REQUIRE(r.specs.size() == 1);
  CHECK(HasArg(r.specs[0], "--listen-fd", "3"));
  CHECK(HasArg(r.specs[0], "--control", r.SocketPath()));
  CHECK(HasArg(r.specs[0], "--epoch", "0"));
  CHECK(r.front->has_process());
  CHECK(r.saves == 1);  // a child never runs unrecorded
  // No control socket yet: the connect fails and is tried again on a timer.
  REQUIRE(r.Until([&] { return r.timers.NextDue() >= 0; }));
  CHECK(r.front->state() == ChildState::kStarting);
  CHECK_FALSE(r.front->linked());
  r.Listen();
  r.Advance(20);
  REQUIRE(r.Ready());
  CHECK(r.front->linked());
  REQUIRE(r.Until([&] { return !r.sock->Of("set_routes").empty(); }));
  json routes = r.sock->Of("set_routes").at(0);
  CHECK(routes["epoch"] == 1);
  CHECK(routes["active"] == "127.0.0.1:7001");
  CHECK(routes["standby"] == "127.0.0.1:7002");
  CHECK(r.front->epoch() == 1);
  CHECK(r.front->routes() == r.wanted);
  auto rec = r.front->Record();
  REQUIRE(rec);
  CHECK(rec->proc.pid == r.front->pid());
  CHECK(rec->control_socket == r.SocketPath());
}

TEST_CASE("front link: new routes make a new epoch, the same ones do not, and what is sent reaches the front",
          "[front_link]") {
  FrontRig r;
  r.StartLinked();
  REQUIRE(r.Until([&] { return r.sock->Of("set_routes").size() == 1; }));
  r.front->SetRoutes(r.wanted);
  CHECK(r.front->epoch() == 1);
  r.front->SetRoutes({"127.0.0.1:7002", ""});
  CHECK(r.front->epoch() == 2);
  r.front->CutEngine("127.0.0.1:7001", "engine a died");
  r.front->PushLimits();
  REQUIRE(r.Until([&] { return r.sock->Of("set_limits").size() == 1; }));
  auto sets = r.sock->Of("set_routes");
  REQUIRE(sets.size() == 3);
  CHECK(sets[1]["epoch"] == 1);
  CHECK(sets[2]["epoch"] == 2);
  CHECK(sets[2]["active"] == "127.0.0.1:7002");
  CHECK(sets[2]["standby"].is_null());
  auto cut = r.sock->Of("engine_dead");
  REQUIRE(cut.size() == 1);
  CHECK(cut[0]["engine"] == "127.0.0.1:7001");
  // A restarted front is told the routes on its command line.
  r.procs.Exit(r.front->pid(), 1);
  REQUIRE(r.Until([&] { return r.specs.size() == 2; }));
  CHECK(HasArg(r.specs[1], "--active", "127.0.0.1:7002"));
  CHECK(HasArg(r.specs[1], "--epoch", "2"));
}

TEST_CASE("front link: ready --link_lost--> starting reconnects while the process lives", "[front_link]") {
  FrontRig r;
  r.StartLinked();
  REQUIRE(r.Until([&] { return r.sock->conn != nullptr; }));
  r.sock->conn->Close("the test drops the link");
  REQUIRE(r.Until([&] { return r.front->state() == ChildState::kStarting; }));
  CHECK_FALSE(r.front->linked());
  r.Advance(20);
  REQUIRE(r.Ready());
  // Linked again: the routes again, on the same epoch.
  REQUIRE(r.Until([&] { return r.sock->Of("set_routes").size() == 2; }));
  CHECK(r.sock->Of("set_routes")[1]["epoch"] == 1);
  CHECK(r.specs.size() == 1);  // the same process
}

TEST_CASE("front link: starting | ready --exited--> failed, restarted after the backoff, and --give_up--> down on "
          "a permanent failure", "[front_link]") {
  FrontRig r;
  REQUIRE(r.front->Bind().ok());
  r.front->Start();
  // Exits before it is linked: the first restart after a quiet period is
  // immediate (restart_throttle.h).
  r.procs.Exit(r.front->pid(), 1);
  REQUIRE(r.Until([&] { return r.specs.size() == 2; }));
  CHECK(r.exits == 1);
  CHECK(r.front->state() == ChildState::kStarting);
  CHECK(r.front->restarts() == 1);
  CHECK(r.front->StatusJson()["last_exit"].get<std::string>().find("exit 1") != std::string::npos);
  // Linked, then it dies: ready --exited--> failed, and the next restart
  // waits for the backoff.
  r.Listen();
  r.Advance(20);  // the link's retry
  REQUIRE(r.Ready());
  r.procs.Exit(r.front->pid(), 1);
  REQUIRE(r.Until([&] { return r.front->state() == ChildState::kFailed; }));
  CHECK_FALSE(r.front->linked());
  CHECK_FALSE(r.front->has_process());
  CHECK_FALSE(r.front->Record());
  r.Advance(999);
  CHECK(r.specs.size() == 2);
  // failed --spawn--> starting (and linked at once: the socket is up).
  r.Advance(1);
  REQUIRE(r.specs.size() == 3);
  CHECK(r.front->has_process());
  REQUIRE(r.Ready());
  // The configuration cannot work (exit 78): not restarted, reported down.
  r.procs.Exit(r.front->pid(), kExitConfig);
  REQUIRE(r.Until([&] { return r.front->state() == ChildState::kDown; }));
  REQUIRE(r.down.size() == 1);
  CHECK(r.down[0].find("logs/front.log") != std::string::npos);
  CHECK(r.front->StatusJson()["failure"] == r.down[0]);
  r.Advance(60'000);
  CHECK(r.specs.size() == 3);
  Metrics m;
  r.front->Report(m);
  CHECK(m.front_restarts == r.front->restarts());
}

TEST_CASE("front link: --stop--> stopping [terminate] --exited--> stopped, and stopped at once without a process",
          "[front_link]") {
  SECTION("starting") {
    FrontRig r;
    REQUIRE(r.front->Bind().ok());
    r.front->Start();
    r.stopping = true;
    r.front->Stop("the node stops");
    CHECK(r.front->state() == ChildState::kStopping);
    REQUIRE(r.Until([&] { return r.front->state() == ChildState::kStopped; }));
    CHECK(r.exits == 1);
  }
  SECTION("ready") {
    FrontRig r;
    r.StartLinked();
    r.procs.term_is_slow = true;
    r.stopping = true;
    r.front->Stop("the node stops");
    CHECK(r.front->state() == ChildState::kStopping);
    REQUIRE(r.procs.slow_terms.size() == 1);
    CHECK(r.procs.slow_terms[0] == r.front->pid());
    r.procs.Exit(r.front->pid(), 0);
    REQUIRE(r.Until([&] { return r.front->state() == ChildState::kStopped; }));
  }
  SECTION("idle") {
    FrontRig r;
    r.front->Stop("the node stops");
    CHECK(r.front->state() == ChildState::kStopped);
  }
  SECTION("failed: no restart follows") {
    FrontRig r;
    REQUIRE(r.front->Bind().ok());
    r.front->Start();
    r.procs.Exit(r.front->pid(), 1);
    REQUIRE(r.Until([&] { return r.specs.size() == 2; }));
    // The second exit in the window waits for its backoff: failed.
    r.procs.Exit(r.front->pid(), 1);
    REQUIRE(r.Until([&] { return r.front->state() == ChildState::kFailed; }));
    r.front->Stop("the node stops");
    CHECK(r.front->state() == ChildState::kStopped);
    r.Advance(60'000);
    CHECK(r.specs.size() == 2);
  }
}

TEST_CASE("front link: idle --adopt--> starting links to the running front on the recorded epoch", "[front_link]") {
  FrontRig r;
  ChildSpec spec;
  spec.argv = {"wsup-front"};
  auto pid = r.procs.Spawn(spec);
  REQUIRE(pid.ok());
  r.Listen();
  r.front->Adopt(RuntimeState::Front{ProcessRef{*pid, 0}, r.SocketPath(), "127.0.0.1:4321"}, 7);
  CHECK(r.front->pid() == *pid);
  CHECK(r.front->port() == 4321);
  CHECK(r.front->epoch() == 7);
  REQUIRE(r.Ready());
  // The routes wanted differ from none: a new epoch after the adopted one.
  REQUIRE(r.Until([&] { return !r.sock->Of("set_routes").empty(); }));
  CHECK(r.sock->Of("set_routes")[0]["epoch"] == 8);
  CHECK(r.front->StatusJson()["listen"] == "127.0.0.1:4321");
}

TEST_CASE("front link: the front's messages reach the owner read, and one that cannot be read is counted",
          "[front_link]") {
  FrontRig r;
  r.StartLinked();
  REQUIRE(r.Until([&] { return r.sock->conn != nullptr; }));
  r.sock->conn->Send(json{{"type", "event"}, {"kind", "first_ok"}, {"backend", "127.0.0.1:7001"}, {"at_ms", 5}});
  r.sock->conn->Send(json{{"type", "event"}, {"kind", "silent"}, {"backend", 12}});
  r.sock->conn->Send(json{{"ok", true}, {"epoch", 1}});
  REQUIRE(r.Until([&] { return r.messages.size() == 2; }));
  CHECK(r.messages[0].kind == FrontMessage::Kind::kFirstOk);
  CHECK(r.messages[0].backend == "127.0.0.1:7001");
  CHECK(r.messages[1].kind == FrontMessage::Kind::kRoutesAck);
  Metrics m;
  r.front->Report(m);
  CHECK(m.bad_messages["front"] == 1);
}

TEST_CASE("front link: its status is asked on a connection of its own, and no front answers null", "[front_link]") {
  FrontRig r;
  bool asked = false;
  const json* none = reinterpret_cast<const json*>(1);
  r.front->AskStatus([&](const json* reply) {
    asked = true;
    none = reply;
  });
  CHECK(asked);
  CHECK(none == nullptr);
  REQUIRE(r.front->Bind().ok());
  r.Listen();
  r.sock->status_reply = json{{"inflight", {{"127.0.0.1:7001", 2}}}};
  r.front->Start();
  REQUIRE(r.Ready());
  std::optional<json> got;
  r.front->AskStatus([&](const json* reply) { got = reply ? *reply : json(nullptr); });
  REQUIRE(r.Until([&] { return got.has_value(); }));
  CHECK((*got)["inflight"]["127.0.0.1:7001"] == 2);
}

TEST_CASE("front link: a listening socket that cannot be bound stops the node through the fatal hook",
          "[front_link]") {
  FrontRig r;
  REQUIRE(r.front->Bind().ok());
  const int taken = r.front->port();
  FrontRig other;
  other.cfg.front.listen.port = taken;
  other.front->Start();
  REQUIRE(other.fatal.size() == 1);
  CHECK(other.fatal[0].find("front.listen") != std::string::npos);
  CHECK(other.specs.empty());
}

TEST_CASE("front link: the front's counters are asked every second and summed over its restarts, never going down",
          "[front_link]") {
  FrontRig r;
  r.StartLinked();
  const pid_t first = r.front->pid();
  r.sock->status_reply = json{{"pid", first}, {"counters", {{"hedged", 3}, {"resumed", 5}, {"resumed_chat", 2}}}};
  auto counters = [&] {
    Metrics m;
    r.front->Report(m);
    return m.front_counters;
  };
  CHECK(counters().empty());  // nothing asked yet
  r.Advance(FrontLink::kCountersPollMs);
  REQUIRE(r.Until([&] { return counters()["hedged"] == 3; }));
  CHECK(counters()["resumed"] == 5);
  // The same front counts on; a lower count it cannot report is not taken.
  r.sock->status_reply = json{{"pid", first}, {"counters", {{"hedged", 4}, {"resumed", 1}}}};
  r.Advance(FrontLink::kCountersPollMs);
  REQUIRE(r.Until([&] { return counters()["hedged"] == 4; }));
  CHECK(counters()["resumed"] == 5);
  // A new front process counts from 0: its counts add to the old one's.
  r.sock->status_reply = json{{"pid", first + 1000},
                              {"counters", {{"hedged", 1}, {"resumed", 2}, {"answer:chat:200", 4}}},
                              {"queued", 3},
                              {"inflight", {{"127.0.0.1:1", 2}, {"127.0.0.1:2", 5}}}};
  r.Advance(FrontLink::kCountersPollMs);
  REQUIRE(r.Until([&] { return counters()["hedged"] == 5; }));
  CHECK(counters()["resumed"] == 7);
  CHECK(counters()["resumed_chat"] == 2);
  Metrics m;
  r.front->Report(m);
  const std::string text = m.Render();
  CHECK(text.find("wsup_front_hedges_total{outcome=\"started\"} 5\n") != std::string::npos);
  CHECK(text.find("wsup_front_resumed_streams_total{api=\"chat\"} 2\n") != std::string::npos);
  CHECK(text.find("wsup_front_resumed_streams_total{api=\"completions\"} 5\n") != std::string::npos);
  // The serving counters travel as the others do; the queue and the
  // requests in flight are the latest answer's.
  CHECK(text.find("wsup_front_responses_total{route=\"chat\",code=\"200\"} 4\n") != std::string::npos);
  CHECK(text.find("wsup_front_queued_requests 3\n") != std::string::npos);
  CHECK(text.find("wsup_front_inflight_requests 7\n") != std::string::npos);
  // One ask at a time: a front that does not answer is asked again only
  // after ten polls.
  r.sock->status_reply.reset();
  const size_t asked = r.sock->Of("status").size();
  r.Advance(FrontLink::kCountersPollMs);
  REQUIRE(r.Until([&] { return r.sock->Of("status").size() == asked + 1; }));
  r.Advance(9 * FrontLink::kCountersPollMs);
  CHECK(r.sock->Of("status").size() == asked + 1);
  r.Advance(FrontLink::kCountersPollMs);
  REQUIRE(r.Until([&] { return r.sock->Of("status").size() == asked + 2; }));
}

}  // namespace
}  // namespace wsup
