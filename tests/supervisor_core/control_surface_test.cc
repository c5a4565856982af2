// ControlSurface (supervisor/control_surface.h) on its own: its control
// socket and admin listener on a loop of the test's, the node behind fake
// hooks that record what they were asked. Each test talks to it as the CLI
// and a scraper do (a control client, HTTP) and checks what reached the
// node and what the caller was told, bad requests first.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "supervisor/control_surface.h"
#include "testkit/control_client.h"
#include "testkit/http_client.h"
#include "testkit/loop_thread.h"
#include "testkit/test_util.h"

namespace wsup {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;

struct SurfaceRig {
  test::TempDir dir;
  test::LoopThread lt;
  Metrics metrics;
  std::mutex mu;
  // What reached the node, in order ("status", "drill kill", "reload a=1",
  // "stop", "metrics").
  std::vector<std::string> asked;
  std::unique_ptr<ControlSurface> surface;
  int admin_port = 0;

  SurfaceRig() {
    ControlSurface::Hooks h;
    h.status = [this] {
      Note("status");
      // A string a child wrote, not UTF-8: the admin listener must not throw on it.
      return json{{"type", "status"}, {"node", "n1"}, {"last_probe_error", std::string("bad \xff byte")}};
    };
    h.drill = [this](const ControlSurface::Conn& c, bool kill) {
      Note(kill ? "drill kill" : "drill swap");
      c->Send(json{{"type", "failover"}, {"ok", true}});
    };
    h.reload = [this](const ControlSurface::Conn& c, const std::vector<std::string>& sets) {
      std::string line = "reload";
      for (const auto& s : sets) line += " " + s;
      Note(line);
      c->Send(json{{"type", "reload"}, {"ok", true}});
    };
    h.stop = [this](const ControlSurface::Conn& c) {
      Note("stop");
      c->Send(json{{"type", "stop"}, {"ok", true}});
    };
    h.metrics = [this] {
      Note("metrics");
      return std::string("# TYPE wsup_up gauge\nwsup_up 1\n");
    };
    lt.Do([&] {
      surface = std::make_unique<ControlSurface>(lt.loop(), metrics, std::move(h));
      REQUIRE(surface->ListenControl(dir.Join("control.sock")).ok());
      REQUIRE(surface->ListenAdmin("127.0.0.1", 0).ok());
      admin_port = surface->admin_port();
    });
  }
  ~SurfaceRig() {
    std::atomic<bool> closed{false};
    lt.Do([&] { surface->Close([&] { closed = true; }); });
    CHECK(test::WaitFor([&] { return closed.load(); }, 5s));
    lt.Do([&] { surface.reset(); });
  }
  void Note(const std::string& what) {
    std::lock_guard<std::mutex> lk(mu);
    asked.push_back(what);
  }
  std::vector<std::string> Asked() {
    std::lock_guard<std::mutex> lk(mu);
    return asked;
  }
  uint64_t BadMessages() {
    uint64_t n = 0;
    lt.Do([&] { n = metrics.bad_messages["control"]; });
    return n;
  }
};

TEST_CASE("control surface: each request of the CLI reaches the node once, with its arguments",
          "[supervisor][control]") {
  SurfaceRig rig;
  test::ControlClient cli;
  REQUIRE(cli.Connect(rig.dir.Join("control.sock")).ok());
  auto st = cli.Call(json{{"type", "status"}});
  REQUIRE(st.ok());
  CHECK((*st)["node"] == "n1");
  auto drill = cli.Call(json{{"type", "failover"}, {"drill", true}, {"kill", true}});
  REQUIRE(drill.ok());
  CHECK((*drill)["type"] == "failover");
  auto reload = cli.Call(json{{"type", "reload"}, {"set", {"probe.interval_ms=500"}}});
  REQUIRE(reload.ok());
  auto stop = cli.Call(json{{"type", "stop"}});
  REQUIRE(stop.ok());
  CHECK(rig.Asked() ==
        std::vector<std::string>{"status", "drill kill", "reload probe.interval_ms=500", "stop"});
  CHECK(rig.BadMessages() == 0);
}

TEST_CASE("control surface: a message that is not a request is refused with the field named, counted, and reaches "
          "nothing",
          "[supervisor][control]") {
  SurfaceRig rig;
  test::ControlClient cli;
  REQUIRE(cli.Connect(rig.dir.Join("control.sock")).ok());
  const std::vector<json> bad = {
      json{{"type", "shutdown-now"}},
      json{{"type", 7}},
      json{{"type", "failover"}, {"drill", "yes"}},
      json{{"type", "reload"}, {"set", "probe.interval_ms=1"}},
      json{{"type", "reload"}, {"set", {1, 2}}},
  };
  for (const json& msg : bad) {
    auto r = cli.Call(msg);
    INFO(msg.dump());
    REQUIRE(r.ok());
    CHECK((*r)["type"] == "error");
    CHECK_FALSE((*r).value("message", "").empty());
  }
  CHECK(rig.Asked().empty());
  CHECK(rig.BadMessages() == bad.size());
  // The connection and the surface still serve.
  auto st = cli.Call(json{{"type", "status"}});
  REQUIRE(st.ok());
  CHECK((*st)["type"] == "status");
}

TEST_CASE("control surface: the admin listener answers /metrics and /status, and refuses writes and other paths",
          "[supervisor][control]") {
  SurfaceRig rig;
  test::HttpResult m = test::HttpRequestOnce(rig.admin_port, "GET", "/metrics");
  CHECK(m.status == 200);
  CHECK(m.Header("Content-Type") == "text/plain; version=0.0.4");
  CHECK(m.body == "# TYPE wsup_up gauge\nwsup_up 1\n");

  test::HttpResult s = test::HttpRequestOnce(rig.admin_port, "GET", "/status");
  CHECK(s.status == 200);
  const json status = json::parse(s.body, nullptr, false);
  REQUIRE_FALSE(status.is_discarded());
  CHECK(status["node"] == "n1");

  test::HttpResult post = test::HttpRequestOnce(rig.admin_port, "POST", "/metrics", "{}");
  CHECK(post.status == 405);
  CHECK(post.Header("Allow") == "GET, HEAD");
  CHECK(post.body.find("read-only") != std::string::npos);

  test::HttpResult other = test::HttpRequestOnce(rig.admin_port, "GET", "/wsup/role");
  CHECK(other.status == 404);

  CHECK(rig.Asked() == std::vector<std::string>{"metrics", "status"});
}

}  // namespace
}  // namespace wsup
