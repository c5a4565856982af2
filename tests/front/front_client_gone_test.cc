// Clients that hang up on non-streamed requests: the front must notice the
// EOF (http/server.h: a peer's EOF with a request in flight means the client
// is gone), stop the upstream request by closing its engine connection (so
// the engine cancels it), never send it again to the standby, and count it
// in client_closed. Before, the front kept all of them in flight and the
// engine generated for nobody until it was failed over, and the front then
// re-sent every one of them to the standby.
#include <catch2/catch.hpp>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/front/fake_engine.h"
#include "tests/front/front_harness.h"
#include "testkit/http_client.h"
#include "testkit/test_util.h"

using namespace std::chrono_literals;
using nlohmann::json;
using namespace wsup::test;  // the front's harness and the shared test support

TEST_CASE("clients that close on non-streamed requests: the front cancels upstream, retries nothing",
          "[front][process]") {
  FakeEngine a("A"), b("B");
  a.mode = FakeEngine::kHold;  // a long generation: no answer before the clients give up
  auto front = FrontProcess::Start({"--active", a.addr(), "--standby", b.addr()});
  ControlClient ctl;
  REQUIRE(ctl.Connect(front->control_path()));

  constexpr int kClients = 20;
  std::vector<std::unique_ptr<HttpConn>> clients;
  for (int i = 0; i < kClients; ++i) {
    auto c = std::make_unique<HttpConn>();
    REQUIRE(c->Connect(front->port()));
    REQUIRE(c->Send(FormatRequest("POST", "/v1/completions", R"({"prompt":"abandoned","max_tokens":500})")));
    clients.push_back(std::move(c));
  }
  REQUIRE(WaitFor([&] { return a.held.load() == kClients; }, 10s));
  CHECK(FrontStatus(ctl)["inflight"][a.addr()] == kClients);

  // Every client hangs up at once. Nothing was sent to them, so each close
  // is a plain FIN (an EOF for the front), not a reset.
  for (auto& c : clients) c->Close();

  CHECK(WaitFor([&] { return FrontStatus(ctl)["counters"]["client_closed"] == kClients; }, 10s));
  // The front closed each upstream connection, so the engine could cancel.
  CHECK(WaitFor([&] { return a.held_closed.load() == kClients; }, 10s));
  json st = FrontStatus(ctl);
  CHECK(st["counters"]["retried"] == 0);
  CHECK(st["counters"]["failed"] == 0);
  CHECK(st["counters"]["switched_self"] == 0);
  CHECK(st["inflight"][a.addr()] == 0);
  CHECK(st["active"] == a.addr());  // an engine's connection closed by the front is no engine failure
  CHECK(b.requests.load() == 0);    // nothing was sent again to the standby

  // The front and the engine go on serving.
  a.mode = FakeEngine::kNormal;
  HttpResult r = HttpRequestOnce(front->port(), "POST", "/v1/completions", R"({"prompt":"x","max_tokens":2})", 10s);
  CHECK(r.status == 200);
  CHECK(r.Header("X-Engine") == "A");
  CHECK(b.requests.load() == 0);
}

TEST_CASE("a client that closes while its request waits for an engine leaves the queue", "[front][process]") {
  // No route: the request waits in the front's queue; its client gives up.
  auto front = FrontProcess::Start({"--queue-timeout-ms", "60000"});
  ControlClient ctl;
  REQUIRE(ctl.Connect(front->control_path()));
  HttpConn c;
  REQUIRE(c.Connect(front->port()));
  REQUIRE(c.Send(FormatRequest("POST", "/v1/completions", R"({"prompt":"x","max_tokens":500})")));
  REQUIRE(WaitFor([&] { return FrontStatus(ctl)["queued"] == 1; }, 10s));
  c.Close();
  CHECK(WaitFor([&] { return FrontStatus(ctl)["queued"] == 0; }, 10s));
  json st = FrontStatus(ctl);
  CHECK(st["counters"]["client_closed"] == 1);
  CHECK(st["counters"]["rejected_503"] == 0);

  // A route that appears later does not get the abandoned request.
  FakeEngine a("A");
  auto reply = ctl.Call(wsup::test::SetRoutes(a.addr(), "", 1));
  REQUIRE(reply.ok());
  REQUIRE((*reply)["ok"] == true);
  CHECK(HttpRequestOnce(front->port(), "GET", "/v1/whoami").body == "A");
  CHECK(a.completions.load() == 0);
}
