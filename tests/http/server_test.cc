#include <catch2/catch.hpp>

#include <poll.h>
#include <sys/socket.h>
#include <uv.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>

#include "http/server.h"
#include "testkit/http_client.h"
#include "testkit/test_util.h"

using namespace std::chrono_literals;
using wsup::http::HttpResponse;
using wsup::http::HttpServer;
using wsup::http::ResponseWriter;
using wsup::http::ServerOptions;
using wsup::test::HttpConn;
using wsup::test::HttpResult;

namespace {

// A server on its own loop thread. Stop() closes everything through the
// loop and checks that the loop then closes clean.
class ServerFixture {
 public:
  explicit ServerFixture(ServerOptions opts = {}) {
    REQUIRE(uv_loop_init(&loop_) == 0);
    server_ = std::make_unique<HttpServer>(&loop_, opts, [this](std::shared_ptr<ResponseWriter> w) { Handle(w); });
    auto st = server_->Listen();
    REQUIRE(st.ok());
    port_ = server_->port();
    stop_.data = this;
    uv_async_init(&loop_, &stop_, [](uv_async_t* a) {
      auto* self = static_cast<ServerFixture*>(a->data);
      self->server_->Close([self] { uv_close(reinterpret_cast<uv_handle_t*>(&self->stop_), nullptr); });
    });
    thread_ = std::thread([this] { uv_run(&loop_, UV_RUN_DEFAULT); });
  }
  ~ServerFixture() { Stop(); }

  void Stop() {
    if (!thread_.joinable()) return;
    uv_async_send(&stop_);
    thread_.join();
    server_.reset();
    CHECK(uv_loop_close(&loop_) == 0);
  }

  int port() const { return port_; }
  std::atomic<int> closed_while_streaming{0};
  std::atomic<int> handled{0};
  std::atomic<int> closed_while_held{0};

 private:
  void Handle(std::shared_ptr<ResponseWriter> w) {
    ++handled;
    const auto& r = w->request();
    if (r.path == "/echo") {
      HttpResponse resp = HttpResponse::Text(200, r.method + " " + r.body);
      w->Send(std::move(resp));
    } else if (r.path == "/slow") {
      // Answers after a timer, so a pipelined request behind it must wait.
      auto* t = new uv_timer_t;
      uv_timer_init(&loop_, t);
      t->data = new std::shared_ptr<ResponseWriter>(w);
      uv_timer_start(
          t,
          [](uv_timer_t* t) {
            auto* wp = static_cast<std::shared_ptr<ResponseWriter>*>(t->data);
            (*wp)->Send(HttpResponse::Text(200, "slow"));
            delete wp;
            uv_close(reinterpret_cast<uv_handle_t*>(t), [](uv_handle_t* h) { delete reinterpret_cast<uv_timer_t*>(h); });
          },
          50, 0);
    } else if (r.path == "/stream") {
      w->StartStream(200, {{"Content-Type", "text/event-stream"}});
      for (int i = 0; i < 3; ++i) w->Write(wsup::http::SseEvent(std::to_string(i)));
      w->Write(wsup::http::SseEvent("[DONE]"));
      w->End();
    } else if (r.path == "/hang") {
      // Never answers; records when the connection goes away.
      w->StartStream(200, {{"Content-Type", "text/event-stream"}});
      w->Write(wsup::http::SseEvent("first"));
      hanging_.push_back(w);
      w->OnClose([this] { ++closed_while_streaming; });
    } else if (r.path == "/hold") {
      // A non-streamed answer that never comes (a long completion); records
      // when the connection goes away.
      hanging_.push_back(w);
      w->OnClose([this] { ++closed_while_held; });
    } else {
      w->Send(HttpResponse::Json(404, wsup::http::ErrorJson("no route " + r.path, "not_found")));
    }
  }

  uv_loop_t loop_;
  uv_async_t stop_;
  std::unique_ptr<HttpServer> server_;
  std::vector<std::shared_ptr<ResponseWriter>> hanging_;
  int port_ = 0;
  std::thread thread_;
};

}  // namespace

