// Unit tests of the front's pure pieces: address parsing, control framing,
// completion planning, the SSE relay, and what the front's loops share
// and merge.
#include <catch2/catch.hpp>

#include <atomic>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "front/address.h"
#include "front/completion.h"
#include "front/control_socket.h"
#include "front/routes.h"
#include "front/shared.h"
#include "front/sse_relay.h"
#include "front/status_merge.h"
#include "tests/front/fake_engine.h"
#include "testkit/http_client.h"
#include "wire/json_frame.h"

using nlohmann::json;
using namespace wsup::front;
using wsup::Code;
using wsup::Status;

namespace {

std::string Le32(uint32_t n) {
  std::string s(4, '\0');
  for (int i = 0; i < 4; ++i) s[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return s;
}

// An engine-like event for tokens `ids`.
std::string Event(const std::string& id, const std::vector<int64_t>& ids, bool last = false, size_t prompt = 0,
                  size_t done = 0) {
  json choice = {{"index", 0}, {"text", wsup::test::FakeText(ids)}, {"token_ids", ids},
                 {"finish_reason", last ? json("length") : json(nullptr)}};
  json ev = {{"id", id}, {"object", "text_completion"}, {"choices", json::array({choice})}};
  if (last) ev["usage"] = {{"prompt_tokens", prompt}, {"completion_tokens", done}, {"total_tokens", prompt + done}};
  return "data: " + ev.dump() + "\n\n";
}

}  // namespace

TEST_CASE("IsForwardedPath: the OpenAI API and /health, nothing else, no dot segments", "[front][unit]") {
  for (const char* p : {"/health", "/v1/completions", "/v1/models", "/v1/chat/completions", "/v1/x/y.z", "/v1/..a"}) {
    INFO(p);
    CHECK(IsForwardedPath(p));
  }
  for (const char* p : {"/wsup/role", "/wsup/status", "/wsup", "/", "", "/v1", "/v1/", "/v1/../wsup/role",
                        "/v1/./completions", "/v1/completions/..", "/v1/a/./b", "/health/", "/healthz", "/V1/models",
                        "http://h/v1/models", "/metrics", "//v1/models"}) {
    INFO(p);
    CHECK_FALSE(IsForwardedPath(p));
  }
}

TEST_CASE("ParseHostPort accepts numeric addresses and names the fix otherwise", "[front][unit]") {
  auto a = ParseHostPort("127.0.0.1:8001", "--active");
  REQUIRE(a.ok());
  CHECK(a->port == 8001);
  CHECK(a->ToString() == "127.0.0.1:8001");
  auto b = ParseHostPort("[::1]:9", "--active");
  REQUIRE(b.ok());
  CHECK(b->ToString() == "[::1]:9");
  CHECK(ParseHostPort("127.0.0.1:0", "--listen", true).ok());
  for (const char* bad : {"", "127.0.0.1", "localhost:80", "127.0.0.1:0", "127.0.0.1:70000", "::1:80", "1.2.3.4:x",
                          ":80", "[::1:80"}) {
    auto r = ParseHostPort(bad, "--active");
    INFO(bad);
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().message().find("--active") != std::string::npos);
    CHECK(r.error().message().find("127.0.0.1:8001") != std::string::npos);
  }
}

namespace {

// The control socket's frames: the shared codec in the front's dialect.
std::string EncodeControlFrame(const json& msg) { return wsup::EncodeFrame(msg).value(); }

}  // namespace

TEST_CASE("ControlFrameDecoder splits frames and refuses bad lengths before buffering", "[front][unit]") {
  wsup::FrameDecoder d(ControlFrames());
  std::string two = EncodeControlFrame(json{{"type", "status"}}) + EncodeControlFrame(json{{"type", "x"}});
  // Byte by byte: frames come out whole and in order.
  std::vector<json> got;
  for (char c : two) {
    REQUIRE(d.Feed(&c, 1).ok());
    for (auto m = d.Next(); m.ok() && m->has_value(); m = d.Next()) got.push_back(**m);
  }
  REQUIRE(got.size() == 2);
  CHECK(got[0]["type"] == "status");
  CHECK(got[1]["type"] == "x");

  wsup::FrameDecoder big(ControlFrames());
  std::string huge = Le32(kMaxControlMessageBytes + 1);
  wsup::Status st = big.Feed(huge.data(), huge.size());
  REQUIRE_FALSE(st.ok());
  CHECK(st.error().message().find("little-endian") != std::string::npos);
  CHECK(big.failed());
  CHECK_FALSE(big.Feed("x", 1).ok());

  wsup::FrameDecoder zero(ControlFrames());
  std::string z = Le32(0);
  CHECK_FALSE(zero.Feed(z.data(), z.size()).ok());

  // A good frame before a bad prefix in the same read is still delivered.
  wsup::FrameDecoder mixed(ControlFrames());
  std::string m = EncodeControlFrame(json{{"type", "status"}}) + Le32(1u << 30);
  CHECK_FALSE(mixed.Feed(m.data(), m.size()).ok());
  auto first = mixed.Next();
  REQUIRE((first.ok() && first->has_value()));
  CHECK((**first)["type"] == "status");
  auto second = mixed.Next();
  CHECK_FALSE((second.ok() && second->has_value()));
}

