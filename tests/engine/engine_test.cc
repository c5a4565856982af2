// wsup-engine end to end: real processes on --port 0, spoken to over plain
// sockets. Goldens over HTTP, status and health, weight-cache modes with a
// real wsup-holder, concurrency, and bad input.
#include <catch2/catch.hpp>

#include <poll.h>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "tests/engine/engine_fixture.h"

using namespace std::chrono_literals;
using nlohmann::json;
using wsup::test::HttpConn;
using wsup::test::HttpResult;
using wsup::test::Proc;
using wsup::test::TempDir;

namespace {

void ExpectGoldens(int port, const std::string& model) {
  auto cases = wsup::test::GoldenCases(model);
  REQUIRE(cases.size() == 4);
  for (const auto& c : cases) {
    INFO(model << " prompt '" << c.prompt << "'");
    std::string err;
    CHECK(wsup::test::Complete(port, c.prompt, 16, &err) == c.output_ids);
    INFO(err);
  }
}

// Stops the engine the way a supervisor does and checks it exits cleanly.
void StopClean(Proc& p) {
  p.child.Kill(SIGTERM);
  CHECK(p.child.Wait(10s) == 0);
}

std::string Utf8OfIds(const std::vector<int>& ids) {
  std::string s;
  for (int t : ids) {
    if (t < 0x80) {
      s.push_back(static_cast<char>(t));
    } else {
      s.push_back(static_cast<char>(0xc0 | (t >> 6)));
      s.push_back(static_cast<char>(0x80 | (t & 0x3f)));
    }
  }
  return s;
}

}  // namespace

TEST_CASE("engine: f32 goldens over HTTP, response shape, status and clean exit") {
  TempDir dir;
  Proc e = wsup::test::StartEngine(dir, "llama-tiny-f32");
  INFO(e.Log());
  REQUIRE(e.ready);
  REQUIRE(e.port > 0);
  CHECK(e.ready_line == "listening on 127.0.0.1:" + std::to_string(e.port));
  ExpectGoldens(e.port, "llama-tiny-f32");

  // The whole response, text rendered as U+00tt per token.
  auto c = wsup::test::GoldenCases("llama-tiny-f32")[0];
  HttpResult r = wsup::test::HttpRequestOnce(e.port, "POST", "/v1/completions",
                                             json{{"prompt", c.prompt}, {"max_tokens", 16}}.dump());
  REQUIRE(r.status == 200);
  CHECK(r.Header("Content-Type") == "application/json");
  json j = json::parse(r.body);
  CHECK(j["object"] == "text_completion");
  CHECK(j["model"] == "llama-tiny-f32");
  CHECK(j["id"].get<std::string>().rfind("cmpl-", 0) == 0);
  CHECK(j["created"].is_number_integer());
  CHECK(j["choices"][0]["index"] == 0);
  CHECK(j["choices"][0]["finish_reason"] == "length");
  CHECK(j["choices"][0]["text"] == Utf8OfIds(c.output_ids));
  CHECK_FALSE(j["choices"][0].contains("token_ids"));
  CHECK(j["usage"] == json{{"prompt_tokens", 12}, {"completion_tokens", 16}, {"total_tokens", 28}});

  // A prompt given as token ids is the same prompt.
  r = wsup::test::HttpRequestOnce(e.port, "POST", "/v1/completions",
                                  json{{"prompt", c.prompt_ids}, {"max_tokens", 16}, {"return_token_ids", true}}.dump());
  REQUIRE(r.status == 200);
  CHECK(json::parse(r.body)["choices"][0]["token_ids"].get<std::vector<int>>() == c.output_ids);

  json st = wsup::test::GetJson(e.port, "/wsup/status");
  CHECK(st["state"] == "ready");
  CHECK(st["weights"]["mode"] == "off");
  CHECK(st["weights"]["source"] == "disk");
  CHECK_FALSE(st["weights"].contains("miss_reason"));
  CHECK(st["weights"]["ms"].is_number());
  for (const char* phase : {"context", "weights", "communicator", "kv_cache", "graph_capture", "warmup", "listening"}) {
    INFO(phase);
    CHECK(st["phases"][phase].is_number());
  }
  CHECK(st["comm"]["ranks"] == 1);
  CHECK(st["comm"]["warm"] == true);
  CHECK(st["comm"]["last_keepalive_ms"].is_number());
  // The step bound: the CPU's default, and the cost of a prompt token
  // learnt from the goldens' prompts.
  CHECK(st["step_bound"]["max_step_ms"] == 100);
  CHECK(st["step_bound"]["prefill_us_per_token"].get<double>() > 0);
  const int budget = st["step_bound"]["prefill_budget_tokens"].get<int>();
  CHECK(budget >= 16);
  CHECK(budget <= 2048);

  // The caller's X-Request-Id is echoed and names the completion.
  r = wsup::test::HttpRequestOnce(e.port, "POST", "/v1/completions", json{{"prompt", "hi"}, {"max_tokens", 2}}.dump(),
                                  30s, {{"X-Request-Id", "probe-7"}});
  REQUIRE(r.status == 200);
  CHECK(r.Header("X-Request-Id") == "probe-7");
  CHECK(json::parse(r.body)["id"] == "cmpl-probe-7");

  json models = wsup::test::GetJson(e.port, "/v1/models");
  CHECK(models["data"][0]["id"] == "llama-tiny-f32");
  HttpResult h = wsup::test::HttpRequestOnce(e.port, "GET", "/health");
  CHECK(h.status == 200);
  // The startup table is printed.
  CHECK(e.Log().find("graph_capture") != std::string::npos);
  StopClean(e);
}

