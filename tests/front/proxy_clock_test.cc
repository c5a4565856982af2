// The proxy's timed decisions in-process, on a fake clock: the wait queue's
// timeout and bound, and the hedge scan that sleeps while no request is in
// flight. No engine, no socket, no sleep: the test moves the clock and the
// proxy's timers fire (tests/fake_timers.h).
#include <catch2/catch.hpp>

#include <uv.h>

#include <memory>

#include "common/clock.h"
#include "front/proxy.h"
#include "http/server.h"
#include "tests/fake_timers.h"

using namespace wsup::front;
using wsup::FakeClock;
using wsup::testing::FakeTimers;

namespace {

// A client request whose answer goes nowhere: the proxy's counters say what it did.
std::shared_ptr<wsup::http::ResponseWriter> Request(const std::string& body = R"({"prompt":"a"})") {
  wsup::http::HttpRequest r;
  r.method = "POST";
  r.target = r.path = "/v1/completions";
  r.body = body;
  r.request_id = "req-1";
  return std::make_shared<wsup::http::ResponseWriter>(nullptr, std::move(r));
}

struct Rig {
  uv_loop_t loop;
  FakeClock clock;
  FakeTimers timers{&clock};
  std::unique_ptr<Proxy> proxy;

  explicit Rig(ProxyOptions o) {
    uv_loop_init(&loop);
    proxy = std::make_unique<Proxy>(&loop, o, nullptr, nullptr, &clock, &timers);
  }
  ~Rig() {
    bool closed = false;
    proxy->Close([&] { closed = true; });
    uv_run(&loop, UV_RUN_DEFAULT);
    CHECK(closed);
    proxy.reset();
    CHECK(uv_loop_close(&loop) == 0);
  }
};

}  // namespace

TEST_CASE("proxy on a fake clock: a request with no route waits the queue timeout, then 503", "[front][clock]") {
  Rig rig(ProxyOptions{.queue_timeout_ms = 5'000});
  rig.proxy->Handle(Request());
  CHECK(rig.proxy->call_count() == 1);
  CHECK(rig.proxy->StatusJson()["queued"] == 1);
  rig.timers.Advance(4'999);
  CHECK(rig.proxy->counters().rejected_503 == 0);
  CHECK(rig.proxy->call_count() == 1);
  rig.timers.Advance(1);
  CHECK(rig.proxy->counters().rejected_503 == 1);
  CHECK(rig.proxy->call_count() == 0);
  CHECK(rig.proxy->StatusJson()["queued"] == 0);
}

TEST_CASE("proxy on a fake clock: each queued request keeps its own deadline", "[front][clock]") {
  Rig rig(ProxyOptions{.queue_timeout_ms = 1'000});
  rig.proxy->Handle(Request());
  rig.timers.Advance(600);
  rig.proxy->Handle(Request());
  rig.timers.Advance(400);
  CHECK(rig.proxy->counters().rejected_503 == 1);
  rig.timers.Advance(599);
  CHECK(rig.proxy->counters().rejected_503 == 1);
  rig.timers.Advance(1);
  CHECK(rig.proxy->counters().rejected_503 == 2);
}

TEST_CASE("proxy on a fake clock: a full queue refuses at once", "[front][clock]") {
  Rig rig(ProxyOptions{.max_queued = 1});
  rig.proxy->Handle(Request());
  rig.proxy->Handle(Request());
  CHECK(rig.proxy->counters().rejected_503 == 1);
  CHECK(rig.proxy->call_count() == 1);
}

TEST_CASE("proxy on a fake clock: a body past the JSON limits is refused before any queue", "[front][clock]") {
  Rig rig(ProxyOptions{});
  rig.proxy->Handle(Request("{\"prompt\":" + std::string(100, '[') + std::string(100, ']') + "}"));
  CHECK(rig.proxy->counters().rejected_400 == 1);
  CHECK(rig.proxy->call_count() == 0);
}

TEST_CASE("proxy on a fake clock: the hedge scan sleeps on an idle proxy and wakes with a request", "[front][clock][hedge]") {
  Rig rig(ProxyOptions{.hedge_after_ms = 200});  // a scan every 5 ms
  CHECK(rig.timers.armed() == 1);  // armed at the start
  rig.timers.Advance(5);
  CHECK(rig.timers.armed() == 0);  // no request: it stops
  rig.proxy->Handle(Request());
  CHECK(rig.timers.armed() == 2);  // the scan, and the queue's timeout
  // A queued request is on no engine: the scans find nothing to hedge.
  rig.timers.Advance(1'000);
  CHECK(rig.proxy->counters().hedged == 0);
  CHECK(rig.proxy->counters().hedge_refused == 0);
}

TEST_CASE("proxy on a fake clock: hedging turned off by a reload stops the scan", "[front][clock][hedge]") {
  Rig rig(ProxyOptions{.hedge_after_ms = 200});
  rig.proxy->Handle(Request());
  HedgeLimits h;
  h.after_ms = 0;
  rig.proxy->SetHedging(h);
  CHECK(rig.timers.armed() == 1);  // only the queue's timeout
}
