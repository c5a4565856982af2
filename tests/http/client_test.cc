// HttpClient against a scripted raw server on port 0: framings, streaming,
// every failure kind, cancellation, and a loop that closes clean.
#include "http/client.h"

#include <catch2/catch.hpp>

#include <optional>

#include "tests/probes/scripted_server.h"

namespace wsup::http {
namespace {

using test::RawResponse;
using test::ScriptedReply;
using test::ScriptedServer;

// A loop with one scripted server; the destructor checks the loop closes clean.
struct Fixture {
  uv_loop_t loop{};
  std::unique_ptr<ScriptedServer> server;
  std::unique_ptr<HttpClient> client;

  explicit Fixture(ScriptedServer::Handler handler) {
    uv_loop_init(&loop);
    server = std::make_unique<ScriptedServer>(&loop, std::move(handler));
    REQUIRE(server->Listen().ok());
    client = std::make_unique<HttpClient>(&loop);
  }
  ~Fixture() { Shutdown(); }

  void Shutdown() {
    if (!server) return;
    client.reset();
    bool closed = false;
    server->Close([&] { closed = true; });
    test::RunUntil(&loop, [&] { return closed; });
    server.reset();
    CHECK(test::CloseLoop(&loop) == 0);
  }

  // Sends one request and runs the loop until its callback ran.
  Result<HttpResponse> Do(ClientRequest req, int port = 0, const std::string& host = "127.0.0.1") {
    std::optional<Result<HttpResponse>> out;
    client->Send(host, port ? port : server->port(), std::move(req),
                 [&](Result<HttpResponse> r) { out.emplace(std::move(r)); });
    REQUIRE(test::RunUntil(&loop, [&] { return out.has_value(); }));
    return std::move(*out);
  }
  // Do() of a request that must fail.
  Error Fails(ClientRequest req, int port = 0) {
    auto r = Do(std::move(req), port);
    REQUIRE_FALSE(r.ok());
    return r.error();
  }
};

ClientRequest Get(const std::string& target, int64_t timeout_ms = 5000) {
  ClientRequest r;
  r.target = target;
  r.timeout_ms = timeout_ms;
  return r;
}

std::string HeaderOf(const HttpResponse& r, const std::string& name) {
  for (const auto& h : r.headers)
    if (HeaderNameEquals(h.name, name)) return h.value;
  return "";
}

TEST_CASE("http client: GET with Content-Length", "[http][client]") {
  Fixture f([](const HttpRequest&) {
    return ScriptedReply{{"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nX-A: 1\r\nContent-Length: 5\r\n\r\nhello"}};
  });
  auto r = f.Do(Get("/x?y=1"));
  REQUIRE(r.ok());
  CHECK(r->status == 200);
  CHECK(r->body == "hello");
  CHECK(HeaderOf(*r, "x-a") == "1");
  REQUIRE(f.server->requests().size() == 1);
  const auto& seen = f.server->requests()[0];
  CHECK(seen.method == "GET");
  CHECK(seen.target == "/x?y=1");
  REQUIRE(seen.FindHeader("Host"));
  CHECK(*seen.FindHeader("Host") == "127.0.0.1:" + std::to_string(f.server->port()));
  CHECK_FALSE(seen.keep_alive);
  CHECK(f.client->in_flight() == 0);
}

TEST_CASE("http client: POST sends its body - 5xx is a response, not an error", "[http][client]") {
  Fixture f([](const HttpRequest& r) { return ScriptedReply{{RawResponse(503, "{\"echo\":" + r.body + "}")}}; });
  ClientRequest req;
  req.method = "POST";
  req.target = "/v1/completions";
  req.headers = {{"Content-Type", "application/json"}, {"Content-Length", "999"}};
  req.body = "{\"a\":1}";
  auto r = f.Do(req);
  REQUIRE(r.ok());
  CHECK(r->status == 503);
  CHECK(r->body == "{\"echo\":{\"a\":1}}");
  REQUIRE(f.server->requests().size() == 1);
  CHECK(f.server->requests()[0].body == "{\"a\":1}");  // our length, not the caller's bogus one
}

TEST_CASE("http client: chunked and until-close bodies, split anywhere", "[http][client]") {
  SECTION("chunked") {
    Fixture f([](const HttpRequest&) {
      ScriptedReply rep;
      rep.pieces = {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel", "lo\r\n", "6\r\n world\r",
                    "\n0\r\n\r\n"};
      rep.piece_delay_ms = 2;
      return rep;
    });
    auto r = f.Do(Get("/"));
    REQUIRE(r.ok());
    CHECK(r->body == "hello world");
  }
  SECTION("until close") {
    Fixture f([](const HttpRequest&) {
      return ScriptedReply{{"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nall of", " it"}};
    });
    auto r = f.Do(Get("/"));
    REQUIRE(r.ok());
    CHECK(r->body == "all of it");
  }
  SECTION("HEAD has no body whatever Content-Length says") {
    Fixture f([](const HttpRequest&) {
      return ScriptedReply{{"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n"}, 0, ScriptedReply::After::kKeepOpen};
    });
    ClientRequest req = Get("/");
    req.method = "HEAD";
    auto r = f.Do(req);
    REQUIRE(r.ok());
    CHECK(r->body.empty());
  }
}

TEST_CASE("http client: server-sent events arrive one by one", "[http][client]") {
  Fixture f([](const HttpRequest&) {
    ScriptedReply rep;
    std::string body1 = ": keep-alive\r\ndata: {\"n\":1}\r\n\r\ndata: two\r";
    std::string body2 = "\ndata: lines\n\nevent: end\nid: 7\ndata: [DONE]\n\n";
    rep.pieces = {"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n",
                  EncodeChunk(body1), EncodeChunk(body2), EncodeChunk("")};
    rep.piece_delay_ms = 5;
    return rep;
  });
  std::vector<ServerSentEvent> events;
  int heads = 0;
  ClientRequest req = Get("/stream");
  req.on_head = [&](const HttpResponse& h) {
    ++heads;
    CHECK(h.status == 200);
    CHECK(events.empty());
  };
  req.on_event = [&](const ServerSentEvent& e) { events.push_back(e); };
  auto r = f.Do(req);
  REQUIRE(r.ok());
  CHECK(heads == 1);
  CHECK(r->body.empty());
  REQUIRE(events.size() == 3);
  CHECK(events[0].data == "{\"n\":1}");
  CHECK(events[1].data == "two\nlines");
  CHECK(events[2].data == "[DONE]");
  CHECK(events[2].event == "end");
  CHECK(events[2].id == "7");
}

TEST_CASE("http client: on_data streams the body without keeping it", "[http][client]") {
  Fixture f([](const HttpRequest&) {
    ScriptedReply rep;
    rep.pieces = {"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", EncodeChunk(std::string(3000, 'a')),
                  EncodeChunk(std::string(3000, 'b')), EncodeChunk("")};
    return rep;
  });
  std::string streamed;
  ClientRequest req = Get("/");
  req.max_body_bytes = 100;  // streaming is not bounded by it
  req.on_data = [&](std::string_view d) { streamed.append(d); };
  auto r = f.Do(req);
  REQUIRE(r.ok());
  CHECK(r->body.empty());
  CHECK(streamed == std::string(3000, 'a') + std::string(3000, 'b'));
}

TEST_CASE("http client: failures have their kind and name the request", "[http][client]") {
  SECTION("timeout") {
    Fixture f([](const HttpRequest&) { return ScriptedReply{{}, 0, ScriptedReply::After::kKeepOpen, true}; });
    uint64_t start = uv_now(&f.loop);
    Error e = f.Fails(Get("/slow", 80));
    CHECK(e.code() == Code::kTimeout);
    CHECK(e.message().find("/slow") != std::string::npos);
    CHECK(e.message().find("within 80 ms") != std::string::npos);
    CHECK(uv_now(&f.loop) - start >= 80);
  }
  SECTION("connection refused") {
    Fixture f([](const HttpRequest&) { return ScriptedReply{}; });
    int port = test::UnusedPort();
    Error e = f.Fails(Get("/"), port);
    CHECK(e.code() == Code::kUnavailable);
    CHECK(e.message().find("connection refused") != std::string::npos);
    CHECK(e.message().rfind("127.0.0.1:" + std::to_string(port) + ": GET /: ", 0) == 0);
  }
  SECTION("not HTTP") {
    Fixture f([](const HttpRequest&) { return ScriptedReply{{"SSH-2.0-OpenSSH\r\n\r\n"}}; });
    Error e = f.Fails(Get("/"));
    CHECK(e.code() == Code::kCorrupt);
    CHECK(e.message().find("malformed response") != std::string::npos);
  }
  SECTION("truncated body") {
    Fixture f([](const HttpRequest&) {
      return ScriptedReply{{"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly ten.."}};
    });
    Error e = f.Fails(Get("/"));
    CHECK(e.code() == Code::kIo);
    CHECK(e.message().find("before the response was complete") != std::string::npos);
  }
  SECTION("closed without an answer") {
    Fixture f([](const HttpRequest&) { return ScriptedReply{}; });
    Error e = f.Fails(Get("/"));
    CHECK(e.code() == Code::kIo);
    CHECK(e.message().find("without answering") != std::string::npos);
  }
  SECTION("reset mid-body") {
    Fixture f([](const HttpRequest&) {
      return ScriptedReply{{"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial"}, 0, ScriptedReply::After::kReset};
    });
    Error e = f.Fails(Get("/"));
    CHECK(e.code() == Code::kIo);
  }
  SECTION("body over the limit") {
    Fixture f([](const HttpRequest& req) {
      if (req.target == "/length") return ScriptedReply{{RawResponse(200, std::string(5000, 'x'))}};
      return ScriptedReply{{"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", EncodeChunk(std::string(3000, 'x')),
                            EncodeChunk(std::string(3000, 'x')), EncodeChunk("")}};
    });
    ClientRequest req = Get("/length");
    req.max_body_bytes = 4096;
    Error e = f.Fails(req);
    CHECK(e.code() == Code::kRefused);
    CHECK(e.message().find("4096") != std::string::npos);
    req.target = "/chunked";
    e = f.Fails(req);
    CHECK(e.code() == Code::kRefused);
  }
  SECTION("a host name is refused, after Send returns") {
    Fixture f([](const HttpRequest&) { return ScriptedReply{}; });
    bool called = false;
    std::optional<Result<HttpResponse>> out;
    f.client->Send("example.com", 80, Get("/"), [&](Result<HttpResponse> r) {
      called = true;
      out.emplace(std::move(r));
    });
    CHECK_FALSE(called);
    REQUIRE(test::RunUntil(&f.loop, [&] { return called; }));
    REQUIRE_FALSE(out->ok());
    CHECK(out->error().code() == Code::kInvalidArgument);
    CHECK(out->error().message().find("example.com") != std::string::npos);
  }
}

TEST_CASE("http client: cancel, destroy with requests in flight, re-entrant sends", "[http][client]") {
  SECTION("cancel runs the callback at once") {
    Fixture f([](const HttpRequest&) { return ScriptedReply{{}, 0, ScriptedReply::After::kKeepOpen, true}; });
    std::optional<Result<HttpResponse>> out;
    auto id = f.client->Send("127.0.0.1", f.server->port(), Get("/"), [&](Result<HttpResponse> r) { out.emplace(std::move(r)); });
    REQUIRE(test::RunUntil(&f.loop, [&] { return f.server->requests().size() == 1; }));
    CHECK(f.client->Cancel(id));
    REQUIRE(out.has_value());
    CHECK(out->error().code() == Code::kUnavailable);
    CHECK(out->error().message().find("cancelled") != std::string::npos);
    CHECK_FALSE(f.client->Cancel(id));
    CHECK(f.client->in_flight() == 0);
  }
  SECTION("destroying the client drops callbacks and leaks nothing") {
    Fixture f([](const HttpRequest&) { return ScriptedReply{{}, 0, ScriptedReply::After::kKeepOpen, true}; });
    int calls = 0;
    for (int i = 0; i < 5; ++i)
      f.client->Send("127.0.0.1", f.server->port(), Get("/"), [&](Result<HttpResponse>) { ++calls; });
    REQUIRE(test::RunUntil(&f.loop, [&] { return f.server->requests().size() == 5; }));
    f.client.reset();
    uv_run(&f.loop, UV_RUN_NOWAIT);
    CHECK(calls == 0);
    // Fixture::Shutdown asserts the loop closes clean.
  }
  SECTION("a callback may send the next request, and many run at once") {
    Fixture f([](const HttpRequest& r) { return ScriptedReply{{RawResponse(200, r.target)}}; });
    int done = 0;
    std::function<void(int)> chain = [&](int n) {
      f.client->Send("127.0.0.1", f.server->port(), Get("/" + std::to_string(n)), [&, n](Result<HttpResponse> r) {
        CHECK(r.ok());
        if (r.ok()) CHECK(r->body == "/" + std::to_string(n));
        ++done;
        if (n < 5) chain(n + 1);
      });
    };
    chain(1);
    for (int i = 0; i < 20; ++i)
      f.client->Send("localhost", f.server->port(), Get("/p" + std::to_string(i)), [&](Result<HttpResponse> r) {
        CHECK(r.ok());
        ++done;
      });
    REQUIRE(test::RunUntil(&f.loop, [&] { return done == 25; }));
    CHECK(f.client->in_flight() == 0);
  }
}

TEST_CASE("sse parser: line ends, comments, fields, splits", "[http][client]") {
  std::string stream = ":c\r\ndata:a\r\n\r\nevent: x\rdata: b\rdata:  c\r\rid: 9\ndata\n\nretry: 5\ndata: d\n\n";
  for (size_t split = 0; split <= stream.size(); ++split) {
    SseParser p;
    std::vector<ServerSentEvent> got;
    auto sink = [&](ServerSentEvent e) { got.push_back(std::move(e)); };
    p.Feed(std::string_view(stream).substr(0, split), sink);
    p.Feed(std::string_view(stream).substr(split), sink);
    INFO("split at " << split);
    REQUIRE(got.size() == 4);
    CHECK(got[0].data == "a");
    CHECK(got[1].event == "x");
    CHECK(got[1].data == "b\n c");
    CHECK(got[2].id == "9");
    CHECK(got[2].data == "");
    CHECK(got[3].data == "d");
  }
  SseParser p;
  int n = 0;
  p.Feed("data: never ended\n", [&](ServerSentEvent) { ++n; });
  CHECK(n == 0);  // no blank line, no event
}

}  // namespace
}  // namespace wsup::http
