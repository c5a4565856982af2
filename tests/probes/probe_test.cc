// Probe kinds: the judging rules without I/O, then each probe and the
// monitor against a scripted engine on port 0.
#include "probes/probe.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <optional>

#include "probes/monitor.h"
#include "supervisor/config.h"
#include "supervisor/probe_config.h"
#include "tests/probes/scripted_server.h"

namespace wsup {
namespace {

using test::RawResponse;
using test::ScriptedReply;
using test::ScriptedServer;

http::HttpResponse Response(int status, const std::string& body) {
  http::HttpResponse r;
  r.status = status;
  r.body = body;
  return r;
}

std::string Completion(const std::vector<int64_t>& ids, const std::string& text = "x") {
  nlohmann::json j = {{"object", "text_completion"},
                      {"choices", {{{"index", 0}, {"text", text}, {"token_ids", ids}, {"finish_reason", "length"}}}}};
  return j.dump();
}

SemanticProbeSpec IdsSpec() {
  SemanticProbeSpec s;
  s.prompt = "Hello, world";
  s.expect_token_ids = std::vector<int64_t>{92, 16, 97};
  s.max_tokens = 3;
  s.timeout_ms = 800;
  return s;
}

TEST_CASE("probe: the semantic request is greedy and asks for token ids", "[probes]") {
  SemanticProbeSpec s = IdsSpec();
  s.model = "tiny";
  auto j = nlohmann::json::parse(SemanticRequestBody(s));
  CHECK(j["prompt"] == "Hello, world");
  CHECK(j["max_tokens"] == 3);
  CHECK(j["temperature"] == 0);
  CHECK(j["return_token_ids"] == true);
  CHECK(j["stream"] == false);
  CHECK(j["model"] == "tiny");
  s.model = "";
  CHECK_FALSE(nlohmann::json::parse(SemanticRequestBody(s)).contains("model"));
}

TEST_CASE("probe: semantic verdicts and their exact reasons", "[probes]") {
  SemanticProbeSpec ids = IdsSpec();
  SemanticProbeSpec text = ids;
  text.expect_token_ids.reset();
  text.expect = " Paris";

  auto ok = EvaluateCompletion(ids, Response(200, Completion({92, 16, 97})), 12);
  CHECK(ok.ok);
  CHECK(ok.reason.empty());
  CHECK(ok.latency_ms == 12);

  auto wrong = EvaluateCompletion(ids, Response(200, Completion({92, 16, 98})), 12);
  CHECK_FALSE(wrong.ok);
  CHECK(wrong.reason == "wrong answer: got [92, 16, 98] expected [92, 16, 97]");
  CHECK(EvaluateCompletion(ids, Response(200, Completion({92, 16})), 1).reason ==
        "wrong answer: got [92, 16] expected [92, 16, 97]");

  CHECK(EvaluateCompletion(text, Response(200, Completion({1}, " Paris")), 1).ok);
  CHECK(EvaluateCompletion(text, Response(200, Completion({1}, " Lyon\n")), 1).reason ==
        "wrong answer: got \" Lyon\\n\" expected \" Paris\"");

  CHECK(EvaluateCompletion(ids, Response(503, R"({"error":{"message":"model is loading","type":"unavailable"}})"), 1)
            .reason == "HTTP 503: model is loading");
  CHECK(EvaluateCompletion(ids, Response(500, "boom\nat line 3"), 1).reason == "HTTP 500: boom at line 3");
  // An engine's bytes that are not UTF-8 never reach a reason (which goes
  // into JSON answers and the ledger); UTF-8 stays as it is.
  const auto binary = EvaluateCompletion(ids, Response(500, std::string("\xff\xfe boom \xc3\xa9t\xe9", 12)), 1);
  CHECK(binary.reason == "HTTP 500: ?? boom \xc3\xa9t?");
  CHECK_NOTHROW(nlohmann::json(binary.reason).dump());
  CHECK(EvaluateCompletion(ids, Response(200, "<html>"), 1).reason.rfind("bad response: not a JSON object", 0) == 0);
  CHECK(EvaluateCompletion(ids, Response(200, R"({"choices":[]})"), 1).reason == "bad response: no choices[0]");
  CHECK(EvaluateCompletion(ids, Response(200, R"({"choices":[{"text":"x"}]})"), 1).reason.find("return_token_ids") !=
        std::string::npos);
  CHECK(EvaluateCompletion(ids, Response(200, R"({"choices":[{"token_ids":[1,"a"]}]})"), 1).reason.find("non-integer") !=
        std::string::npos);
  CHECK(EvaluateCompletion(text, Response(200, R"({"choices":[{"token_ids":[1]}]})"), 1).reason ==
        "bad response: no choices[0].text");

  auto slow = EvaluateCompletion(ids, Response(200, Completion({92, 16, 97})), 900);
  CHECK_FALSE(slow.wrong_answer);
  CHECK_FALSE(slow.ok);
  CHECK(slow.reason.rfind("timeout after 800 ms", 0) == 0);

  CHECK(EvaluateCompletion(ids, Error(Code::kTimeout, "127.0.0.1:1: POST /v1/completions: no complete response"), 800)
            .reason == "timeout after 800 ms");
  CHECK(EvaluateCompletion(ids, Unavailable("127.0.0.1:1: POST /v1/completions: connection refused: nothing listens"),
                           0)
            .reason == "connection refused");
  CHECK(EvaluateCompletion(ids, IoError("127.0.0.1:1: POST /v1/completions: connection broken: connection reset by peer"),
                           0)
            .reason == "connection broken: connection reset by peer");
}

TEST_CASE("probe: a wrong answer carries what the engine answered, no other failure does", "[probes]") {
  SemanticProbeSpec ids = IdsSpec();
  auto wrong = EvaluateCompletion(ids, Response(200, Completion({92, 16, 98}, "abc")), 12);
  REQUIRE(wrong.wrong_answer);
  CHECK(wrong.wrong_answer->token_ids == std::vector<int64_t>{92, 16, 98});
  CHECK(wrong.wrong_answer->text == "abc");
  CHECK(wrong.wrong_answer->finish_reason == "length");
  CHECK_FALSE(EvaluateCompletion(ids, Response(200, Completion({92, 16, 97})), 12).wrong_answer);
  CHECK_FALSE(EvaluateCompletion(ids, Response(503, "{}"), 1).wrong_answer);
  CHECK_FALSE(EvaluateCompletion(ids, Response(200, R"({"choices":[{"token_ids":[1,"a"]}]})"), 1).wrong_answer);
  SemanticProbeSpec text = ids;
  text.expect_token_ids.reset();
  text.expect = " Paris";
  auto lyon = EvaluateCompletion(text, Response(200, Completion({5, 6}, " Lyon")), 1);
  REQUIRE(lyon.wrong_answer);
  CHECK(lyon.wrong_answer->text == " Lyon");
  CHECK(lyon.wrong_answer->token_ids == std::vector<int64_t>{5, 6});
}

TEST_CASE("probe: comm verdicts", "[probes]") {
  CommProbeSpec spec{500, 5000};
  // last_keepalive_ms is an age: milliseconds since the last keepalive.
  auto status = [](bool warm, int64_t age) {
    return nlohmann::json{{"comm", {{"warm", warm}, {"last_keepalive_ms", age}}}, {"phase", "serving"}}.dump();
  };
  CHECK(EvaluateStatus(spec, Response(200, status(true, 100)), 3).ok);
  CHECK(EvaluateStatus(spec, Response(200, status(true, 5000)), 3).ok);
  CHECK(EvaluateStatus(spec, Response(200, status(false, 0)), 3).reason == "comm not warm");
  CHECK(EvaluateStatus(spec, Response(200, status(true, 12000)), 3).reason ==
        "comm keepalive stale: last one 12000 ms ago (limit 5000 ms)");
  // A wall-clock timestamp where an age belongs is stale, never fresh.
  CHECK_FALSE(EvaluateStatus(spec, Response(200, status(true, 1'700'000'000'000)), 3).ok);
  CHECK(EvaluateStatus(spec, Response(200, R"({"comm":{"last_keepalive_ms":1}})"), 3).reason ==
        "bad status: no comm.warm");
  CHECK(EvaluateStatus(spec, Response(200, R"({"comm":{"warm":true}})"), 3).reason ==
        "bad status: no comm.last_keepalive_ms");
  CHECK(EvaluateStatus(spec, Response(200, R"({"phase":"x"})"), 3).reason == "bad status: no comm object");
  CHECK(EvaluateStatus(spec, Response(503, "{}"), 3).reason == "HTTP 503: {}");
  CHECK(EvaluateStatus(spec, Error(Code::kTimeout, "x"), 3).reason == "timeout after 500 ms");
}

// A fake engine: greedy answers for the probe prompt, and a status page.
struct FakeEngine {
  std::vector<int64_t> answer = {92, 16, 97};
  bool warm = true;
  int64_t keepalive_ms = 0;
  bool hang = false;
  int completions = 0;
  int hung = 0;
  std::string last_body;