TEST_CASE("server: keep-alive serves several requests on one connection and echoes X-Request-Id") {
  ServerFixture f;
  HttpConn c;
  REQUIRE(c.Connect(f.port()));
  REQUIRE(c.Send(wsup::test::FormatRequest("POST", "/echo", "one", {{"X-Request-Id", "rid-1"}})));
  HttpResult a = c.Read(5s);
  REQUIRE(a.status == 200);
  CHECK(a.body == "POST one");
  CHECK(a.Header("X-Request-Id") == "rid-1");
  CHECK(a.Header("Connection") == "keep-alive");
  REQUIRE(c.Send(wsup::test::FormatRequest("GET", "/echo", "")));
  HttpResult b = c.Read(5s);
  REQUIRE(b.status == 200);
  CHECK(b.body == "GET ");
  CHECK_FALSE(b.Header("X-Request-Id").empty());  // made up when absent
  REQUIRE(c.Send(wsup::test::FormatRequest("GET", "/nope", "")));
  CHECK(c.Read(5s).status == 404);
}

TEST_CASE("server: pipelined requests are answered in order") {
  ServerFixture f;
  HttpConn c;
  REQUIRE(c.Connect(f.port()));
  std::string reqs = wsup::test::FormatRequest("GET", "/slow", "") + wsup::test::FormatRequest("POST", "/echo", "x") +
                     wsup::test::FormatRequest("GET", "/stream", "");
  REQUIRE(c.Send(reqs));
  HttpResult r1 = c.Read(5s);
  HttpResult r2 = c.Read(5s);
  HttpResult r3 = c.Read(5s);
  CHECK(r1.body == "slow");
  CHECK(r2.body == "POST x");
  CHECK(r3.chunked);
  CHECK(wsup::test::SseData(r3.body) == std::vector<std::string>{"0", "1", "2", "[DONE]"});
}

TEST_CASE("server: chunked request bodies and Expect: 100-continue") {
  ServerFixture f;
  HttpConn c;
  REQUIRE(c.Connect(f.port()));
  REQUIRE(c.Send("POST /echo HTTP/1.1\r\nExpect: 100-continue\r\nTransfer-Encoding: chunked\r\n\r\n"));
  // The interim answer arrives before the body is sent.
  REQUIRE(c.Send("4\r\nbody\r\n0\r\n\r\n"));
  HttpResult r = c.Read(5s);
  CHECK(r.status == 200);
  CHECK(r.body == "POST body");
}

TEST_CASE("server: HTTP/1.0 streams end with the connection") {
  ServerFixture f;
  HttpConn c;
  REQUIRE(c.Connect(f.port()));
  REQUIRE(c.Send("GET /stream HTTP/1.0\r\n\r\n"));
  HttpResult r = c.Read(5s);
  CHECK(r.status == 200);
  CHECK_FALSE(r.chunked);
  CHECK(wsup::test::SseData(r.body).size() == 4);
}

TEST_CASE("server: limits answer 413 and 431 and close") {
  ServerOptions o;
  o.limits.max_body_bytes = 1000;
  o.limits.max_headers = 8;
  o.limits.max_header_bytes = 2000;
  ServerFixture f(o);
  SECTION("body over the limit, announced") {
    HttpConn c;
    REQUIRE(c.Connect(f.port()));
    // Sent whole: the server must answer without resetting the connection.
    REQUIRE(c.Send(wsup::test::FormatRequest("POST", "/echo", std::string(200000, 'a'))));
    HttpResult r = c.Read(5s);
    CHECK(r.status == 413);
    CHECK(r.body.find("exceeds the limit of 1000 bytes") != std::string::npos);
    CHECK(r.Header("Connection") == "close");
    CHECK(c.WaitClosed(5s));
  }
  SECTION("too many headers") {
    HttpConn c;
    REQUIRE(c.Connect(f.port()));
    std::string req = "GET /echo HTTP/1.1\r\n";
    for (int i = 0; i < 20; ++i) {
      // Appended piece by piece: GCC 12 -O3 gives a false -Wrestrict error on `"H" + std::to_string(i)`.
      req += 'H';
      req += std::to_string(i);
      req += ": v\r\n";
    }
    REQUIRE(c.Send(req + "\r\n"));
    CHECK(c.Read(5s).status == 431);
    CHECK(c.WaitClosed(5s));
  }
  SECTION("header bytes over the limit") {
    HttpConn c;
    REQUIRE(c.Connect(f.port()));
    REQUIRE(c.Send("GET /echo HTTP/1.1\r\nX-Big: " + std::string(5000, 'b') + "\r\n\r\n"));
    CHECK(c.Read(5s).status == 431);
  }
  // The server keeps serving others.
  CHECK(wsup::test::HttpRequestOnce(f.port(), "GET", "/echo").status == 200);
}

