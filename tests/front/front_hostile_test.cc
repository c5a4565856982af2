// Hostile and malformed HTTP against the front process while good clients
// are being served: bad request lines, huge headers and bodies, slow
// clients, clients that never read, clients that vanish mid-stream, and
// pipelined requests with a broken one among them, all at once. The good
// clients' stream in flight must finish intact, and new requests must be
// answered promptly throughout (acceptance 3 of the failover issue). The
// one-at-a-time cases are in front_process_test.cc.
#include <catch2/catch.hpp>

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/front/fake_engine.h"
#include "tests/front/front_harness.h"
#include "testkit/http_client.h"
#include "testkit/test_util.h"

using namespace std::chrono_literals;
using nlohmann::json;
using namespace wsup::test;  // the front's harness and the shared test support

namespace {

std::string StreamText(const std::string& body, bool* done) {
  std::string text;
  *done = false;
  for (const auto& d : wsup::test::SseData(body)) {
    if (d == "[DONE]") {
      *done = true;
      continue;
    }
    json e = json::parse(d);
    if (!e["choices"].empty()) text += e["choices"][0]["text"].get<std::string>();
  }
  return text;
}

// A good request answered correctly within `limit` (a loaded front that
// still serves answers in milliseconds; the bound is generous for CI).
bool Served(int port, std::chrono::milliseconds limit = 5s) {
  auto t0 = std::chrono::steady_clock::now();
  HttpResult r = HttpRequestOnce(port, "GET", "/v1/whoami", "", limit);
  return r.status == 200 && r.body == "A" && std::chrono::steady_clock::now() - t0 < limit;
}

}  // namespace