TEST_CASE("engine: the start's nonce is echoed in /wsup/status, from the flag or the environment") {
  TempDir dir;
  Proc e = wsup::test::StartEngine(dir, "llama-tiny-f32", {"--nonce", "0123abcd"});
  INFO(e.Log());
  REQUIRE(e.ready);
  json st = wsup::test::GetJson(e.port, "/wsup/status");
  CHECK(st["nonce"] == "0123abcd");
  e.child.Kill(SIGTERM);
  CHECK(e.child.Wait(std::chrono::seconds(30)) == 0);
  // The supervisor passes it as WSUP_ENGINE_NONCE.
  ::setenv("WSUP_ENGINE_NONCE", "from-env-77", 1);
  Proc f = wsup::test::StartEngine(dir, "llama-tiny-f32", {}, "engine2.log");
  ::unsetenv("WSUP_ENGINE_NONCE");
  REQUIRE(f.ready);
  CHECK(wsup::test::GetJson(f.port, "/wsup/status")["nonce"] == "from-env-77");
}

TEST_CASE("engine: with a control token its /wsup routes answer only requests that carry it") {
  TempDir dir;
  // The supervisor hands the token over in the environment, never as a flag.
  ::setenv("WSUP_CONTROL_TOKEN", "0123456789abcdef0123456789abcdef", 1);
  Proc e = wsup::test::StartEngine(dir, "llama-tiny-f32", {"--nonce", "n-1"});
  ::unsetenv("WSUP_CONTROL_TOKEN");
  INFO(e.Log());
  REQUIRE(e.ready);
  const std::vector<std::pair<std::string, std::string>> good = {
      {"Authorization", "Bearer 0123456789abcdef0123456789abcdef"}};
  const std::string role = json{{"role", "active"}, {"kv", "pool"}}.dump();
  struct Try {
    std::string method, path, body;
    std::vector<std::pair<std::string, std::string>> headers;
  };
  const std::vector<Try> refused = {
      {"GET", "/wsup/status", "", {}},
      {"POST", "/wsup/role", role, {}},
      {"GET", "/wsup/status", "", {{"Authorization", "Bearer 0123456789abcdef0123456789abcdee"}}},
      {"GET", "/wsup/status", "", {{"Authorization", "Bearer 0123456789abcdef"}}},
      {"POST", "/wsup/role", role, {{"Authorization", "Basic 0123456789abcdef0123456789abcdef"}}},
      // A wrong method or an unknown /wsup route says nothing before the token either.
      {"DELETE", "/wsup/status", "", {}},
      {"GET", "/wsup/anything", "", {}},
  };
  for (const auto& t : refused) {
    INFO(t.method << " " << t.path);
    HttpResult r = wsup::test::HttpRequestOnce(e.port, t.method, t.path, t.body, 10s, t.headers);
    CHECK(r.status == 401);
    CHECK(r.Header("WWW-Authenticate") == "Bearer");
    CHECK(r.body.find("n-1") == std::string::npos);  // no nonce, no status
    CHECK(r.body.find("0123456789abcdef") == std::string::npos);  // never the token
  }
  HttpResult ok = wsup::test::HttpRequestOnce(e.port, "GET", "/wsup/status", "", 10s, good);
  REQUIRE(ok.status == 200);
  CHECK(json::parse(ok.body)["nonce"] == "n-1");
  CHECK(json::parse(ok.body)["role"] == "standby");
  // The OpenAI routes and /health need no token.
  CHECK(wsup::test::HttpRequestOnce(e.port, "GET", "/health").status == 200);
  CHECK(wsup::test::HttpRequestOnce(e.port, "GET", "/v1/models").status == 200);
  // The refused role request changed nothing.
  CHECK(json::parse(wsup::test::HttpRequestOnce(e.port, "GET", "/wsup/status", "", 10s, good).body)["role"] ==
        "standby");
  CHECK(wsup::test::HttpRequestOnce(e.port, "POST", "/wsup/role", json{{"role", "active"}}.dump(), 10s, good).status ==
        200);
  CHECK(json::parse(wsup::test::HttpRequestOnce(e.port, "GET", "/wsup/status", "", 10s, good).body)["role"] ==
        "active");
  // Never on its command line, where every user could read it.
  CHECK(wsup::test::ReadAll("/proc/" + std::to_string(e.child.pid()) + "/cmdline").find("0123456789abcdef") ==
        std::string::npos);

  // A probe jumps the queue only with the token: a client's X-Wsup-Probe
  // (or one with a wrong token) is a plain request.
  auto probes = [&] {
    HttpResult st = wsup::test::HttpRequestOnce(e.port, "GET", "/wsup/status", "", 10s, good);
    return json::parse(st.body)["requests"].value("probes", -1);
  };
  const std::string body = json{{"prompt", "Hello"}, {"max_tokens", 1}}.dump();
  const std::vector<std::pair<std::string, std::string>> probe_only = {{"X-Wsup-Probe", "semantic"}};
  const std::vector<std::pair<std::string, std::string>> wrong = {
      {"X-Wsup-Probe", "semantic"}, {"Authorization", "Bearer 0123456789abcdef0123456789abcdee"}};
  std::vector<std::pair<std::string, std::string>> real = good;
  real.emplace_back("X-Wsup-Probe", "semantic");
  CHECK(probes() == 0);
  CHECK(wsup::test::HttpRequestOnce(e.port, "POST", "/v1/completions", body, 30s, probe_only).status == 200);
  CHECK(wsup::test::HttpRequestOnce(e.port, "POST", "/v1/completions", body, 30s, wrong).status == 200);
  CHECK(probes() == 0);
  CHECK(wsup::test::HttpRequestOnce(e.port, "POST", "/v1/completions", body, 30s, real).status == 200);
  CHECK(probes() == 1);
  StopClean(e);
}