  ScriptedReply operator()(const http::HttpRequest& r) {
    if (hang) {
      ++hung;
      return ScriptedReply{{}, 0, ScriptedReply::After::kKeepOpen, true};
    }
    if (r.method == "POST" && r.path == "/v1/completions") {
      ++completions;
      last_body = r.body;
      auto j = nlohmann::json::parse(r.body, nullptr, false);
      if (j.is_discarded() || j.value("temperature", -1) != 0 || !j.value("return_token_ids", false))
        return ScriptedReply{{RawResponse(400, R"({"error":{"message":"bad probe request"}})")}};
      return ScriptedReply{{RawResponse(200, Completion(answer))}};
    }
    if (r.method == "GET" && r.path == "/wsup/status")
      return ScriptedReply{{RawResponse(
          200, nlohmann::json{{"comm", {{"warm", warm}, {"last_keepalive_ms", keepalive_ms}}}}.dump())}};
    return ScriptedReply{{RawResponse(404, "{}")}};
  }
};

struct Env {
  uv_loop_t loop{};
  FakeEngine engine;
  std::unique_ptr<ScriptedServer> server;
  std::unique_ptr<http::HttpClient> client;
  Env() {
    uv_loop_init(&loop);
    server = std::make_unique<ScriptedServer>(&loop, [this](const http::HttpRequest& r) { return engine(r); });
    REQUIRE(server->Listen().ok());
    client = std::make_unique<http::HttpClient>(&loop);
  }
  ~Env() {
    client.reset();
    bool closed = false;
    server->Close([&] { closed = true; });
    test::RunUntil(&loop, [&] { return closed; });
    CHECK(test::CloseLoop(&loop) == 0);
  }
  ProbeOutcome RunOnce(Probe& p) {
    std::optional<ProbeOutcome> out;
    p.Run([&](ProbeOutcome o) { out = std::move(o); });
    CHECK_FALSE(out.has_value());  // never inside Run()
    REQUIRE(test::RunUntil(&loop, [&] { return out.has_value(); }));
    return *out;
  }
};

TEST_CASE("probe: semantic probe against a live engine", "[probes]") {
  Env env;
  FakeClock clock;
  SemanticProbeSpec spec = IdsSpec();
  spec.timeout_ms = 5000;
  auto probe = MakeSemanticProbe(*env.client, {"127.0.0.1", env.server->port()}, spec, clock);
  CHECK(std::string(probe->kind()) == "semantic");
  auto ok = env.RunOnce(*probe);
  CHECK(ok.ok);
  CHECK(env.engine.completions == 1);
  CHECK(nlohmann::json::parse(env.engine.last_body)["prompt"] == "Hello, world");

  env.engine.answer = {92, 16, 0};
  CHECK(env.RunOnce(*probe).reason == "wrong answer: got [92, 16, 0] expected [92, 16, 97]");

  env.engine.hang = true;
  spec.timeout_ms = 100;
  auto impatient = MakeSemanticProbe(*env.client, {"127.0.0.1", env.server->port()}, spec, clock);
  CHECK(env.RunOnce(*impatient).reason == "timeout after 100 ms");

  auto refused = MakeSemanticProbe(*env.client, {"127.0.0.1", test::UnusedPort()}, spec, clock);
  CHECK(env.RunOnce(*refused).reason == "connection refused");
}

TEST_CASE("probe: comm probe judges the keepalive age the engine reports", "[probes]") {
  Env env;
  FakeClock clock(1'700'000'000'000);
  env.engine.keepalive_ms = 1000;
  auto probe = MakeCommProbe(*env.client, {"127.0.0.1", env.server->port()}, CommProbeSpec{5000, 3000}, clock);
  CHECK(env.RunOnce(*probe).ok);
  env.engine.keepalive_ms = 6000;
  CHECK(env.RunOnce(*probe).reason == "comm keepalive stale: last one 6000 ms ago (limit 3000 ms)");
  env.engine.keepalive_ms = 0;
  env.engine.warm = false;
  CHECK(env.RunOnce(*probe).reason == "comm not warm");
}

TEST_CASE("probe: port probe", "[probes]") {
  Env env;
  auto up = MakePortProbe(&env.loop, {"127.0.0.1", env.server->port()}, 5000);
  CHECK(env.RunOnce(*up).ok);
  auto down = MakePortProbe(&env.loop, {"127.0.0.1", test::UnusedPort()}, 200);
  CHECK(env.RunOnce(*down).reason == "connection refused");
  auto bad = MakePortProbe(&env.loop, {"nowhere.example", 80}, 200);
  CHECK(env.RunOnce(*bad).reason.find("not an IP address") != std::string::npos);
  // Cancel in flight, then destroy: nothing runs, nothing leaks.
  bool called = false;
  up->Run([&](ProbeOutcome) { called = true; });
  up->Cancel();
  up.reset();
  uv_run(&env.loop, UV_RUN_NOWAIT);
  CHECK_FALSE(called);
}

const char* kConfig = R"([node]
name = "t"
state_dir = "s"
runtime_dir = "r"
[model]
path = "m"
[engine]
command = ["e", "{port}"]
primary_port = 8001
standby_port = 8002
[probe]
prompt = "Hello, world"
expect_token_ids = [92, 16, 97]
max_tokens = 3
interval_ms = 5000
timeout_ms = 5000
failures = 3
successes = 2
comm = true
comm_max_age_ms = 60000
[front]
listen = "127.0.0.1:8000"
[admin]
listen = "127.0.0.1:9090"
)";

TEST_CASE("probe: the configured probe is semantic then comm", "[probes]") {
  Env env;
  auto config = ParseConfig(kConfig, "/tmp/c.toml");
  REQUIRE(config.ok());
  env.engine.keepalive_ms = 10;
  auto probe = MakeProbeFromConfig(*config, env.server->port(), "", *env.client);
  CHECK(env.RunOnce(*probe).ok);
  env.engine.warm = false;
  CHECK(env.RunOnce(*probe).reason == "comm: comm not warm");
  env.engine.answer = {1};
  CHECK(env.RunOnce(*probe).reason == "wrong answer: got [1] expected [92, 16, 97]");
  auto h = HysteresisFromConfig(*config, 9);
  CHECK(h.failures == 3);
  CHECK(h.successes == 2);
  CHECK(h.interval_ms == 5000);
  CHECK(h.seed == 9);

  auto port_config = ParseConfig(kConfig, "/tmp/c.toml", {"probe.kind=port"});
  REQUIRE_FALSE(port_config.ok());  // a prompt makes no sense for a port probe
  CHECK(port_config.error().message().find("probe.prompt: ") != std::string::npos);
}

TEST_CASE("monitor: trips on bad answers, recovers, stops clean", "[probes]") {
  Env env;
  HysteresisOptions o;
  o.failures = 3;
  o.successes = 2;
  o.interval_ms = 2;
  o.jitter_ms = 3;
  o.seed = 5;
  SemanticProbeSpec spec = IdsSpec();
  spec.timeout_ms = 5000;
  std::vector<HealthTransition> transitions;
  std::vector<ProbeOutcome> outcomes;
  auto monitor = std::make_unique<HealthMonitor>(
      &env.loop, MakeSemanticProbe(*env.client, {"127.0.0.1", env.server->port()}, spec), o, RealClock(),
      [&](const HealthTransition& t) { transitions.push_back(t); },
      [&](const ProbeOutcome& p) { outcomes.push_back(p); });
  monitor->Start();
  REQUIRE(test::RunUntil(&env.loop, [&] { return transitions.size() == 1; }));
  CHECK(transitions[0].to == Health::kHealthy);

  env.engine.answer = {0, 0, 0};
  size_t before = outcomes.size();
  REQUIRE(test::RunUntil(&env.loop, [&] { return transitions.size() == 2; }));
  CHECK(transitions[1].to == Health::kUnhealthy);
  CHECK(transitions[1].cause ==
        "3 consecutive probe failures; last: wrong answer: got [0, 0, 0] expected [92, 16, 97]");
  // Exactly three bad answers were needed (one in flight at the switch may have passed).
  CHECK(outcomes.size() - before <= 4);

  env.engine.answer = {92, 16, 97};
  REQUIRE(test::RunUntil(&env.loop, [&] { return transitions.size() == 3; }));
  CHECK(transitions[2].cause == "2 consecutive probe successes");

  // Stop while a probe hangs: its outcome never arrives.
  env.engine.hang = true;
  REQUIRE(test::RunUntil(&env.loop, [&] { return env.engine.hung == 1; }));
  bool stopped = false;
  monitor->Stop([&] { stopped = true; });
  REQUIRE(test::RunUntil(&env.loop, [&] { return stopped; }));
  CHECK_FALSE(monitor->running());
  size_t after_stop = outcomes.size();
  monitor.reset();
  uv_run(&env.loop, UV_RUN_NOWAIT);
  CHECK(outcomes.size() == after_stop);
}

// A probe the test answers by hand: Run() keeps the callback.
class HeldProbe : public Probe {
 public:
  const char* kind() const override { return "held"; }
  void Run(Callback done) override {
    ++runs;
    pending = std::move(done);
  }
  void Cancel() override { pending = nullptr; }
  void Answer() {
    ProbeOutcome o;
    o.ok = true;
    auto done = std::move(pending);
    pending = nullptr;
    done(o);
  }
  int runs = 0;
  Callback pending;
};

TEST_CASE("monitor: Postpone holds the next probe back, never brings it forward, and spares one in flight",
          "[probes]") {
  uv_loop_t loop;
  uv_loop_init(&loop);
  HysteresisOptions o;
  o.interval_ms = 5;
  o.jitter_ms = 0;
  auto owned = std::make_unique<HeldProbe>();
  HeldProbe* probe = owned.get();
  auto monitor = std::make_unique<HealthMonitor>(&loop, std::move(owned), o, RealClock(),
                                                 [](const HealthTransition&) {});
  monitor->Start();
  REQUIRE(test::RunUntil(&loop, [&] { return probe->runs == 1; }));

  // In flight: nothing to hold back; its successor comes at the interval.
  monitor->Postpone(60'000);
  probe->Answer();
  REQUIRE(test::RunUntil(&loop, [&] { return probe->runs == 2; }, 5'000));
  probe->Answer();
  REQUIRE(test::RunUntil(&loop, [&] { return probe->runs == 3; }, 5'000));
  probe->Answer();

  // Waiting: held back a minute. Unheld, the 5 ms interval would have run
  // dozens of probes in the 300 ms the loop runs here; a shorter
  // postponement after it does not bring the probe forward.
  monitor->Postpone(60'000);
  monitor->Postpone(1);
  CHECK_FALSE(test::RunUntil(&loop, [&] { return probe->runs > 3; }, 300));
  CHECK(probe->runs == 3);

  bool stopped = false;
  monitor->Stop([&] { stopped = true; });
  REQUIRE(test::RunUntil(&loop, [&] { return stopped; }));
  monitor.reset();
  CHECK(test::CloseLoop(&loop) == 0);
}

}  // namespace
}  // namespace wsup
