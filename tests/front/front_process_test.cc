// The front as a real process (build/bin/wsup-front) between test clients
// and in-test fake engines: routing, failover, retry, stream resume,
// queueing, hostile clients and hostile control messages.
#include <catch2/catch.hpp>

#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include <nlohmann/json.hpp>

#include "tests/front/fake_engine.h"
#include "tests/front/front_harness.h"
#include "testkit/http_client.h"
#include "testkit/test_util.h"

using namespace std::chrono_literals;
using nlohmann::json;
using namespace wsup::test;  // the front's harness and the shared test support

namespace {


HttpResult Post(int port, const std::string& body, const std::vector<std::pair<std::string, std::string>>& headers = {}) {
  return HttpRequestOnce(port, "POST", "/v1/completions", body, 30s, headers);
}

// A front over fake engines `a` (active) and `b` (standby), its control
// socket connected through *ctl.
std::unique_ptr<FrontProcess> StartFront(FakeEngine& a, FakeEngine& b, ControlClient* ctl) {
  auto front = FrontProcess::Start({"--active", a.addr(), "--standby", b.addr()});
  REQUIRE(ctl->Connect(front->control_path()));
  return front;
}

// The JSON events of an SSE body, without [DONE]; `done` says whether it came.
std::vector<json> Events(const std::string& body, bool* done) {
  std::vector<json> out;
  *done = false;
  for (const auto& d : wsup::test::SseData(body)) {
    if (d == "[DONE]") {
      *done = true;
      continue;
    }
    out.push_back(json::parse(d));
  }
  return out;
}

// A streamed chat through the front: its events, [DONE] checked.
std::vector<json> ChatStream(int port, const json& body) {
  HttpResult r = HttpRequestOnce(port, "POST", "/v1/chat/completions", body.dump(), 30s);
  REQUIRE(r.status == 200);
  bool done = false;
  auto events = Events(r.body, &done);
  CHECK(done);
  return events;
}

std::string StreamText(const std::vector<json>& events) {
  std::string s;
  for (const auto& e : events) s += e["choices"][0]["text"].get<std::string>();
  return s;
}

std::string Le32(uint32_t n) {
  std::string s(4, '\0');
  for (int i = 0; i < 4; ++i) s[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return s;
}

// Reads from a raw connection until `needle` shows up (bounded).
bool ReadUntil(int fd, const std::string& needle, std::string* got, std::chrono::milliseconds limit) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (got->find(needle) == std::string::npos) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) != 1) return false;
    char buf[4096];
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) return false;
    got->append(buf, static_cast<size_t>(n));
  }
  return true;
}

}  // namespace

TEST_CASE("the front forwards the OpenAI routes and /health only - an engine's control routes get 404 at the front",
          "[front][process]") {
  FakeEngine a("A"), b("B");
  ControlClient ctl;
  auto front = StartFront(a, b, &ctl);
  const int before = a.requests.load() + b.requests.load();
  struct Try {
    std::string method, target, body;
  };
  const std::vector<Try> refused = {
      {"POST", "/wsup/role", R"({"role":"active","kv":"pool"})"},
      {"GET", "/wsup/status", ""},
      {"GET", "/wsup/status?x=1", ""},
      {"GET", "/wsup", ""},
      {"GET", "/", ""},
      {"GET", "/metrics", ""},
      {"GET", "/v1/../wsup/status", ""},
      {"GET", "/v1/./whoami", ""},
      {"GET", "/v1", ""},
      {"GET", "/healthz", ""},
      {"GET", "http://127.0.0.1/wsup/status", ""},
  };
  for (const auto& t : refused) {
    INFO(t.method << " " << t.target);
    HttpResult r = HttpRequestOnce(front->port(), t.method, t.target, t.body, 10s);
    CHECK(r.status == 404);
    CHECK(r.body.find("/v1/") != std::string::npos);  // says what it does serve
  }
  // No engine saw any of them.
  CHECK(a.requests.load() + b.requests.load() == before);
  json counters = FrontStatus(ctl)["counters"];
  CHECK(counters.value("not_forwarded", 0) == static_cast<int>(refused.size()));
  // What the front is for still goes through.
  CHECK(HttpRequestOnce(front->port(), "GET", "/v1/whoami").body == "A");
  CHECK(HttpRequestOnce(front->port(), "GET", "/health").status == 200);
  CHECK(Post(front->port(), R"({"prompt":"hi","max_tokens":2})").status == 200);
}