TEST_CASE("engine: fp8-block goldens, bf16 sharded serves") {
  TempDir dir;
  Proc fp8 = wsup::test::StartEngine(dir, "llama-tiny-fp8-block", {}, "fp8.log");
  INFO(fp8.Log());
  REQUIRE(fp8.ready);
  ExpectGoldens(fp8.port, "llama-tiny-fp8-block");
  StopClean(fp8);

  Proc bf16 = wsup::test::StartEngine(dir, "llama-tiny-bf16-sharded", {}, "bf16.log");
  INFO(bf16.Log());
  REQUIRE(bf16.ready);
  CHECK(wsup::test::Complete(bf16.port, "Hello, world", 16).size() == 16);
  StopClean(bf16);
}

TEST_CASE("engine: tensor parallel over threads (tp 2, tp 4) gives the f32 goldens") {
  TempDir dir;
  for (const char* tp : {"2", "4"}) {
    Proc e = wsup::test::StartEngine(dir, "llama-tiny-f32", {"--tp", tp}, std::string("tp") + tp + ".log");
    INFO("tp " << tp << "\n" << e.Log());
    REQUIRE(e.ready);
    ExpectGoldens(e.port, "llama-tiny-f32");
    json st = wsup::test::GetJson(e.port, "/wsup/status");
    CHECK(st["comm"]["ranks"] == std::atoi(tp));
    CHECK(st["comm"]["warm"] == true);
    StopClean(e);
  }
}