TEST_CASE("server: malformed requests get 400 and a closed connection, after earlier answers") {
  ServerFixture f;
  HttpConn c;
  REQUIRE(c.Connect(f.port()));
  REQUIRE(c.Send(wsup::test::FormatRequest("GET", "/slow", "") + "\x16\x03\x01 not http\r\n\r\n"));
  HttpResult first = c.Read(5s);
  CHECK(first.body == "slow");
  HttpResult bad = c.Read(5s);
  CHECK(bad.status == 400);
  CHECK(bad.body.find("malformed HTTP request") != std::string::npos);
  CHECK(c.WaitClosed(5s));
  CHECK(wsup::test::HttpRequestOnce(f.port(), "GET", "/echo").status == 200);
}

TEST_CASE("server: a client sending one byte at a time is cut off by the header timeout") {
  ServerOptions o;
  o.header_timeout_ms = 300;
  ServerFixture f(o);
  HttpConn c;
  REQUIRE(c.Connect(f.port()));
  std::string req = wsup::test::FormatRequest("GET", "/echo", "");
  auto start = std::chrono::steady_clock::now();
  bool cut = false;
  for (size_t i = 0; i < req.size() - 1; ++i) {
    if (!c.Send(req.substr(i, 1))) {
      cut = true;
      break;
    }
    // The pause between bytes is a bounded wait for the server's answer.
    pollfd p{c.fd(), POLLIN, 0};
    if (::poll(&p, 1, 60) == 1) {
      cut = true;
      break;
    }
  }
  REQUIRE(cut);
  HttpResult r = c.Read(5s);
  CHECK(r.status == 408);
  CHECK(c.WaitClosed(5s));
  auto elapsed = std::chrono::steady_clock::now() - start;
  CHECK(elapsed < 3s);
}

TEST_CASE("server: idle keep-alive connections and silent connections are closed") {
  ServerOptions o;
  o.idle_timeout_ms = 200;
  o.header_timeout_ms = 200;
  ServerFixture f(o);
  HttpConn c;
  REQUIRE(c.Connect(f.port()));
  REQUIRE(c.Send(wsup::test::FormatRequest("GET", "/echo", "")));
  REQUIRE(c.Read(5s).status == 200);
  CHECK(c.WaitClosed(3s));
  HttpConn silent;
  REQUIRE(silent.Connect(f.port()));
  CHECK(silent.WaitClosed(3s));
}

TEST_CASE("server: a client that vanishes mid-stream is noticed - closing with open connections is clean") {
  auto f = std::make_unique<ServerFixture>();
  {
    HttpConn c;
    REQUIRE(c.Connect(f->port()));
    REQUIRE(c.Send(wsup::test::FormatRequest("GET", "/hang", "")));
    REQUIRE(wsup::test::WaitFor([&] { return f->handled.load() == 1; }, 5s));
  }
  CHECK(wsup::test::WaitFor([&] { return f->closed_while_streaming.load() == 1; }, 5s));
  // Open connections, one mid-request and one streaming, at the time of Close().
  HttpConn a, b;
  REQUIRE(a.Connect(f->port()));
  REQUIRE(a.Send("GET /echo HTTP/1.1\r\nHost"));
  REQUIRE(b.Connect(f->port()));
  REQUIRE(b.Send(wsup::test::FormatRequest("GET", "/hang", "")));
  REQUIRE(wsup::test::WaitFor([&] { return f->handled.load() == 2; }, 5s));
  f->Stop();  // checks uv_loop_close() == 0
  CHECK(f->closed_while_streaming.load() == 2);
  CHECK(a.WaitClosed(5s));
  CHECK(b.WaitClosed(5s));
}

// A connection that sent `requests` and, once the first is in the handler,
// shut its sending side (a plain EOF: nothing was read before it).
HttpConn HalfClosedAfter(ServerFixture& f, const std::string& requests) {
  HttpConn c;
  REQUIRE(c.Connect(f.port()));
  REQUIRE(c.Send(requests));
  REQUIRE(wsup::test::WaitFor([&] { return f.handled.load() == 1; }, 5s));
  REQUIRE(::shutdown(c.fd(), SHUT_WR) == 0);
  return c;
}