TEST_CASE("set_routes takes effect for the next request while in-flight ones finish", "[front][process]") {
  FakeEngine a("A"), b("B");
  ControlClient ctl;
  auto front = StartFront(a, b, &ctl);

  HttpResult r = HttpRequestOnce(front->port(), "GET", "/v1/whoami", "", 10s, {{"X-Request-Id", "trace-123"}});
  REQUIRE(r.status == 200);
  CHECK(r.body == "A");
  CHECK(r.Header("X-Engine") == "A");
  CHECK(r.Header("X-Request-Id") == "trace-123");
  CHECK(a.last_request_id() == "trace-123");
  r = HttpRequestOnce(front->port(), "GET", "/v1/whoami");
  CHECK(r.status == 200);
  CHECK_FALSE(r.Header("X-Request-Id").empty());
  CHECK(a.last_request_id() == r.Header("X-Request-Id"));

  // A slow stream in flight on A while the route moves to B.
  a.token_delay_ms = 15;
  HttpResult streamed;
  std::thread t([&] { streamed = Post(front->port(), R"({"prompt":"hi","stream":true,"max_tokens":10})"); });
  REQUIRE(WaitFor([&] { return a.streams_active.load() == 1; }, 10s));
  json st = FrontStatus(ctl);
  CHECK(st["inflight"][a.addr()] == 1);
  CHECK(st["inflight"][b.addr()] == 0);
  CHECK(st["active"] == a.addr());

  auto reply = ctl.Call(SetRoutes(b.addr(), a.addr(), 1));
  REQUIRE(reply.ok());
  CHECK((*reply)["ok"] == true);
  CHECK((*reply)["epoch"] == 1);
  r = HttpRequestOnce(front->port(), "GET", "/v1/whoami");
  CHECK(r.body == "B");  // the very next request
  CHECK(a.streams_active.load() == 1);  // the old one is still streaming from A
  t.join();

  REQUIRE(streamed.status == 200);
  CHECK(streamed.Header("X-Engine") == "A");
  bool done = false;
  auto events = Events(streamed.body, &done);
  CHECK(done);
  CHECK(events.size() == 10);
  CHECK(StreamText(events) == FakeText(FakeGenerate(FakeTokenize("hi"), 10)));

  auto first_ok = ctl.WaitEvent("first_ok", "backend", b.addr());
  REQUIRE(first_ok.ok());
  CHECK((*first_ok)["backend"] == b.addr());
  CHECK((*first_ok)["at_ms"].is_number_integer());

  st = FrontStatus(ctl);
  CHECK(st["active"] == b.addr());
  CHECK(st["standby"] == a.addr());
  CHECK(st["epoch"] == 1);
  CHECK(st["inflight"][a.addr()] == 0);
  CHECK(st["counters"]["requests"] == 4);
  CHECK(st["counters"]["ok"] == 4);
  CHECK(st["counters"]["failed"] == 0);
  CHECK(st["counters"]["switched_self"] == 0);

  // A stale epoch is refused and changes nothing.
  reply = ctl.Call(SetRoutes(a.addr(), "", 0));
  REQUIRE(reply.ok());
  CHECK((*reply)["ok"] == false);
  CHECK((*reply)["error"].get<std::string>().find("epoch") != std::string::npos);

  // New queue limits (a reload): bad fields refused naming them, good ones taken.
  reply = ctl.Call(json{{"type", "set_limits"}, {"queue_timeout_ms", -1}, {"max_queued", 5}});
  REQUIRE(reply.ok());
  CHECK((*reply)["ok"] == false);
  CHECK((*reply)["error"].get<std::string>().find("queue_timeout_ms") != std::string::npos);
  reply = ctl.Call(json{{"type", "set_limits"}, {"queue_timeout_ms", 2000}, {"max_queued", 5}});
  REQUIRE(reply.ok());
  CHECK((*reply)["ok"] == true);
  CHECK(HttpRequestOnce(front->port(), "GET", "/v1/whoami").body == "B");

  // Hedging settings: all three or none, each in its range; good ones show in status.
  for (const auto& [bad, key] : std::vector<std::pair<json, std::string>>{
           {{{"hedge_after_ms", 100}}, "hedge_percent"},
           {{{"hedge_after_ms", 100}, {"hedge_percent", 10}, {"hedge_burst", "16"}}, "hedge_burst"},
           {{{"hedge_after_ms", -5}, {"hedge_percent", 10}, {"hedge_burst", 16}}, "hedge_after_ms"},
           {{{"hedge_after_ms", 100}, {"hedge_percent", 250}, {"hedge_burst", 16}}, "hedge_percent"},
           {{{"hedge_after_ms", 100}, {"hedge_percent", 10}, {"hedge_burst", 0}}, "hedge_burst"},
           {{{"hedge_after_ms", 100}, {"hedge_percent", 10}, {"hedge_burst", int64_t{1} << 40}}, "hedge_burst"}}) {
    json m = {{"type", "set_limits"}, {"queue_timeout_ms", 2000}, {"max_queued", 5}};
    m.update(bad);
    reply = ctl.Call(m);
    REQUIRE(reply.ok());
    INFO(m.dump() << " -> " << reply->dump());
    CHECK((*reply)["ok"] == false);
    CHECK((*reply)["error"].get<std::string>().find(key) != std::string::npos);
  }
  CHECK(FrontStatus(ctl)["hedging"]["after_ms"] == 0);
  reply = ctl.Call(json{{"type", "set_limits"}, {"queue_timeout_ms", 2000}, {"max_queued", 5}, {"hedge_after_ms", 150},
                        {"hedge_percent", 5}, {"hedge_burst", 4}});
  REQUIRE(reply.ok());
  CHECK((*reply)["ok"] == true);
  json hedging = FrontStatus(ctl)["hedging"];
  CHECK(hedging["after_ms"] == 150);
  CHECK(hedging["percent"] == 5);
  CHECK(hedging["burst"] == 4);
  CHECK(hedging["budget"] == 4);
}

TEST_CASE("an active engine that refuses connections is replaced by the standby", "[front][process]") {
  RefusingPort dead;
  FakeEngine b("B");
  auto front = FrontProcess::Start({"--active", dead.addr(), "--standby", b.addr()});
  ControlClient ctl;
  REQUIRE(ctl.Connect(front->control_path()));

  ControlClient watcher;  // events go to every control client
  REQUIRE(watcher.Connect(front->control_path()));
  CHECK(FrontStatus(watcher)["active"] == dead.addr());

  HttpResult r = Post(front->port(), R"({"prompt":"abc","max_tokens":4})");
  REQUIRE(r.status == 200);
  CHECK(r.Header("X-Engine") == "B");
  CHECK(json::parse(r.body)["choices"][0]["text"] == FakeText(FakeGenerate(FakeTokenize("abc"), 4)));
  CHECK(watcher.WaitEvent("switched").ok());

  auto ev = ctl.WaitEvent("switched");
  REQUIRE(ev.ok());
  CHECK((*ev)["from"] == dead.addr());
  CHECK((*ev)["to"] == b.addr());
  CHECK((*ev)["reason"].get<std::string>().find("refused") != std::string::npos);
  auto ok = ctl.WaitEvent("first_ok", "backend", b.addr());
  REQUIRE(ok.ok());
  CHECK((*ok)["backend"] == b.addr());

  json st = FrontStatus(ctl);
  CHECK(st["active"] == b.addr());
  CHECK(st["standby"].is_null());
  CHECK(st["counters"]["switched_self"] == 1);
  CHECK(st["counters"]["ok"] == 1);
}