TEST_CASE("engine: the communicator keepalive runs and is reported") {
  TempDir dir;
  Proc e = wsup::test::StartEngine(dir, "llama-tiny-f32", {"--tp", "2", "--comm-keepalive-ms", "20"});
  INFO(e.Log());
  REQUIRE(e.ready);
  CHECK(wsup::test::WaitFor(
      [&] {
        json st = wsup::test::GetJson(e.port, "/wsup/status");
        return st["comm"]["keepalives"].is_number() && st["comm"]["keepalives"].get<int>() >= 3;
      },
      10s));
  json st = wsup::test::GetJson(e.port, "/wsup/status");
  CHECK(st["comm"]["keepalive_failures"] == 0);
  CHECK(st["comm"]["last_keepalive_ms"].get<int64_t>() < 5000);
  StopClean(e);
}

TEST_CASE("engine: streaming sends SSE chunks with token ids and ends with [DONE]") {
  TempDir dir;
  Proc e = wsup::test::StartEngine(dir, "llama-tiny-f32");
  REQUIRE(e.ready);
  auto c = wsup::test::GoldenCases("llama-tiny-f32")[1];
  json req = {{"prompt", c.prompt}, {"max_tokens", 16}, {"stream", true}, {"return_token_ids", true},
              {"stream_options", {{"include_usage", true}}}};
  HttpResult r = wsup::test::HttpRequestOnce(e.port, "POST", "/v1/completions", req.dump());
  REQUIRE(r.status == 200);
  CHECK(r.chunked);
  CHECK(r.Header("Content-Type") == "text/event-stream");
  auto events = wsup::test::SseData(r.body);
  REQUIRE(events.size() >= 3);
  CHECK(events.back() == "[DONE]");
  std::vector<int> ids;
  std::string text;
  std::string finish;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    json j = json::parse(events[i]);
    if (j.contains("usage")) {
      CHECK(j["usage"]["completion_tokens"] == 16);
      continue;
    }
    for (int t : j["choices"][0]["token_ids"]) ids.push_back(t);
    text += j["choices"][0]["text"].get<std::string>();
    if (!j["choices"][0]["finish_reason"].is_null()) finish = j["choices"][0]["finish_reason"];
  }
  CHECK(ids == c.output_ids);
  CHECK(text == Utf8OfIds(c.output_ids));
  CHECK(finish == "length");
  StopClean(e);
}

TEST_CASE("engine: 32 concurrent streams all get their goldens while /health answers promptly") {
  TempDir dir;
  Proc e = wsup::test::StartEngine(dir, "llama-tiny-f32", {"--kv-cache-mib", "8"});
  INFO(e.Log());
  REQUIRE(e.ready);
  wsup::test::CheckConcurrentStreams(e.port, "llama-tiny-f32", 32);
  json st = wsup::test::GetJson(e.port, "/wsup/status");
  CHECK(st["kv_cache"]["free_blocks"] == st["kv_cache"]["blocks"]);
  StopClean(e);
}

TEST_CASE("engine: a client that hangs up on a non-streamed completion cancels its generation") {
  // One sequence at a time, so the requests behind the first wait in the
  // scheduler's queue: none can have finished before its client leaves
  // unless every one before it ran to its end too.
  TempDir dir;
  Proc e = wsup::test::StartEngine(dir, "llama-tiny-f32", {"--max-batch", "1"});
  INFO(e.Log());
  REQUIRE(e.ready);
  auto requests = [&] { return wsup::test::GetJson(e.port, "/wsup/status")["requests"]; };
  constexpr int kClients = 6;
  constexpr int kMaxTokens = 500;
  std::vector<HttpConn> conns(kClients);
  for (auto& c : conns) {
    REQUIRE(c.Connect(e.port));
    json req = {{"prompt", "Hello"}, {"max_tokens", kMaxTokens}};
    REQUIRE(c.Send(wsup::test::FormatRequest("POST", "/v1/completions", req.dump())));
  }
  // Every request is in the scheduler (running, waiting or done).
  REQUIRE(wsup::test::WaitFor(
      [&] {
        json r = requests();
        return r["active"].get<int>() + r["waiting"].get<int>() + r["finished"].get<int>() == kClients;
      },
      20s));
  // The clients close without reading: a plain EOF for the engine.
  for (auto& c : conns) c.Close();
  json r;
  REQUIRE(wsup::test::WaitFor(
      [&] {
        r = requests();
        return r["active"] == 0 && r["waiting"] == 0;
      },
      20s));
  INFO(r.dump());
  CHECK(r["finished"].get<int>() + r["cancelled"].get<int>() == kClients);
  CHECK(r["cancelled"].get<int>() >= 1);
  CHECK(r["generated_tokens"].get<int>() < kClients * kMaxTokens);  // nobody's tokens were all made
  json st = wsup::test::GetJson(e.port, "/wsup/status");
  CHECK(st["kv_cache"]["free_blocks"] == st["kv_cache"]["blocks"]);
  // And it serves the next client.
  CHECK(wsup::test::Complete(e.port, "Hello", 4).size() == 4);
  StopClean(e);
}