TEST_CASE("server: a peer's EOF with a request in flight cancels it - serve_half_closed keeps answering") {
  SECTION("by default the client is gone: OnClose runs and the connection closes") {
    ServerFixture f;
    // Nothing is read before the FIN, so the peer sends a plain EOF, not a reset.
    HttpConn c = HalfClosedAfter(f, wsup::test::FormatRequest("GET", "/hold", ""));
    CHECK(wsup::test::WaitFor([&] { return f.closed_while_held.load() == 1; }, 5s));
    CHECK(c.WaitClosed(5s));
  }
  SECTION("by default, requests pipelined behind the one in flight are dropped unanswered") {
    ServerFixture f;
    HttpConn c = HalfClosedAfter(
        f, wsup::test::FormatRequest("GET", "/hold", "") + wsup::test::FormatRequest("GET", "/echo", ""));
    CHECK(wsup::test::WaitFor([&] { return f.closed_while_held.load() == 1; }, 5s));
    HttpResult r = c.Read(5s);
    CHECK(r.status == 0);  // closed without an answer
    CHECK(f.handled.load() == 1);  // the /echo behind it never reached the handler
  }
  SECTION("by default, an answer that was still to come never comes") {
    ServerFixture f;
    HttpConn c = HalfClosedAfter(f, wsup::test::FormatRequest("GET", "/slow", ""));
    HttpResult r = c.Read(5s);
    CHECK(r.status == 0);
    CHECK_FALSE(r.error.empty());
  }
  SECTION("serve_half_closed: a half-closed peer still reads its answers, in order") {
    ServerOptions o;
    o.serve_half_closed = true;
    ServerFixture f(o);
    HttpConn c = HalfClosedAfter(
        f, wsup::test::FormatRequest("GET", "/slow", "") + wsup::test::FormatRequest("POST", "/echo", "x"));
    HttpResult a = c.Read(5s);
    CHECK(a.status == 200);
    CHECK(a.body == "slow");
    HttpResult b = c.Read(5s);
    CHECK(b.status == 200);
    CHECK(b.body == "POST x");
    CHECK(c.WaitClosed(5s));  // and the connection ends after the last answer
    CHECK(f.closed_while_held.load() == 0);
  }
  SECTION("serve_half_closed: a held request is not cancelled by the EOF, only by the close") {
    ServerOptions o;
    o.serve_half_closed = true;
    auto f = std::make_unique<ServerFixture>(o);
    HttpConn c = HalfClosedAfter(
        *f, wsup::test::FormatRequest("GET", "/hold", "") + wsup::test::FormatRequest("GET", "/slow", ""));
    // A second connection's answer comes after the EOF was read on the first
    // (one loop thread, events in order): the held one is still open.
    HttpResult r = wsup::test::HttpRequestOnce(f->port(), "GET", "/slow", "", 5s);
    CHECK(r.status == 200);
    CHECK(f->closed_while_held.load() == 0);
    f->Stop();
    CHECK(f->closed_while_held.load() == 1);
  }
}

TEST_CASE("server: connections past the limit are refused, the rest served") {
  ServerOptions o;
  o.max_connections = 2;
  ServerFixture f(o);
  HttpConn a, b, c;
  REQUIRE(a.Connect(f.port()));
  REQUIRE(b.Connect(f.port()));
  REQUIRE(a.Send(wsup::test::FormatRequest("GET", "/echo", "")));
  REQUIRE(a.Read(5s).status == 200);
  REQUIRE(c.Connect(f.port()));
  CHECK(c.WaitClosed(5s));
  REQUIRE(b.Send(wsup::test::FormatRequest("GET", "/echo", "")));
  CHECK(b.Read(5s).status == 200);
}

TEST_CASE("server: listening on a taken port or a bad host names the fix") {
  uv_loop_t loop;
  REQUIRE(uv_loop_init(&loop) == 0);
  {
    HttpServer a(&loop, ServerOptions{}, [](std::shared_ptr<ResponseWriter>) {});
    REQUIRE(a.Listen().ok());
    ServerOptions o;
    o.port = a.port();
    HttpServer b(&loop, o, [](std::shared_ptr<ResponseWriter>) {});
    auto st = b.Listen();
    REQUIRE_FALSE(st.ok());
    CHECK(st.error().message().find("pick another port") != std::string::npos);
    ServerOptions bad;
    bad.host = "localhost.invalid";
    HttpServer c(&loop, bad, [](std::shared_ptr<ResponseWriter>) {});
    CHECK(c.Listen().code() == wsup::Code::kInvalidArgument);
    a.Close();
    b.Close();
    c.Close();
    uv_run(&loop, UV_RUN_DEFAULT);
  }
  CHECK(uv_loop_close(&loop) == 0);
}