TEST_CASE("an engine that dies before answering: the request is sent again once", "[front][process]") {
  FakeEngine a("A"), b("B");
  SECTION("to the standby, which answers") {
    a.mode = FakeEngine::kCloseOnRequest;
    auto front = FrontProcess::Start({"--active", a.addr(), "--standby", b.addr()});
    ControlClient ctl;
    REQUIRE(ctl.Connect(front->control_path()));
    HttpResult r = Post(front->port(), R"({"prompt":"abc","max_tokens":4})");
    REQUIRE(r.status == 200);
    CHECK(r.Header("X-Engine") == "B");
    CHECK(a.requests.load() == 1);
    CHECK(b.completions.load() == 1);
    json st = FrontStatus(ctl);
    CHECK(st["counters"]["retried"] == 1);
    CHECK(st["counters"]["switched_self"] == 1);
    CHECK(st["active"] == b.addr());
    auto ev = ctl.WaitEvent("switched");
    REQUIRE(ev.ok());
    CHECK((*ev)["reason"].get<std::string>().find("before answering") != std::string::npos);
  }
  SECTION("and no more than once") {
    a.mode = FakeEngine::kCloseOnRequest;
    auto front = FrontProcess::Start({"--active", a.addr()});
    ControlClient ctl;
    REQUIRE(ctl.Connect(front->control_path()));
    HttpResult r = Post(front->port(), R"({"prompt":"abc","max_tokens":4})");
    REQUIRE(r.status == 502);
    CHECK(json::parse(r.body)["error"]["message"].get<std::string>().find("sent again") != std::string::npos);
    CHECK(a.requests.load() == 2);
    json st = FrontStatus(ctl);
    CHECK(st["counters"]["retried"] == 1);
    CHECK(st["counters"]["failed"] == 1);
  }
  SECTION("after part of the answer reached the client, the client's connection is closed") {
    a.mode = FakeEngine::kPartialBody;
    auto front = FrontProcess::Start({"--active", a.addr(), "--standby", b.addr()});
    ControlClient ctl;
    REQUIRE(ctl.Connect(front->control_path()));
    HttpResult r = Post(front->port(), R"({"prompt":"abc","max_tokens":4})");
    CHECK(r.status == 0);  // not a complete response
    CHECK_FALSE(r.error.empty());
    CHECK(b.completions.load() == 0);  // not replayed once bytes were out
    json st = FrontStatus(ctl);
    CHECK(st["counters"]["failed"] == 1);
    CHECK(st["counters"]["ok"] == 0);
    // The front goes on serving, now from the standby.
    r = Post(front->port(), R"({"prompt":"abc","max_tokens":4})");
    CHECK(r.status == 200);
    CHECK(r.Header("X-Engine") == "B");
  }
}

TEST_CASE("a stream cut mid-way is resumed on the new active without gap or repeat", "[front][process]") {
  FakeEngine a("A"), b("B");
  a.mode = FakeEngine::kDieAfterTokens;
  a.die_after = 5;
  ControlClient ctl;
  auto front = StartFront(a, b, &ctl);

  SECTION("string prompt, client did not ask for token ids") {
    HttpResult r = Post(front->port(), R"({"prompt":"Hello","stream":true,"max_tokens":12})",
                        {{"X-Request-Id", "resume-me-1"}});
    REQUIRE(r.status == 200);
    // A sent it first, unmarked; B got the continuation under the same id,
    // marked as cut (its KV may be adopted: docs/kv_journal.md).
    CHECK(a.last_resume_mark().empty());
    CHECK(a.last_request_id() == "resume-me-1");
    CHECK(b.last_request_id() == "resume-me-1");
    CHECK(b.last_resume_mark() == "cut");
    bool done = false;
    auto events = Events(r.body, &done);
    CHECK(done);
    REQUIRE(events.size() == 12);
    CHECK(StreamText(events) == FakeText(FakeGenerate(FakeTokenize("Hello"), 12)));
    for (const auto& e : events) {
      CHECK_FALSE(e["choices"][0].contains("token_ids"));
      CHECK_FALSE(e["choices"][0].contains("prompt_token_ids"));
      CHECK(e["id"] == events[0]["id"]);
    }
    CHECK(events.back()["usage"]["prompt_tokens"] == 6);  // the fake tokenizer's BOS and 5 bytes
    CHECK(events.back()["usage"]["completion_tokens"] == 12);
    // B continued from the prompt plus the 5 delivered tokens.
    json resumed = json::parse(b.last_body());
    auto expect_prompt = FakeTokenize("Hello");
    auto first5 = FakeGenerate(FakeTokenize("Hello"), 5);
    expect_prompt.insert(expect_prompt.end(), first5.begin(), first5.end());
    CHECK(resumed["prompt"] == json(expect_prompt));
    CHECK(resumed["max_tokens"] == 7);

    // The same request uninterrupted (B only) gives the same stream; a
    // client's own marks (a resume, a probe that would jump the engine's
    // queue) never reach an engine.
    HttpResult plain = Post(front->port(), R"({"prompt":"Hello","stream":true,"max_tokens":12})",
                            {{"X-Wsup-Resume", "cut"}, {"X-Wsup-Probe", "semantic"}});
    REQUIRE(plain.status == 200);
    CHECK(b.last_resume_mark().empty());
    CHECK(b.last_probe_mark().empty());
    auto plain_events = Events(plain.body, &done);
    CHECK(StreamText(plain_events) == StreamText(events));

    json st = FrontStatus(ctl);
    CHECK(st["counters"]["resumed"] == 1);
    CHECK(st["counters"]["ok"] == 2);
    CHECK(st["counters"]["switched_self"] == 1);
  }
  SECTION("token id prompt, client asked for token ids") {
    HttpResult r = Post(front->port(), R"({"prompt":[1,2,3],"stream":true,"max_tokens":9,"return_token_ids":true})");
    REQUIRE(r.status == 200);
    bool done = false;
    auto events = Events(r.body, &done);
    CHECK(done);
    std::vector<int64_t> ids;
    for (const auto& e : events) {
      for (const auto& t : e["choices"][0]["token_ids"]) ids.push_back(t.get<int64_t>());
    }
    CHECK(ids == FakeGenerate({1, 2, 3}, 9));
  }
  SECTION("text prompt, the client asked for token ids: the prompt's ids come once, as the engine reported them") {
    HttpResult r = Post(front->port(), R"({"prompt":"Hey","stream":true,"max_tokens":9,"return_token_ids":true})");
    REQUIRE(r.status == 200);
    bool done = false;
    auto events = Events(r.body, &done);
    CHECK(done);
    int with_prompt = 0;
    for (const auto& e : events) {
      if (e["choices"][0].contains("prompt_token_ids")) {
        ++with_prompt;
        CHECK(e["choices"][0]["prompt_token_ids"] == json(FakeTokenize("Hey")));
      }
    }
    CHECK(with_prompt == 1);
    CHECK(events[0]["choices"][0].contains("prompt_token_ids"));
    CHECK(StreamText(events) == FakeText(FakeGenerate(FakeTokenize("Hey"), 9)));
  }
  SECTION("an engine that never reports the prompt's ids: the cut stream ends with an error, never a guess") {
    a.report_prompt_ids = false;
    HttpResult r = Post(front->port(), R"({"prompt":"Hello","stream":true,"max_tokens":12})");
    REQUIRE(r.status == 200);
    bool done = false;
    auto data = wsup::test::SseData(r.body);
    REQUIRE(data.size() >= 2);
    CHECK(data.back() == "[DONE]");
    json err = json::parse(data[data.size() - 2]);
    REQUIRE(err.contains("error"));
    CHECK(err["error"]["message"].get<std::string>().find("prompt_token_ids") != std::string::npos);
    // Five tokens came from A, then the error: nothing from a guess.
    auto events = Events(r.body, &done);
    CHECK(done);
    REQUIRE(!events.empty());
    events.pop_back();  // the error
    CHECK(StreamText(events) == FakeText(FakeGenerate(FakeTokenize("Hello"), 5)));
    CHECK(b.completions.load() == 0);
    json st = FrontStatus(ctl);
    CHECK(st["counters"]["resume_refused"] == 1);
    CHECK(st["counters"]["resumed"] == 0);
  }
  SECTION("the stream dies after its last token") {
    a.die_after = 6;
    HttpResult r = Post(front->port(), R"({"prompt":"Hi","stream":true,"max_tokens":6})");
    REQUIRE(r.status == 200);
    bool done = false;
    auto events = Events(r.body, &done);
    CHECK(done);
    CHECK(StreamText(events) == FakeText(FakeGenerate(FakeTokenize("Hi"), 6)));
    CHECK(b.completions.load() == 0);  // nothing left to ask for
  }
}