TEST_CASE("ParseControlMessage wants one bounded JSON object", "[front][unit]") {
  auto ParseControlMessage = [](std::string_view body) { return wsup::ParseFrameBody(body, ControlFrames()); };
  CHECK(ParseControlMessage(R"({"type":"status"})").ok());
  CHECK_FALSE(ParseControlMessage("not json").ok());
  CHECK_FALSE(ParseControlMessage("[1,2]").ok());
  CHECK_FALSE(ParseControlMessage("\"str\"").ok());
  CHECK_FALSE(ParseControlMessage(std::string(100, '[') + std::string(100, ']')).ok());
  CHECK_FALSE(ParseControlMessage("{\"a\":\"\xff\xfe\"}").ok());
}

TEST_CASE("PlanCompletion rewrites streamed requests for resuming", "[front][unit]") {
  CompletionPlan p;
  SECTION("string prompt, default max_tokens") {
    REQUIRE(PlanCompletion(R"({"prompt":"h\u00e9","stream":true})", 16, &p));
    CHECK(p.stream);
    CHECK(p.resumable);
    CHECK_FALSE(p.client_wants_token_ids);
    // A text prompt is never tokenized by the front: its ids come from the engine.
    CHECK_FALSE(p.prompt_ids_given);
    CHECK(p.prompt_ids.empty());
    CHECK(p.max_tokens == 16);
    json up = json::parse(p.upstream_body);
    CHECK(up["return_token_ids"] == true);
    CHECK(up["max_tokens"] == 16);
    json resume = json::parse(ResumeBody(p, {128000, 71}, {7, 8}, 14));
    CHECK(resume["prompt"] == json::array({128000, 71, 7, 8}));
    // Cut before the first token, the prompt's ids not yet reported: the
    // client's text again.
    CHECK(json::parse(ResumeBody(p, {}, {}, 16))["prompt"] == "h\u00e9");
    CHECK(resume["max_tokens"] == 14);
    CHECK(resume["stream"] == true);
  }
  SECTION("token id prompt, client asks for ids, sampling with a seed") {
    REQUIRE(PlanCompletion(R"({"prompt":[1,2,3],"stream":true,"return_token_ids":true,"max_tokens":5,)"
                           R"("temperature":0.7,"seed":42})",
                           16, &p));
    CHECK(p.resumable);
    CHECK(p.client_wants_token_ids);
    CHECK(p.prompt_ids_given);
    CHECK(p.prompt_ids == std::vector<int64_t>{1, 2, 3});
    json resume = json::parse(ResumeBody(p, p.prompt_ids, {9}, 4));
    CHECK(resume["prompt"] == json::array({1, 2, 3, 9}));
    CHECK(resume["seed"] != 42);
    CHECK(json::parse(ResumeBody(p, p.prompt_ids, {9}, 4))["seed"] == resume["seed"]);  // derived, reproducible
  }
  SECTION("a return_token_ids the engine refuses reaches it as sent, on a stream as on a plain request") {
    for (const char* v : {R"("no")", "1", "[]", "{}"}) {
      std::string body = std::string(R"({"prompt":"a","stream":true,"return_token_ids":)") + v + "}";
      INFO(body);
      REQUIRE(PlanCompletion(body, 16, &p));
      CHECK(p.stream);
      CHECK_FALSE(p.resumable);
      CHECK(json::parse(p.upstream_body)["return_token_ids"] == json::parse(v));
    }
  }
  SECTION("greedy keeps its seed") {
    REQUIRE(PlanCompletion(R"({"prompt":"a","stream":true,"seed":42,"temperature":0})", 16, &p));
    CHECK(json::parse(ResumeBody(p, {5}, {9}, 4))["seed"] == 42);
  }
  SECTION("not resumable: batches, several choices, echo") {
    for (const char* body : {R"({"prompt":["a","b"],"stream":true})", R"({"prompt":"a","stream":true,"n":2})",
                             R"({"prompt":"a","stream":true,"echo":true})", R"({"stream":true})",
                             R"({"prompt":"a","stream":true,"max_tokens":"x"})"}) {
      INFO(body);
      REQUIRE(PlanCompletion(body, 16, &p));
      CHECK(p.stream);
      CHECK_FALSE(p.resumable);
      CHECK_FALSE(p.not_resumable.empty());
      CHECK_FALSE(json::parse(p.upstream_body).contains("return_token_ids"));
    }
  }
  SECTION("non-streamed and broken bodies pass unchanged") {
    REQUIRE(PlanCompletion(R"({"prompt":"a","stream":false})", 16, &p));
    CHECK_FALSE(p.stream);
    CHECK(p.upstream_body == R"({"prompt":"a","stream":false})");
    CHECK_FALSE(PlanCompletion("{not json", 16, &p));
    CHECK_FALSE(PlanCompletion("[]", 16, &p));
  }
  CHECK_FALSE(MayRequestStream(R"({"prompt":"a"})"));
  CHECK(MayRequestStream(R"({"prompt":"a","stream":true})"));
}