TEST_CASE("hostile clients all at once never stall a stream in flight or new requests", "[front][process][hostile]") {
  FakeEngine a("A");
  auto front = FrontProcess::Start({"--active", a.addr(), "--header-timeout-ms", "500", "--body-timeout-ms", "500",
                                    "--write-timeout-ms", "1000", "--max-body-bytes", "65536"});
  ControlClient ctl;
  REQUIRE(ctl.Connect(front->control_path()));
  int port = front->port();

  // A good, slow stream in flight for the whole test (60 tokens, 20 ms each).
  a.token_delay_ms = 20;
  HttpResult good;
  std::thread streamer([&] {
    good = HttpRequestOnce(port, "POST", "/v1/completions", R"({"prompt":"keep","stream":true,"max_tokens":60})", 60s);
  });
  REQUIRE(WaitFor([&] { return a.streams_active.load() >= 1; }, 10s));

  std::vector<std::unique_ptr<HttpConn>> hostile;
  auto open = [&] {
    hostile.push_back(std::make_unique<HttpConn>());
    REQUIRE(hostile.back()->Connect(port));
    return hostile.back().get();
  };
  // 20 slow clients that never finish their headers.
  for (int i = 0; i < 20; ++i) REQUIRE(open()->Send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: "));
  // A slow body: headers announce 1000 bytes, 10 arrive.
  REQUIRE(open()->Send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"prompt\":"));
  // Garbage, a bad request line, a bad header, a huge header, a huge body.
  HttpConn* garbage = open();
  REQUIRE(garbage->Send(std::string("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 11) + std::string(200, '\xff')));
  HttpConn* bad_line = open();
  REQUIRE(bad_line->Send("GET /v1/whoami HTTP/9.9 extra\r\n\r\n"));
  HttpConn* bad_header = open();
  REQUIRE(bad_header->Send("GET /v1/whoami HTTP/1.1\r\nNo colon here\r\n\r\n"));
  HttpConn* huge_header = open();
  REQUIRE(huge_header->Send("GET /v1/whoami HTTP/1.1\r\nX-Big: " + std::string(100000, 'h') + "\r\n\r\n", 10s));
  HttpConn* huge_body = open();
  REQUIRE(huge_body->Send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000\r\n\r\n"));
  // A pipelined burst whose third request is broken: the first two are
  // answered in order, then 400, then the connection closes.
  HttpConn* pipelined = open();
  REQUIRE(pipelined->Send(FormatRequest("GET", "/v1/whoami", "") +
                          FormatRequest("POST", "/v1/completions", R"({"prompt":"p","max_tokens":3})") +
                          "GET /v1/whoami HTTP/1.1\r\nContent-Length: nope\r\n\r\n" + FormatRequest("GET", "/v1/whoami", "")));
  // A client that asks for 1 MiB and never reads it (the socket buffers may
  // hold all of it; either way it must not hold up anyone else).
  HttpConn* no_reader = open();
  REQUIRE(no_reader->Send(FormatRequest("GET", "/v1/big", "")));
  // Clients that vanish mid-stream, and one that vanishes mid-request.
  for (int i = 0; i < 5; ++i) {
    HttpConn c;
    REQUIRE(c.Connect(port));
    REQUIRE(c.Send(FormatRequest("POST", "/v1/completions", R"({"prompt":"gone","stream":true,"max_tokens":100})")));
    c.Close();
  }
  {
    HttpConn c;
    REQUIRE(c.Connect(port));
    REQUIRE(c.Send("POST /v1/completions HTTP/1.1\r\nContent-Length: 50\r\n\r\n{\"pro"));
  }

  // Through all of it, new requests are served.
  for (int i = 0; i < 10; ++i) CHECK(Served(port));

  CHECK(bad_line->Read(5s).status == 400);
  CHECK(bad_header->Read(5s).status == 400);
  CHECK(huge_header->Read(5s).status == 431);
  CHECK(huge_body->Read(5s).status == 413);
  HttpResult g = garbage->Read(5s);
  CHECK((g.status == 400 || (g.status == 0 && garbage->WaitClosed(5s))));
  HttpResult p1 = pipelined->Read(10s), p2 = pipelined->Read(10s), p3 = pipelined->Read(10s);
  CHECK(p1.status == 200);
  CHECK(p1.body == "A");
  CHECK(p2.status == 200);
  CHECK(json::parse(p2.body)["choices"][0]["text"] == FakeText(FakeGenerate(FakeTokenize("p"), 3)));
  CHECK(p3.status == 400);
  CHECK(pipelined->WaitClosed(5s));
  // The slow ones are cut off by their timeouts (header, body, write).
  for (int i = 0; i < 21; ++i) CHECK(hostile[static_cast<size_t>(i)]->WaitClosed(10s));
  // The vanished streams were dropped: by the front, which took each
  // client's EOF as its leaving (often before the request reached the
  // engine), and at the engine for every one that had reached it (all
  // completions but the good stream and the pipelined one).
  CHECK(WaitFor(
      [&] {
        auto st = ctl.Call({{"type", "status"}});
        return st && (*st)["counters"]["client_closed"].get<int>() >= 5;
      },
      20s));
  CHECK(WaitFor([&] { return a.client_closed.load() == a.completions.load() - 2; }, 20s));

  streamer.join();
  REQUIRE(good.status == 200);
  bool done = false;
  CHECK(StreamText(good.body, &done) == FakeText(FakeGenerate(FakeTokenize("keep"), 60)));
  CHECK(done);
  CHECK(Served(port));
  CHECK(front->child().running());
  auto st = ctl.Call({{"type", "status"}});
  REQUIRE(st.ok());
  CHECK((*st)["counters"]["failed"] == 0);
  CHECK((*st)["inflight"][a.addr()] == 0);
}

TEST_CASE("a request line or header section split into single bytes is still served", "[front][process][hostile]") {
  FakeEngine a("A");
  auto front = FrontProcess::Start({"--active", a.addr()});
  HttpConn c;
  REQUIRE(c.Connect(front->port()));
  std::string req = FormatRequest("POST", "/v1/completions", R"({"prompt":"drip","max_tokens":4})");
  for (char ch : req) REQUIRE(c.Send(std::string(1, ch)));
  HttpResult r = c.Read(10s);
  CHECK(r.status == 200);
  CHECK(json::parse(r.body)["choices"][0]["text"] == FakeText(FakeGenerate(FakeTokenize("drip"), 4)));
  CHECK(HttpRequestOnce(front->port(), "GET", "/v1/whoami").body == "A");
}