TEST_CASE("a chat stream cut mid-way is resumed as a token-id completion and reaches the client as one chat stream",
          "[front][process]") {
  FakeEngine a("A"), b("B");
  a.mode = FakeEngine::kDieAfterTokens;
  a.die_after = 5;
  ControlClient ctl;
  auto front = StartFront(a, b, &ctl);
  const json messages = json::array({{{"role", "system"}, {"content", "Be brief."}}, {{"role", "user"}, {"content", "Hi"}}});
  const std::vector<int64_t> prompt = FakeTokenize(FakeRender(messages));
  const std::vector<int64_t> golden = FakeGenerate(prompt, 12);

  SECTION("the client did not ask for token ids") {
    auto events = ChatStream(front->port(), {{"messages", messages}, {"stream", true}, {"max_completion_tokens", 12},
                                             {"stream_options", {{"include_usage", true}}}});
    // The role and 12 deltas (the fake engine puts the usage in the last):
    // one chat stream with one id.
    REQUIRE(events.size() == 13);
    CHECK(events[0]["choices"][0]["delta"]["role"] == "assistant");
    std::string content;
    for (size_t i = 0; i < events.size(); ++i) {
      INFO(events[i].dump());
      CHECK(events[i]["object"] == "chat.completion.chunk");
      CHECK(events[i]["id"] == events[0]["id"]);
      CHECK_FALSE(events[i].contains("prompt_token_ids"));
      if (i == 0 || events[i]["choices"].empty()) continue;
      CHECK_FALSE(events[i]["choices"][0].contains("token_ids"));
      CHECK_FALSE(events[i]["choices"][0]["delta"].contains("role"));
      content += events[i]["choices"][0]["delta"]["content"].get<std::string>();
    }
    CHECK(content == FakeText(golden));
    CHECK(events[12]["choices"][0]["finish_reason"] == "length");
    // The delivered tokens count as completion tokens, not the continuation's prompt.
    CHECK(events[12]["usage"]["completion_tokens"] == 12);
    CHECK(events[12]["usage"]["prompt_tokens"] == prompt.size());
    // B continued a token-id completion of the chat's ids and the 5 delivered.
    CHECK(b.last_path() == "/v1/completions");
    json resumed = json::parse(b.last_body());
    std::vector<int64_t> want = prompt;
    want.insert(want.end(), golden.begin(), golden.begin() + 5);
    CHECK(resumed["prompt"] == json(want));
    CHECK(resumed["max_tokens"] == 7);
    CHECK_FALSE(resumed.contains("messages"));
    CHECK_FALSE(resumed.contains("max_completion_tokens"));
    CHECK(b.last_resume_mark() == "cut");
    CHECK(FrontStatus(ctl)["counters"]["resumed"] == 1);
  }
  SECTION("the client asked for token ids: the prompt's ids once, at the top of the first chunk") {
    auto events = ChatStream(front->port(),
                             {{"messages", messages}, {"stream", true}, {"max_tokens", 12}, {"return_token_ids", true}});
    REQUIRE(events.size() == 13);
    CHECK(events[0]["prompt_token_ids"] == json(prompt));
    std::vector<int64_t> ids;
    for (size_t i = 1; i < events.size(); ++i) {
      CHECK_FALSE(events[i].contains("prompt_token_ids"));
      CHECK_FALSE(events[i]["choices"][0].contains("prompt_token_ids"));
      for (const auto& t : events[i]["choices"][0]["token_ids"]) ids.push_back(t.get<int64_t>());
    }
    CHECK(ids == golden);
  }
}