TEST_CASE("completion bodies past the shared JSON limit are refused before any parse", "[front][unit]") {
  const std::string deep = "{\"stream\":true,\"prompt\":" + std::string(70000, '[') + std::string(70000, ']') + "}";
  Status st = CheckCompletionBody(deep);
  REQUIRE_FALSE(st.ok());
  CHECK(st.code() == Code::kInvalidArgument);
  CHECK(st.error().message().find("the request body is JSON nested deeper than the limit of 64 levels") !=
        std::string::npos);
  CompletionPlan p;
  CHECK_FALSE(PlanCompletion(deep, 16, &p));
  // 64 levels in all is the limit itself.
  const std::string at_limit =
      "{\"stream\":true,\"prompt\":\"a\",\"x\":" + std::string(63, '[') + std::string(63, ']') + "}";
  CHECK(CheckCompletionBody(at_limit).ok());
  REQUIRE(PlanCompletion(at_limit, 16, &p));
  CHECK(p.stream);
  CHECK_FALSE(ResumeBody(p, {5}, {1}, 3).empty());
  CHECK(CheckCompletionBody("{\"prompt\":\"" + std::string(70000, '[') + "\"}").ok());  // in a string
}

TEST_CASE("an engine event nested past the JSON limit is passed on unparsed and stops tracking", "[front][unit]") {
  CompletionStream s(/*strip_token_ids=*/true);
  std::string deep = "data: {\"choices\":" + std::string(70000, '[') + std::string(70000, ']') + "}\n\n";
  std::string out;
  s.Feed(Event("c1", {65}), &out);
  s.Feed(deep, &out);
  CHECK_FALSE(s.trackable());
  CHECK(out.find(deep) != std::string::npos);  // byte for byte
  CHECK(s.delivered() == std::vector<int64_t>{65});
  s.Feed("data: [DONE]\n\n", &out);
  CHECK(s.done());
}

TEST_CASE("CompletionStream tracks tokens, strips ids and forwards whole events only", "[front][unit]") {
  CompletionStream s(/*strip_token_ids=*/true);
  std::string all = Event("c1", {65}) + Event("c1", {66}) + Event("c1", {67}, true, 2, 3) + "data: [DONE]\n\n";
  std::string out;
  // Split at every byte: only complete events come out.
  for (char c : all) s.Feed(std::string_view(&c, 1), &out);
  CHECK(s.done());
  CHECK(s.finished());
  CHECK(s.trackable());
  CHECK(s.delivered() == std::vector<int64_t>{65, 66, 67});
  auto data = wsup::test::SseData(out);
  REQUIRE(data.size() == 4);
  for (int i = 0; i < 3; ++i) {
    json j = json::parse(data[i]);
    CHECK_FALSE(j["choices"][0].contains("token_ids"));
    CHECK(j["choices"][0]["text"] == std::string(1, static_cast<char>('A' + i)));
  }
  CHECK(data[3] == "[DONE]");
}

