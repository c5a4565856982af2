#include <catch2/catch.hpp>

#include "http/request.h"
#include "http/response.h"

using wsup::http::HttpRequest;
using wsup::http::ParserLimits;
using wsup::http::RequestParser;

namespace {
std::vector<HttpRequest> FeedAll(RequestParser& p, const std::string& bytes, bool one_at_a_time = false) {
  std::vector<HttpRequest> out;
  if (one_at_a_time) {
    for (char c : bytes) p.Feed(&c, 1, &out);
  } else {
    p.Feed(bytes.data(), bytes.size(), &out);
  }
  return out;
}
}  // namespace

TEST_CASE("parser: a request split into single bytes comes out whole") {
  RequestParser p;
  std::string req =
      "POST /v1/completions?x=1 HTTP/1.1\r\nHost: a\r\nX-Request-Id: abc\r\nContent-Length: 5\r\n\r\nhello";
  auto out = FeedAll(p, req, true);
  REQUIRE(out.size() == 1);
  CHECK(out[0].method == "POST");
  CHECK(out[0].path == "/v1/completions");
  CHECK(out[0].query == "x=1");
  CHECK(out[0].body == "hello");
  REQUIRE(out[0].FindHeader("x-request-id") != nullptr);
  CHECK(*out[0].FindHeader("x-request-id") == "abc");
  CHECK(out[0].keep_alive);
  CHECK_FALSE(p.in_request());
}

TEST_CASE("parser: pipelined requests come out in order, chunked bodies decoded") {
  RequestParser p;
  std::string bytes =
      "GET /a HTTP/1.1\r\n\r\n"
      "POST /b HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
      "GET /c HTTP/1.0\r\n\r\n";
  auto out = FeedAll(p, bytes);
  REQUIRE(out.size() == 3);
  CHECK(out[0].path == "/a");
  CHECK(out[1].body == "abcde");
  CHECK(out[2].path == "/c");
  CHECK_FALSE(out[2].keep_alive);
}

TEST_CASE("parser: limits give 413 and 431, garbage gives 400") {
  SECTION("content-length over the body limit is refused before the body") {
    RequestParser p(ParserLimits{16 * 1024, 64, 10});
    auto out = FeedAll(p, "POST / HTTP/1.1\r\nContent-Length: 11\r\n\r\n");
    CHECK(out.empty());
    CHECK(p.failed());
    CHECK(p.error().status == 413);
    CHECK(p.error().message.find("limit of 10 bytes") != std::string::npos);
  }
  SECTION("chunked body over the limit") {
    RequestParser p(ParserLimits{16 * 1024, 64, 4});
    FeedAll(p, "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n3\r\ndef\r\n0\r\n\r\n");
    CHECK(p.error().status == 413);
  }
  SECTION("too many headers") {
    RequestParser p(ParserLimits{16 * 1024, 3, 100});
    FeedAll(p, "GET / HTTP/1.1\r\na: 1\r\nb: 2\r\nc: 3\r\nd: 4\r\n\r\n");
    CHECK(p.error().status == 431);
  }
  SECTION("headers over the byte limit") {
    RequestParser p(ParserLimits{100, 64, 100});
    FeedAll(p, "GET / HTTP/1.1\r\nX-Big: " + std::string(200, 'x') + "\r\n\r\n", true);
    CHECK(p.error().status == 431);
  }
  SECTION("garbage") {
    RequestParser p;
    FeedAll(p, std::string("\x01\x02\x03 garbage\r\n\r\n"));
    CHECK(p.failed());
    CHECK(p.error().status == 400);
    // Everything after an error is ignored.
    std::vector<HttpRequest> out;
    CHECK_FALSE(p.Feed("GET / HTTP/1.1\r\n\r\n", 18, &out));
    CHECK(out.empty());
  }
  SECTION("both content-length and chunked") {
    RequestParser p;
    FeedAll(p, "POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n");
    CHECK(p.error().status == 400);
  }
  SECTION("a transfer coding other than chunked alone is refused") {
    for (const char* te : {"gzip, chunked", "gzip", "deflate,chunked", "chunked, identity", "identity"}) {
      INFO(te);
      RequestParser p;
      auto out = FeedAll(p, std::string("POST / HTTP/1.1\r\nTransfer-Encoding: ") + te +
                                "\r\n\r\n3\r\nabc\r\n0\r\n\r\n");
      CHECK(out.empty());
      CHECK(p.error().status == 501);
      CHECK(p.error().message.find("Transfer-Encoding") != std::string::npos);
    }
    RequestParser twice;
    FeedAll(twice, "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n");
    CHECK(twice.error().status == 400);
    RequestParser ok;
    auto out = FeedAll(ok, "POST / HTTP/1.1\r\nTransfer-Encoding: Chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n");
    REQUIRE(out.size() == 1);
    CHECK(out[0].body == "abc");
  }
  SECTION("upgrade is refused") {
    RequestParser p;
    FeedAll(p, "GET / HTTP/1.1\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n");
    CHECK(p.error().status == 501);
  }
}

TEST_CASE("response formats") {
  CHECK(wsup::http::EncodeChunk("hello") == "5\r\nhello\r\n");
  CHECK(wsup::http::EncodeChunk("") == "0\r\n\r\n");
  CHECK(wsup::http::SseEvent("{}") == "data: {}\n\n");
  CHECK(wsup::http::SerializeHead(404, {{"A", "b"}}) == "HTTP/1.1 404 Not Found\r\nA: b\r\n\r\n");
  // Invalid UTF-8 from a peer must not make error rendering throw.
  CHECK(wsup::http::ErrorJson("bad \xff byte", "invalid_request_error").find("invalid_request_error") !=
        std::string::npos);
}