TEST_CASE("engine_dead: what is in flight on a dead engine is sent on at once, not when its sockets close",
          "[front][process]") {
  // A's sockets stay open (a SIGKILLed engine's do until the kernel has torn
  // it down): only the supervisor's word tells the front that it is dead.
  FakeEngine a("A"), b("B");
  ControlClient ctl;
  auto front = StartFront(a, b, &ctl);

  // A plain completion that A holds, and a stream A delivers slowly.
  a.mode = FakeEngine::kHold;
  a.token_delay_ms = 300;
  HttpResult held, streamed;
  std::thread t1([&] { held = Post(front->port(), R"({"prompt":"held","max_tokens":4})"); });
  std::thread t2([&] { streamed = Post(front->port(), R"({"prompt":"Hello","stream":true,"max_tokens":40})"); });
  REQUIRE(WaitFor([&] { return a.held.load() == 1 && a.streams_active.load() == 1; }, 10s));
  // Tokens out, so that the stream is (most likely) resumed, not sent again.
  REQUIRE(WaitFor([&] { return a.tokens_sent.load() >= 2; }, 10s));

  // What a supervisor sends when A dies: the routes, then engine_dead.
  auto reply = ctl.Call(SetRoutes(b.addr(), "", 1));
  REQUIRE(reply.ok());
  REQUIRE((*reply)["ok"] == true);
  reply = ctl.Call(json{{"type", "engine_dead"}, {"engine", a.addr()}, {"why", "pid 1234 died (its death word)"}});
  REQUIRE(reply.ok());
  CHECK((*reply)["ok"] == true);
  CHECK((*reply)["cut"] == 2);
  t1.join();
  t2.join();
  REQUIRE(held.status == 200);
  CHECK(held.Header("X-Engine") == "B");
  REQUIRE(streamed.status == 200);
  bool done = false;
  auto events = Events(streamed.body, &done);
  CHECK(done);
  CHECK(events.size() == 40);
  CHECK(StreamText(events) == FakeText(FakeGenerate(FakeTokenize("Hello"), 40)));
  CHECK(b.last_resume_mark() == "cut");
  // The front closed its connections to A (A sees them go; it is alive here).
  CHECK(WaitFor([&] { return a.held_closed.load() == 1 && a.client_closed.load() == 1; }, 10s));
  json st = FrontStatus(ctl);
  CHECK(st["counters"]["failed"] == 0);
  // The held request is sent again; the stream resumed (or, had no byte of
  // it reached the front yet, sent again).
  CHECK(st["counters"]["resumed"].get<int>() + st["counters"]["retried"].get<int>() == 2);
  CHECK(st["counters"]["retried"].get<int>() >= 1);
  CHECK(st["inflight"].value(a.addr(), 0) == 0);
  CHECK(st["down"][a.addr()]["error"].get<std::string>().find("died (pid 1234 died") != std::string::npos);

  // Nothing left there: nothing cut. An engine the front never knew: nothing.
  reply = ctl.Call(json{{"type", "engine_dead"}, {"engine", a.addr()}});
  REQUIRE(reply.ok());
  CHECK((*reply)["cut"] == 0);
  reply = ctl.Call(json{{"type", "engine_dead"}, {"engine", "127.0.0.1:1"}});
  REQUIRE(reply.ok());
  CHECK((*reply)["ok"] == true);
  CHECK((*reply)["cut"] == 0);
  // Bad messages: an error naming the field and the fix; the front goes on.
  for (const json& bad : {json{{"type", "engine_dead"}}, json{{"type", "engine_dead"}, {"engine", nullptr}},
                          json{{"type", "engine_dead"}, {"engine", 7}},
                          json{{"type", "engine_dead"}, {"engine", "nowhere"}}}) {
    reply = ctl.Call(bad);
    REQUIRE(reply.ok());
    INFO(bad.dump() << " -> " << reply->dump());
    CHECK((*reply)["ok"] == false);
    CHECK((*reply)["error"].get<std::string>().find("engine_dead") != std::string::npos);
  }
  CHECK(HttpRequestOnce(front->port(), "GET", "/v1/whoami").body == "B");
}

TEST_CASE("with no engine, requests wait for a route up to the queue timeout, then 503", "[front][process]") {
  SECTION("no route at all") {
    auto front = FrontProcess::Start({"--queue-timeout-ms", "300"});
    ControlClient ctl;
    REQUIRE(ctl.Connect(front->control_path()));
    auto t0 = std::chrono::steady_clock::now();
    HttpResult r = Post(front->port(), R"({"prompt":"a"})");
    auto waited = std::chrono::steady_clock::now() - t0;
    REQUIRE(r.status == 503);
    CHECK_FALSE(r.Header("Retry-After").empty());
    CHECK(json::parse(r.body)["error"]["message"].get<std::string>().find("no engine is routed") != std::string::npos);
    CHECK(waited >= 250ms);
    CHECK(FrontStatus(ctl)["counters"]["rejected_503"] == 1);
  }
  SECTION("the only engine refuses") {
    RefusingPort dead;
    auto front = FrontProcess::Start({"--active", dead.addr(), "--queue-timeout-ms", "300"});
    HttpResult r = Post(front->port(), R"({"prompt":"a"})");
    REQUIRE(r.status == 503);
    CHECK(json::parse(r.body)["error"]["message"].get<std::string>().find("refused") != std::string::npos);
  }
  SECTION("a route that appears within the timeout serves the waiting request") {
    FakeEngine a("A");
    auto front = FrontProcess::Start({"--queue-timeout-ms", "20000"});
    ControlClient ctl;
    REQUIRE(ctl.Connect(front->control_path()));
    HttpResult r;
    std::thread t([&] { r = HttpRequestOnce(front->port(), "GET", "/v1/whoami"); });
    REQUIRE(WaitFor([&] { return FrontStatus(ctl)["queued"] == 1; }, 10s));
    auto t0 = std::chrono::steady_clock::now();
    auto reply = ctl.Call(SetRoutes(a.addr(), "", 1));
    REQUIRE(reply.ok());
    CHECK((*reply)["ok"] == true);
    t.join();
    CHECK(r.status == 200);
    CHECK(r.body == "A");
    CHECK(std::chrono::steady_clock::now() - t0 < 5s);
  }
}