TEST_CASE("CompletionStream keeps events byte for byte when nothing changes", "[front][unit]") {
  CompletionStream s(/*strip_token_ids=*/false);
  std::string in = Event("c1", {1}) + ": keep-alive comment\n\n" + Event("c1", {2});
  std::string out;
  s.Feed(in, &out);
  CHECK(out == in);
  CHECK(s.delivered() == std::vector<int64_t>{1, 2});
}

TEST_CASE("CompletionStream drops a half event at a cut and splices the continuation", "[front][unit]") {
  CompletionStream s(/*strip_token_ids=*/false);
  std::string out;
  std::string third = Event("c1", {3});
  s.Feed(Event("c1", {1}) + Event("c1", {2}) + third.substr(0, third.size() / 2), &out);
  CHECK(s.delivered() == std::vector<int64_t>{1, 2});
  s.BeginContinuation();
  // The continuation has its own id and counts the delivered tokens as prompt.
  s.Feed(Event("c2", {3}) + Event("c2", {4}, true, 5 + 2, 2) + "data: [DONE]\n\n", &out);
  CHECK(s.delivered() == std::vector<int64_t>{1, 2, 3, 4});
  auto data = wsup::test::SseData(out);
  REQUIRE(data.size() == 5);
  for (int i = 0; i < 4; ++i) CHECK(json::parse(data[i])["id"] == "c1");
  json usage = json::parse(data[3])["usage"];
  CHECK(usage["prompt_tokens"] == 5);
  CHECK(usage["completion_tokens"] == 4);
  CHECK(usage["total_tokens"] == 9);
}

TEST_CASE("CompletionStream notices streams it cannot resume", "[front][unit]") {
  // Each section runs on a fresh stream.
  CompletionStream s(false);
  std::string out;
  SECTION("text without token ids") {
    s.Feed("data: {\"choices\":[{\"index\":0,\"text\":\"x\",\"finish_reason\":null}]}\n\n", &out);
    CHECK_FALSE(s.trackable());
  }
  SECTION("not JSON") {
    s.Feed("data: {broken\n\n", &out);
    CHECK_FALSE(s.trackable());
    CHECK(out == "data: {broken\n\n");
  }
  SECTION("an endless event is passed through") {
    std::string big(CompletionStream::kMaxEventBytes + 10, 'x');
    s.Feed("data: " + big, &out);
    CHECK_FALSE(s.trackable());
    CHECK(out.size() == big.size() + 6);
  }
  SECTION("an error event") {
    s.Feed("data: {\"error\":{\"message\":\"boom\"}}\n\n", &out);
    CHECK(s.error_seen());
  }
  SECTION("CRLF line ends") {
    s.Feed("data: {\"choices\":[{\"index\":0,\"text\":\"A\",\"token_ids\":[65]}]}\r\n\r\n", &out);
    CHECK(s.delivered() == std::vector<int64_t>{65});
  }
}

TEST_CASE("CompletionStream ends a stream whose last token was delivered", "[front][unit]") {
  CompletionStream s(true);
  std::string out;
  s.Feed(Event("c1", {1}), &out);
  std::string end = s.SynthesizeEnd("length");
  auto data = wsup::test::SseData(end);
  REQUIRE(data.size() == 2);
  CHECK(json::parse(data[0])["choices"][0]["finish_reason"] == "length");
  CHECK(json::parse(data[0])["id"] == "c1");
  CHECK(data[1] == "[DONE]");
  CHECK(s.done());
}

TEST_CASE("FakeGenerate continues like greedy decoding", "[front][unit]") {
  std::vector<int64_t> prompt = wsup::test::FakeTokenize("Hello");
  auto full = wsup::test::FakeGenerate(prompt, 10);
  auto ctx = prompt;
  ctx.insert(ctx.end(), full.begin(), full.begin() + 4);
  auto rest = wsup::test::FakeGenerate(ctx, 6);
  CHECK(std::vector<int64_t>(full.begin() + 4, full.end()) == rest);
}

