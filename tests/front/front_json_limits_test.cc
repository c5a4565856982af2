// The shared JSON limits (common/json_limits.h) on the front process: deeply
// nested completion bodies, the one that used to overflow the front's stack
// among them, are answered 400 by the front itself (and never reach an
// engine), the front's pid stays the same and it goes on serving; nesting
// inside strings does not count; and a deep control message gets an error
// reply while its sender stays connected.
#include <catch2/catch.hpp>

#include <chrono>
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

namespace {

std::string Arrays(int depth) { return std::string(depth, '[') + std::string(depth, ']'); }

std::string Objects(int depth) {
  std::string s;
  s.reserve(static_cast<size_t>(depth) * 6 + 2);
  for (int i = 0; i < depth; ++i) s += "{\"a\":";
  s += "1";
  s += std::string(depth, '}');
  return s;
}


HttpResult Post(int port, const std::string& body) { return HttpRequestOnce(port, "POST", "/v1/completions", body, 30s); }

std::string Le32(uint32_t n) {
  std::string s(4, '\0');
  for (int i = 0; i < 4; ++i) s[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return s;
}

}  // namespace

TEST_CASE("deeply nested completion bodies get a 400 from the front, which keeps running", "[front][process]") {
  FakeEngine a("A");
  auto front = FrontProcess::Start({"--active", a.addr()});
  ControlClient ctl;
  REQUIRE(ctl.Connect(front->control_path()));
  const int64_t pid = FrontStatus(ctl)["pid"].get<int64_t>();
  REQUIRE(pid == front->child().pid());

  struct Case {
    const char* name;
    std::string body;
  };
  const int d = 70000;
  const std::vector<Case> refused = {
      // The body that crashed wsup-front with SIGSEGV (140 KB, 70,000 levels).
      {"deep arrays with stream", "{\"stream\":true,\"prompt\":" + Arrays(d) + "}"},
      {"deep objects with stream", "{\"stream\":true,\"prompt\":" + Objects(d) + "}"},
      {"deep arrays, not streamed", "{\"prompt\":" + Arrays(d) + ",\"max_tokens\":4}"},
      {"deep, stream false", "{\"stream\":false,\"prompt\":\"hi\",\"x\":" + Arrays(d) + "}"},
      {"deep and not even an object", Arrays(d)},
      // One level past the limit: the outer object is level 1.
      {"65 levels", "{\"stream\":true,\"prompt\":\"hi\",\"x\":" + Arrays(64) + "}"},
  };
  for (const auto& c : refused) {
    INFO(c.name);
    HttpResult r = Post(front->port(), c.body);
    REQUIRE(r.status == 400);
    CHECK(r.Header("Content-Type").find("application/json") != std::string::npos);
    json j = json::parse(r.body, nullptr, false);
    REQUIRE(j.is_object());
    CHECK(j["error"]["type"] == "invalid_request_error");
    const std::string msg = j["error"]["message"].get<std::string>();
    CHECK(msg.find("the request body is JSON nested deeper than the limit of 64 levels") != std::string::npos);
    CHECK(msg.find("send a JSON object such as") != std::string::npos);
    CHECK(front->child().running());
  }
  CHECK(a.requests.load() == 0);  // none of them reached the engine

  SECTION("nesting inside a string does not count, and the limit itself is allowed") {
    HttpResult r = Post(front->port(), "{\"stream\":true,\"max_tokens\":3,\"prompt\":\"" + Arrays(d) + "\"}");
    REQUIRE(r.status == 200);
    CHECK(a.completions.load() == 1);
    r = Post(front->port(), "{\"stream\":true,\"prompt\":\"hi\",\"max_tokens\":3,\"x\":" + Arrays(63) + "}");
    REQUIRE(r.status == 200);
    r = Post(front->port(), "{\"prompt\":\"hi\",\"max_tokens\":3,\"x\":" + Objects(63) + "}");
    REQUIRE(r.status == 200);
    CHECK(json::parse(r.body)["choices"][0]["text"] == FakeText(FakeGenerate(FakeTokenize("hi"), 3)));
    CHECK(a.completions.load() == 3);
  }
  SECTION("other routes are forwarded byte for byte, unparsed") {
    HttpResult r = HttpRequestOnce(front->port(), "POST", "/v1/whoami", Arrays(d), 30s);
    CHECK(r.status == 200);
    CHECK(r.body == "A");
  }

  // Same process, still serving, and the refusals are counted.
  json st = FrontStatus(ctl);
  CHECK(st["pid"].get<int64_t>() == pid);
  CHECK(st["counters"]["rejected_400"] == refused.size());
  HttpResult ok = Post(front->port(), R"({"prompt":"abc","max_tokens":4})");
  REQUIRE(ok.status == 200);
  CHECK(json::parse(ok.body)["choices"][0]["text"] == FakeText(FakeGenerate(FakeTokenize("abc"), 4)));
  CHECK(front->child().running());
}

TEST_CASE("a deeply nested control message gets an error reply and its sender stays", "[front][process]") {
  FakeEngine a("A");
  auto front = FrontProcess::Start({"--active", a.addr()});
  ControlClient ctl;
  REQUIRE(ctl.Connect(front->control_path()));
  for (const std::string& body : {"{\"type\":\"status\",\"x\":" + Arrays(30000) + "}", Objects(9000), Arrays(65)}) {
    INFO(body.substr(0, 30));
    REQUIRE(body.size() < 64 * 1024);  // within the frame limit: the nesting is what is refused
    REQUIRE(ctl.SendRaw(Le32(static_cast<uint32_t>(body.size())) + body));
    auto reply = ctl.Reply();
    REQUIRE(reply.ok());
    CHECK((*reply)["ok"] == false);
    CHECK((*reply)["error"].get<std::string>().find("nested deeper than the limit of 64 levels") !=
          std::string::npos);
  }
  // Up to the limit is fine.
  auto reply = ctl.Call(json::parse("{\"type\":\"status\",\"x\":" + Arrays(63) + "}"));
  REQUIRE(reply.ok());
  CHECK((*reply)["ok"] == true);
  CHECK(front->child().running());
  CHECK(HttpRequestOnce(front->port(), "GET", "/v1/whoami").body == "A");
}