TEST_CASE("hostile clients never stop the front from serving others", "[front][process]") {
  FakeEngine a("A");
  auto front = FrontProcess::Start({"--active", a.addr(), "--header-timeout-ms", "300"});
  ControlClient ctl;
  REQUIRE(ctl.Connect(front->control_path()));
  auto served = [&] { return HttpRequestOnce(front->port(), "GET", "/v1/whoami").body == "A"; };

  SECTION("a bad request line gets 400") {
    HttpConn c;
    REQUIRE(c.Connect(front->port()));
    REQUIRE(c.Send("BLAH\r\n\r\n"));
    CHECK(c.Read(5s).status == 400);
    CHECK(served());
  }
  SECTION("huge headers get 431") {
    HttpConn c;
    REQUIRE(c.Connect(front->port()));
    REQUIRE(c.Send("GET /v1/whoami HTTP/1.1\r\nX-Big: " + std::string(40000, 'x') + "\r\n\r\n"));
    CHECK(c.Read(5s).status == 431);
    CHECK(served());
  }
  SECTION("a slow client is cut off by the header timeout") {
    HttpConn slow;
    REQUIRE(slow.Connect(front->port()));
    REQUIRE(slow.Send("GET /v1/whoami HTTP/1.1\r\nHost: x\r\n"));
    CHECK(served());
    CHECK(slow.WaitClosed(5s));
    CHECK(served());
  }
  SECTION("a client that disconnects mid-stream") {
    a.token_delay_ms = 20;
    HttpConn c;
    REQUIRE(c.Connect(front->port()));
    REQUIRE(c.Send(wsup::test::FormatRequest("POST", "/v1/completions",
                                             R"({"prompt":"x","stream":true,"max_tokens":200})")));
    std::string got;
    REQUIRE(ReadUntil(c.fd(), "data: ", &got, 10s));
    c.Close();
    // The front drops the engine's connection, so the engine stops generating.
    CHECK(WaitFor([&] { return a.client_closed.load() == 1; }, 10s));
    CHECK(WaitFor([&] { return FrontStatus(ctl)["counters"]["client_closed"] == 1; }, 10s));
    CHECK(FrontStatus(ctl)["inflight"][a.addr()] == 0);
    CHECK(served());
  }
  SECTION("pipelined requests are answered in order") {
    HttpConn c;
    REQUIRE(c.Connect(front->port()));
    std::string body = R"({"prompt":"p","max_tokens":3})";
    REQUIRE(c.Send(wsup::test::FormatRequest("GET", "/v1/whoami", "") +
                   wsup::test::FormatRequest("POST", "/v1/completions", body) +
                   wsup::test::FormatRequest("GET", "/health", "")));
    HttpResult r1 = c.Read(10s), r2 = c.Read(10s), r3 = c.Read(10s);
    CHECK(r1.status == 200);
    CHECK(r1.body == "A");
    CHECK(r2.status == 200);
    CHECK(json::parse(r2.body)["choices"][0]["text"] == FakeText(FakeGenerate(FakeTokenize("p"), 3)));
    CHECK(r3.status == 200);
    CHECK(r3.body == "{\"ok\":true}");
  }
  SECTION("a body that is not JSON is the engine's to refuse") {
    HttpResult r = Post(front->port(), "{\"stream\": true, broken");
    CHECK(r.status == 400);
    CHECK(served());
  }
  SECTION("a large answer is relayed as it comes") {
    HttpResult r = HttpRequestOnce(front->port(), "GET", "/v1/big");
    CHECK(r.status == 200);
    CHECK(r.body.size() == (1u << 20));
    CHECK(served());
  }
}