TEST_CASE("MergeLoopStatus sums counts and keeps the latest times per engine", "[front][unit]") {
  json a = {{"active", "127.0.0.1:1"},
            {"standby", "127.0.0.1:2"},
            {"epoch", 4},
            {"queued", 1},
            {"inflight", {{"127.0.0.1:1", 2}, {"127.0.0.1:2", 0}}},
            {"down", json::object()},
            {"backends",
             {{"127.0.0.1:1",
               {{"route", "active"}, {"inflight", 2}, {"failures", 0}, {"last_ok_ms", 500}, {"last_byte_ms", 510}}}}},
            {"counters", {{"requests", 10}, {"ok", 9}, {"hedged", 1}}},
            {"hedging", {{"after_ms", 0}}},
            {"events", json::array({json{{"kind", "first_ok"}}})}};
  json b = {{"active", "127.0.0.1:1"},
            {"standby", "127.0.0.1:2"},
            {"epoch", 4},
            {"queued", 2},
            {"inflight", {{"127.0.0.1:1", 3}}},
            {"down", {{"127.0.0.1:1", {{"for_ms", 80}, {"error", "refused"}}}}},
            {"backends",
             {{"127.0.0.1:1",
               {{"route", "active"},
                {"inflight", 3},
                {"failures", 2},
                {"failed_at_ms", 600},
                {"error", "refused"},
                {"last_ok_ms", 400}}},
              {"127.0.0.1:2", {{"route", "standby"}, {"inflight", 0}, {"failures", 0}}}}},
            {"counters", {{"requests", 5}, {"ok", 5}, {"hedged", 0}}}};
  json c = {{"down", {{"127.0.0.1:1", {{"for_ms", 30}, {"error", "older"}}}}}};
  json m = MergeLoopStatus({a, nullptr, b, c});
  CHECK(m["active"] == "127.0.0.1:1");
  CHECK(m["epoch"] == 4);
  CHECK(m["queued"] == 3);
  CHECK(m["inflight"]["127.0.0.1:1"] == 5);
  CHECK(m["inflight"]["127.0.0.1:2"] == 0);
  CHECK(m["counters"]["requests"] == 15);
  CHECK(m["counters"]["ok"] == 14);
  CHECK(m["counters"]["hedged"] == 1);
  CHECK(m["down"]["127.0.0.1:1"]["for_ms"] == 80);
  json e = m["backends"]["127.0.0.1:1"];
  CHECK(e["inflight"] == 5);
  CHECK(e["failures"] == 2);
  CHECK(e["failed_at_ms"] == 600);
  CHECK(e["error"] == "refused");
  CHECK(e["last_ok_ms"] == 500);
  CHECK(e["last_byte_ms"] == 510);
  CHECK(m["backends"]["127.0.0.1:2"]["route"] == "standby");
  CHECK(m["events"].empty());  // the front keeps the one log
  CHECK(MergeLoopStatus({})["counters"].empty());
}

TEST_CASE("FrontShared: one hedge bucket for every loop, never overdrawn", "[front][unit]") {
  FrontShared shared;
  shared.FillHedges(3);
  CHECK(shared.hedge_budget() == 3.0);
  shared.EarnHedge(50, 3);  // full: earns nothing
  CHECK(shared.hedge_budget() == 3.0);
  CHECK(shared.TakeHedge());
  shared.EarnHedge(50, 3);
  CHECK(shared.hedge_budget() == 2.5);
  shared.CapHedges(2);
  CHECK(shared.hedge_budget() == 2.0);
  CHECK(shared.TakeHedge());
  CHECK(shared.TakeHedge());
  CHECK_FALSE(shared.TakeHedge());
  shared.EarnHedge(50, 2);
  CHECK_FALSE(shared.TakeHedge());  // half a hedge is none
  shared.EarnHedge(50, 2);
  CHECK(shared.TakeHedge());

  // Many loops taking at once: exactly the budget is handed out.
  shared.FillHedges(1000);
  std::atomic<int> taken{0};
  std::vector<std::thread> loops;
  for (int i = 0; i < 8; ++i) {
    loops.emplace_back([&] {
      for (int k = 0; k < 500; ++k) {
        if (shared.TakeHedge()) ++taken;
      }
    });
  }
  for (auto& t : loops) t.join();
  CHECK(taken == 1000);
  CHECK(shared.hedge_budget() == 0.0);

  // An engine's record is one per name.
  SharedBackend* x = shared.Backend("127.0.0.1:9");
  CHECK(shared.Backend("127.0.0.1:9") == x);
  CHECK(shared.Backend("127.0.0.1:10") != x);
  x->silent_reported = true;
  x->Spoke(1000, 50);
  CHECK_FALSE(x->silent_reported);
  x->Spoke(900, 40);  // another loop's older byte does not move it back
  CHECK(x->last_byte_ms == 1000);
  CHECK(x->last_byte_loop_ms == 50);
}