TEST_CASE("engine: bad requests get a 4xx naming the problem, and the engine keeps serving") {
  TempDir dir;
  Proc e = wsup::test::StartEngine(dir, "llama-tiny-f32",
                                   {"--max-body-bytes", "4096", "--header-timeout-ms", "300"});
  INFO(e.Log());
  REQUIRE(e.ready);
  struct Case {
    std::string body;
    std::string needle;
  };
  std::vector<Case> cases = {
      {"{\"prompt\": \"hi\", ", "not valid JSON"},
      {"[1, 2]", "not a JSON object"},
      {"{\"max_tokens\": 4}", "'prompt' is required"},
      {"{\"prompt\": \"\"}", "'prompt' is empty"},
      {"{\"prompt\": 42}", "'prompt' must be a string or a list of token ids"},
      {"{\"prompt\": [1, \"x\"]}", "list of prompts"},
      {"{\"prompt\": [1, 999]}", "outside the vocabulary"},
      {"{\"prompt\": [1, -1]}", "outside the vocabulary"},
      {"{\"prompt\": \"hi\", \"max_tokens\": -1}", "'max_tokens' is -1"},
      {"{\"prompt\": \"hi\", \"max_tokens\": 0}", "'max_tokens' is 0"},
      {"{\"prompt\": \"hi\", \"max_tokens\": 100000000000}", "send 1 to 510"},
      {"{\"prompt\": \"hi\", \"max_tokens\": 1e30}", "must be an integer"},
      {"{\"prompt\": \"hi\", \"max_tokens\": \"16\"}", "must be an integer"},
      {"{\"prompt\": \"hi\", \"temperature\": -1}", "'temperature'"},
      {"{\"prompt\": \"hi\", \"temperature\": \"hot\"}", "'temperature' must be a number"},
      {"{\"prompt\": \"hi\", \"stream\": \"yes\"}", "'stream' must be true or false"},
      {"{\"prompt\": \"hi\", \"n\": 2}", "'n' is not supported"},
      {"{\"prompt\": \"" + std::string(600, 'a') + "\"}", "the model's context is 512 tokens"},
      {std::string(65, '[') + std::string(65, ']'), "nested deeper than the limit of 64 levels"},
  };
  for (const auto& c : cases) {
    INFO(c.body.substr(0, 80));
    HttpResult r = wsup::test::HttpRequestOnce(e.port, "POST", "/v1/completions", c.body);
    CHECK(r.status == 400);
    json j = json::parse(r.body, nullptr, false);
    REQUIRE(j.is_object());
    CHECK(j["error"]["type"] == "invalid_request_error");
    CHECK(j["error"]["message"].get<std::string>().find(c.needle) != std::string::npos);
  }

  SECTION("wrong method and unknown path") {
    HttpResult r = wsup::test::HttpRequestOnce(e.port, "GET", "/v1/completions");
    CHECK(r.status == 405);
    CHECK(r.Header("Allow") == "POST");
    CHECK(wsup::test::HttpRequestOnce(e.port, "GET", "/nope").status == 404);
  }
  SECTION("a body over the limit") {
    HttpConn c;
    REQUIRE(c.Connect(e.port));
    json big = {{"prompt", std::string(8000, 'a')}};
    REQUIRE(c.Send(wsup::test::FormatRequest("POST", "/v1/completions", big.dump())));
    HttpResult r = c.Read(5s);
    CHECK(r.status == 413);
    CHECK(c.WaitClosed(5s));
  }
  SECTION("garbage bytes") {
    HttpConn c;
    REQUIRE(c.Connect(e.port));
    REQUIRE(c.Send(std::string("\x00\xff\x13garbage\r\n\r\n", 14)));
    HttpResult r = c.Read(5s);
    CHECK(r.status == 400);
    CHECK(c.WaitClosed(5s));
  }
  SECTION("a client sending one byte at a time is cut off in bounded time") {
    HttpConn c;
    REQUIRE(c.Connect(e.port));
    std::string req = wsup::test::FormatRequest("POST", "/v1/completions", "{\"prompt\": \"hi\"}");
    auto t0 = std::chrono::steady_clock::now();
    bool cut = false;
    for (size_t i = 0; i < req.size() && !cut; ++i) {
      if (!c.Send(req.substr(i, 1))) break;
      pollfd p{c.fd(), POLLIN, 0};
      cut = ::poll(&p, 1, 50) == 1;  // the pause between bytes waits for the server's answer
    }
    CHECK(cut);
    CHECK(c.WaitClosed(5s));
    CHECK(std::chrono::steady_clock::now() - t0 < 4s);
  }
  SECTION("a client that vanishes mid-stream frees its KV blocks") {
    {
      HttpConn c;
      REQUIRE(c.Connect(e.port));
      json req = {{"prompt", "hi"}, {"max_tokens", 500}, {"stream", true}};
      REQUIRE(c.Send(wsup::test::FormatRequest("POST", "/v1/completions", req.dump())));
      pollfd p{c.fd(), POLLIN, 0};
      REQUIRE(::poll(&p, 1, 10000) == 1);  // the stream has started
    }
    CHECK(wsup::test::WaitFor(
        [&] {
          json st = wsup::test::GetJson(e.port, "/wsup/status");
          return st["requests"]["active"] == 0 && st["kv_cache"]["free_blocks"] == st["kv_cache"]["blocks"];
        },
        10s));
  }
  // After all of that, the engine still gives the goldens.
  ExpectGoldens(e.port, "llama-tiny-f32");
  StopClean(e);
}