TEST_CASE("bad control messages get an error or drop only their sender", "[front][process]") {
  FakeEngine a("A");
  auto front = FrontProcess::Start({"--active", a.addr()});
  struct stat st {};
  REQUIRE(::stat(front->control_path().c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0600);

  ControlClient good;
  REQUIRE(good.Connect(front->control_path()));
  CHECK(FrontStatus(good)["active"] == a.addr());

  ControlClient garbage;
  REQUIRE(garbage.Connect(front->control_path()));
  REQUIRE(garbage.SendRaw(Le32(5) + "hello"));
  auto reply = garbage.Reply();
  REQUIRE(reply.ok());
  CHECK((*reply)["ok"] == false);
  CHECK((*reply)["error"].get<std::string>().find("JSON") != std::string::npos);
  CHECK(FrontStatus(garbage)["ok"] == true);  // still usable

  for (const json& bad : {json{{"type", "set_routes"}, {"active", 5}, {"epoch", 1}},
                          json{{"type", "set_routes"}, {"active", "nowhere"}, {"epoch", 1}},
                          json{{"type", "set_routes"}, {"active", a.addr()}, {"epoch", "1"}},
                          json{{"type", "set_routes"}, {"active", a.addr()}, {"standby", a.addr()}, {"epoch", 1}},
                          json{{"type", "set_routes"}, {"epoch", 1}}, json{{"type", 7}}, json{{"type", "bogus"}},
                          json::array({1, 2}), json{{"no_type", true}}}) {
    INFO(bad.dump());
    auto r = garbage.Call(bad);
    REQUIRE(r.ok());
    CHECK((*r)["ok"] == false);
    CHECK_FALSE((*r)["error"].get<std::string>().empty());
  }

  ControlClient oversized;
  REQUIRE(oversized.Connect(front->control_path()));
  REQUIRE(oversized.SendRaw(Le32(1u << 30) + "xxxx"));
  reply = oversized.Reply();
  REQUIRE(reply.ok());
  CHECK((*reply)["ok"] == false);
  CHECK(oversized.WaitClosed());

  ControlClient zero;
  REQUIRE(zero.Connect(front->control_path()));
  REQUIRE(zero.SendRaw(Le32(0)));
  CHECK(zero.WaitClosed());

  // Nothing of that touched the others, the routes or the traffic.
  json s = FrontStatus(good);
  CHECK(s["active"] == a.addr());
  CHECK(FrontStatus(garbage)["ok"] == true);
  CHECK(HttpRequestOnce(front->port(), "GET", "/v1/whoami").body == "A");
  CHECK(front->child().running());
}

TEST_CASE("a front restarted on the kept listening socket refuses no connection", "[front][process]") {
  FakeEngine a("A");
  int lfd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(lfd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
  REQUIRE(::listen(lfd, 64) == 0);
  socklen_t len = sizeof(addr);
  ::getsockname(lfd, reinterpret_cast<sockaddr*>(&addr), &len);
  int port = ntohs(addr.sin_port);

  auto first = FrontProcess::Start({"--listen-fd", "3", "--active", a.addr()}, {lfd});
  CHECK(first->port() == port);
  CHECK(HttpRequestOnce(port, "GET", "/v1/whoami").body == "A");
  first->child().Kill(SIGKILL);
  REQUIRE(first->child().Wait(10s) >= 0);

  // Nobody accepts now, but the connection is not refused: it waits in the backlog.
  HttpConn waiting;
  REQUIRE(waiting.Connect(port));
  REQUIRE(waiting.Send(wsup::test::FormatRequest("GET", "/v1/whoami", "")));
  auto second = FrontProcess::Start({"--listen-fd", "3", "--active", a.addr()}, {lfd});
  HttpResult r = waiting.Read(10s);
  CHECK(r.status == 200);
  CHECK(r.body == "A");
  ::close(lfd);
}

TEST_CASE("SIGTERM lets streams in flight finish, then stops cleanly", "[front][process]") {
  FakeEngine a("A");
  auto front = FrontProcess::Start({"--active", a.addr()});
  CHECK(HttpRequestOnce(front->port(), "GET", "/v1/whoami").body == "A");
  a.token_delay_ms = 10;
  HttpResult streamed;
  std::thread t([&] { streamed = Post(front->port(), R"({"prompt":"bye","stream":true,"max_tokens":20})"); });
  REQUIRE(WaitFor([&] { return a.streams_active.load() == 1; }, 10s));
  front->child().Kill(SIGTERM);
  t.join();
  REQUIRE(streamed.status == 200);
  bool done = false;
  auto events = Events(streamed.body, &done);
  CHECK(done);
  CHECK(StreamText(events) == FakeText(FakeGenerate(FakeTokenize("bye"), 20)));
  REQUIRE(front->child().Wait(10s) == 0);
  CHECK_FALSE(std::filesystem::exists(front->control_path()));
}

TEST_CASE("bad flags are refused with a message naming the fix", "[front][process]") {
  wsup::test::TempDir dir;
  auto r = wsup::test::Run({wsup::test::BinPath("wsup-front"), "--listen", "127.0.0.1:0", "--active", "localhost:1"});
  CHECK(r.exit_code != 0);
  CHECK(r.output.find("--active") != std::string::npos);
  CHECK(r.output.find("127.0.0.1:8001") != std::string::npos);
  r = wsup::test::Run({wsup::test::BinPath("wsup-front"), "--active", "127.0.0.1:1"});
  CHECK(r.exit_code != 0);
  CHECK(r.output.find("--listen") != std::string::npos);
  r = wsup::test::Run({wsup::test::BinPath("wsup-front"), "--listen", "127.0.0.1:0", "--loops", "65"});
  CHECK(r.exit_code != 0);
  CHECK(r.output.find("--loops") != std::string::npos);
  // A control path held by a live front is not stolen.
  auto front = FrontProcess::Start({});
  r = wsup::test::Run({wsup::test::BinPath("wsup-front"), "--listen", "127.0.0.1:0", "--control", front->control_path()});
  CHECK(r.exit_code != 0);
  CHECK(r.output.find("in use") != std::string::npos);
  CHECK(front->child().running());
}

namespace {

int64_t WallMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

TEST_CASE("a switch made while no supervisor is connected is kept in status events, with backend times",
          "[front][process]") {
  FakeEngine a("A"), b("B");
  auto front = FrontProcess::Start({"--active", a.addr(), "--standby", b.addr(), "--epoch", "3"});
  int64_t t0 = WallMs();
  REQUIRE(HttpRequestOnce(front->port(), "GET", "/v1/whoami").body == "A");
  int64_t t1 = WallMs();
  // The active engine dies while nobody listens to the front's events.
  a.Stop();
  HttpResult r = HttpRequestOnce(front->port(), "GET", "/v1/whoami");
  int64_t t2 = WallMs();
  REQUIRE(r.status == 200);
  CHECK(r.body == "B");

  // A supervisor that comes back reads what happened, and when.
  ControlClient ctl;
  REQUIRE(ctl.Connect(front->control_path()));
  json st = FrontStatus(ctl);
  CHECK(st["active"] == b.addr());
  CHECK(st["counters"]["switched_self"] == 1);
  REQUIRE(st["events"].is_array());
  REQUIRE(st["events"].size() == 3);
  const json& ok_a = st["events"][0];
  const json& switched = st["events"][1];
  const json& ok_b = st["events"][2];
  CHECK(ok_a["kind"] == "first_ok");
  CHECK(ok_a["backend"] == a.addr());
  CHECK(ok_a["at_ms"].get<int64_t>() >= t0);
  CHECK(ok_a["at_ms"].get<int64_t>() <= t1);
  CHECK(switched["type"] == "event");
  CHECK(switched["kind"] == "switched");
  CHECK(switched["from"] == a.addr());
  CHECK(switched["to"] == b.addr());
  CHECK(switched["epoch"] == 3);
  CHECK_FALSE(switched["reason"].get<std::string>().empty());
  CHECK(switched["at_ms"].get<int64_t>() >= t1);
  CHECK(switched["at_ms"].get<int64_t>() <= t2);
  CHECK(ok_b["kind"] == "first_ok");
  CHECK(ok_b["backend"] == b.addr());
  CHECK(ok_b["at_ms"].get<int64_t>() >= switched["at_ms"].get<int64_t>());

  const json& ba = st["backends"][a.addr()];
  const json& bb = st["backends"][b.addr()];
  CHECK(ba["route"] == "none");
  CHECK(bb["route"] == "active");
  CHECK(ba["last_ok_ms"].get<int64_t>() >= t0);
  CHECK(ba["last_ok_ms"].get<int64_t>() <= t1);
  CHECK(ba["failed_at_ms"].get<int64_t>() == switched["at_ms"].get<int64_t>());
  CHECK(ba["error"] == switched["reason"]);
  CHECK(bb["last_ok_ms"].get<int64_t>() >= switched["at_ms"].get<int64_t>());
  CHECK(bb["last_ok_ms"].get<int64_t>() <= t2);
  CHECK_FALSE(bb.contains("failed_at_ms"));  // never failed: no time at all, not 0
  // The fields that were there before are all still there.
  for (const char* key : {"ok", "listen", "pid", "active", "standby", "epoch", "inflight", "queued", "down", "counters",
                          "control_clients"}) {
    CHECK(st.contains(key));
  }
}

TEST_CASE("the status event log keeps the last 64 events, oldest first", "[front][process]") {
  FakeEngine a("A"), b("B");
  auto front = FrontProcess::Start({"--active", a.addr()});
  ControlClient ctl;
  REQUIRE(ctl.Connect(front->control_path()));
  // Each route change and the first good answer after it: one first_ok event.
  constexpr int kChanges = 70;
  for (int epoch = 1; epoch <= kChanges; ++epoch) {
    FakeEngine& to = epoch % 2 ? b : a;
    auto reply = ctl.Call(SetRoutes(to.addr(), "", epoch));
    REQUIRE(reply.ok());
    REQUIRE((*reply)["ok"] == true);
    REQUIRE(HttpRequestOnce(front->port(), "GET", "/v1/whoami").body == to.name());
  }
  json events = FrontStatus(ctl)["events"];
  REQUIRE(events.size() == 64);
  for (size_t i = 0; i < events.size(); ++i) {
    INFO(events[i].dump());
    CHECK(events[i]["kind"] == "first_ok");
    CHECK(events[i]["epoch"] == kChanges - 63 + static_cast<int>(i));
    if (i > 0) CHECK(events[i]["at_ms"].get<int64_t>() >= events[i - 1]["at_ms"].get<int64_t>());
  }
  CHECK(events.back()["backend"] == a.addr());  // epoch 70 routed A
}

TEST_CASE("several loops: connections dealt in turn, one switch and one first_ok each, status summed",
          "[front][process][loops]") {
  FakeEngine a("A");
  FakeEngine b("B");
  auto front = FrontProcess::Start({"--active", a.addr(), "--standby", b.addr(), "--loops", "4"});
  ControlClient ctl;
  REQUIRE(ctl.Connect(front->control_path()));
  const std::string body = R"({"prompt":"abc","max_tokens":2})";
  const std::string request = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                              "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  std::vector<HttpConn> conns(8);
  // One request on every connection; `engine` is who must answer all of them.
  auto round = [&](const std::string& engine) {
    for (auto& c : conns) REQUIRE(c.Send(request));
    for (auto& c : conns) {
      HttpResult r = c.Read();
      REQUIRE(r.status == 200);
      CHECK(r.Header("X-Engine") == engine);
    }
  };
  for (auto& c : conns) REQUIRE(c.Connect(front->port()));
  round("A");
  json st = FrontStatus(ctl);
  CHECK(st["loops"] == 4);
  REQUIRE(st["loop_load"].size() == 4);
  for (const auto& l : st["loop_load"]) {
    CHECK(l["connections"] == 2);
    CHECK(l["requests"] == 2);
  }
  CHECK(st["counters"]["requests"] == 8);
  CHECK(st["counters"]["ok"] == 8);
  CHECK(st["inflight"][a.addr()] == 0);

  // The active dies under every loop at once: every request is still
  // answered (by the standby), and the front switched once.
  a.Stop();
  round("B");
  st = FrontStatus(ctl);
  CHECK(st["active"] == b.addr());
  CHECK(st["standby"].is_null());
  CHECK(st["counters"]["switched_self"] == 1);
  CHECK(st["counters"]["ok"] == 16);
  auto count = [](const json& events, const std::string& kind, const std::string& backend) {
    int n = 0;
    for (const auto& e : events) n += e["kind"] == kind && (backend.empty() || e["backend"] == backend);
    return n;
  };
  CHECK(count(st["events"], "switched", "") == 1);
  CHECK(count(st["events"], "first_ok", a.addr()) == 1);
  CHECK(count(st["events"], "first_ok", b.addr()) == 1);
  // The backend's failure time is the latest any loop saw: the switch's or
  // later (a loop may meet the dead engine itself before it hears of the switch).
  auto ev = ctl.WaitEvent("switched");
  REQUIRE(ev.ok());
  CHECK(st["backends"][a.addr()]["failed_at_ms"].get<int64_t>() >= (*ev)["at_ms"].get<int64_t>());

  // A route change reaches every loop before it is acknowledged.
  FakeEngine c("C");
  REQUIRE(wsup::test::ReplyOr(ctl.Call(SetRoutes(c.addr(), b.addr(), 1)))["ok"] == true);
  round("C");
  st = FrontStatus(ctl);
  CHECK(count(st["events"], "first_ok", c.addr()) == 1);
  CHECK(st["counters"]["requests"] == 24);
  CHECK(st["epoch"] == 1);
}

TEST_CASE("the front counts what its clients saw: answers by route and status, a stream's first token, each later "
          "token and each request's whole time",
          "[front][process]") {
  FakeEngine a("A"), b("B");
  ControlClient ctl;
  auto front = StartFront(a, b, &ctl);
  a.token_delay_ms = 20;
  HttpResult streamed = Post(front->port(), R"({"prompt":"hi","stream":true,"max_tokens":6})");
  REQUIRE(streamed.status == 200);
  CHECK(Post(front->port(), R"({"prompt":"hi","max_tokens":2})").status == 200);
  CHECK(HttpRequestOnce(front->port(), "GET", "/wsup/status").status == 404);
  CHECK(HttpRequestOnce(front->port(), "GET", "/health").status == 200);
  json c;
  auto hist = [&](const std::string& h, const std::string& api) {
    int64_t n = 0;
    for (const auto& [k, v] : c.items()) {
      if (k.rfind(h + "_bucket:" + api + ":", 0) == 0) n += v.get<int64_t>();
    }
    return n;
  };
  // Each request is counted as it ends, on its loop: asked until all four are in.
  REQUIRE(WaitFor(
      [&] {
        c = FrontStatus(ctl)["counters"];
        return c.value("answer:completions:200", 0) == 2 && c.value("answer:health:200", 0) == 1 &&
               c.value("answer:other:404", 0) == 1;
      },
      10s));
  INFO(c.dump());
  CHECK(hist("ttft", "completions") == 1);
  CHECK(hist("tpot", "completions") == 5);      // the stream's tokens after its first
  CHECK(hist("duration", "completions") == 2);  // streamed or not
  // The engine waits 20 ms before each token: the gaps after the first add
  // up to at least five of those, and the first token to at least one.
  CHECK(c.value("tpot_sum_us:completions", 0) >= 5 * 20'000);
  CHECK(c.value("ttft_sum_us:completions", 0) >= 20'000);
  CHECK(c.value("duration_sum_us:completions", 0) >= 6 * 20'000);
  // Nothing for an API that was not asked, nor for routes without latency.
  CHECK(hist("ttft", "chat") == 0);
  CHECK(hist("duration", "health") == 0);
}