TEST_CASE("engine: a request the KV cache can never hold is refused - a cache too small to start says so") {
  TempDir dir;
  // One block of 384 positions: less than the 512-token context.
  Proc e = wsup::test::StartEngine(dir, "llama-tiny-f32", {"--kv-cache-mib", "1", "--kv-block-size", "384"});
  INFO(e.Log());
  REQUIRE(e.ready);
  HttpResult r = wsup::test::HttpRequestOnce(e.port, "POST", "/v1/completions",
                                             json{{"prompt", "hi"}, {"max_tokens", 400}}.dump());
  CHECK(r.status == 400);
  CHECK(r.body.find("--kv-cache-mib") != std::string::npos);
  CHECK(wsup::test::Complete(e.port, "hi", 16).size() == 16);
  StopClean(e);

  auto bad = wsup::test::Run({wsup::test::BinPath("wsup-engine"), "--model", wsup::test::TestData("llama-tiny-f32"),
                              "--port", "0", "--kv-cache-mib", "1", "--kv-block-size", "1024"},
                             30s);
  CHECK(bad.exit_code == 2);
  CHECK(bad.output.find("raise --kv-cache-mib") != std::string::npos);
}

TEST_CASE("engine: usage errors exit 2 naming the flag") {
  auto model = wsup::test::TestData("llama-tiny-f32");
  auto bin = wsup::test::BinPath("wsup-engine");
  struct Case {
    std::vector<std::string> args;
    std::string needle;
  };
  std::vector<Case> cases = {
      {{"--model", model, "--weight-cache", "sometimes"}, "not one of daemon, client, off"},
      {{"--model", model, "--weight-cache", "daemon"}, "needs --socket"},
      {{"--model", model, "--device", "tpu"}, "not one of cpu, cuda"},
      {{"--model", model, "--tp", "3", "--port", "0"}, "--tp 3"},
      {{"--model", model, "--kv-cache-mib", "0"}, "--kv-cache-mib"},
      {{"--model", model, "--dequant-scratch-mib", "0"}, "--dequant-scratch-mib 0 is out of range"},
      {{"--model", model, "--nccl-max-ctas", "65"}, "--nccl-max-ctas 65 is out of range"},
      {{"--model", model, "--matmul", "fp4"}, "--matmul 'fp4' is not a mode: pass split"},
      {{"--model", model, "--max-step-ms", "-2"}, "--max-step-ms -2 is out of range; pass 0 (off) to 60000"},
      {{"--port", "0"}, "--model"},
  };
  for (const auto& c : cases) {
    std::vector<std::string> argv = {bin};
    argv.insert(argv.end(), c.args.begin(), c.args.end());
    auto r = wsup::test::Run(argv, 30s);
    INFO(r.output);
    CHECK(r.exit_code == 2);
    CHECK(r.output.find(c.needle) != std::string::npos);
  }
  auto missing = wsup::test::Run({bin, "--model", "/nonexistent/model", "--port", "0"}, 30s);
  CHECK(missing.exit_code != 0);
  CHECK(missing.output.find("/nonexistent/model") != std::string::npos);
}
