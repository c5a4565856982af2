// The official `openai` npm client through the front while crash drills run
// (acceptance 2 of the failover issue), on the byte-tokenizer test model and
// on a real-tokenizer one (chats and text completions). A real node (tests/drills/drill_node.h)
// serves; tests/openai/stream_check.mjs streams greedy completions with the
// openai package (installed by scripts/setup.sh with `npm ci`, client
// retries off) from 8 concurrent loops and checks each against the golden
// output; meanwhile the active engine is SIGKILLed, drill after drill, until
// at least 3 drills ran and the front has resumed a cut stream (at most 20
// drills). Then the script is stopped and must report every completion
// complete and correct.
#include <catch2/catch.hpp>

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "testkit/failover_drill.h"
#include "testkit/http_client.h"
#include "testkit/test_util.h"
#include "testkit/tok_tiny.h"
#include "tests/drills/drill_node.h"
#include "wire/json_call.h"

namespace wsup {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

std::string FindOnPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::stringstream ss(path ? path : "/usr/local/bin:/usr/bin:/bin");
  std::string dir;
  while (std::getline(ss, dir, ':')) {
    std::string p = dir + "/" + name;
    if (!dir.empty() && ::access(p.c_str(), X_OK) == 0) return p;
  }
  return "";
}

// The last "progress OK BAD" line of the script's output.
std::pair<int64_t, int64_t> Progress(const std::string& log) {
  size_t pos = log.rfind("progress ");
  if (pos == std::string::npos) return {0, 0};
  std::istringstream in(log.substr(pos + 9));
  int64_t ok = 0, bad = 0;
  in >> ok >> bad;
  return {ok, bad};
}

struct ClientDrills {
  int min_drills = 3;
  bool hang = false;                  // SIGSTOP the active engine instead of SIGKILL
  std::vector<std::string> script_args;  // more stream_check.mjs arguments
  std::function<void()> after_each;      // run after each drill, once the clients went on
  std::function<bool()> more;            // SIGKILL: drill again while it says so (at most 20 drills)
};

// Runs stream_check.mjs (8 clients) on the node's front against `golden`,
// drills the active engine again and again (SIGKILL: at least min_drills,
// until the front has resumed a stream and `more` says enough, at most 20;
// SIGSTOP: min_drills),
// then stops the script: every answer must have been complete and golden.
// Returns the script's summary.
json DrillWithClients(test::DrillNode& n, const std::string& golden, const ClientDrills& how = {}) {
  std::string dir = std::string(WSUP_SOURCE_DIR) + "/tests/openai";
  std::string node = FindOnPath("node");
  INFO("node.js and the openai package come from scripts/setup.sh (apt nodejs npm; npm ci in tests/openai)");
  REQUIRE(!node.empty());
  REQUIRE(std::filesystem::exists(dir + "/node_modules/openai/package.json"));
  int port = n.FrontPort();
  REQUIRE(port > 0);

  std::string log = n.dir().Join("stream_check.log");
  std::vector<std::string> argv = {node,     dir + "/stream_check.mjs", "--base-url",
                                   "http://127.0.0.1:" + std::to_string(port) + "/v1", "--golden", golden,
                                   "--clients", "8"};
  argv.insert(argv.end(), how.script_args.begin(), how.script_args.end());
  test::Child script = test::Child::Start(argv, log);
  auto progress = [&] { return Progress(test::ReadAll(log)); };
  INFO(test::ReadAll(log));
  REQUIRE(test::WaitFor([&] { return progress().first >= 20 || !script.running(); }, 60s));
  REQUIRE(script.running());

  auto target = test::MakeWsupTarget({n.SupervisorSocket(), n.FrontSocket()});
  int drills = 0;
  int64_t resumed = 0, retried = 0;
  auto again = [&] {
    if (drills >= 20) return false;
    if (drills < how.min_drills) return true;
    if (how.hang) return false;
    return resumed == 0 || (how.more && how.more());
  };
  while (again()) {
    Status ready = target->WaitReady(120s);
    REQUIRE(ready.ok());
    // Streams are in flight when the kill comes: the loops never pause.
    int64_t before = progress().first;
    REQUIRE(test::WaitFor([&] { return progress().first >= before + 8; }, 30s));
    test::DrillRecord d;
    Status drilled = how.hang ? target->Hang(&d) : target->Crash(&d);
    REQUIRE(drilled.ok());
    ++drills;
    int64_t at_kill = progress().first;
    // The clients go on succeeding after the kill.
    REQUIRE(test::WaitFor([&] { return progress().first >= at_kill + 16; }, 60s));
    REQUIRE(target->Counters(&resumed, &retried).ok());
    if (how.after_each) how.after_each();
  }
  if (!how.hang) CHECK(resumed > 0);

  script.Kill(SIGTERM);
  REQUIRE(script.Wait(60s) >= 0);
  std::string out = test::ReadAll(log);
  size_t s = out.rfind("summary ");
  REQUIRE(s != std::string::npos);
  json summary = json::parse(out.substr(s + 8, out.find('\n', s) - s - 8));
  INFO(summary.dump(1));
  CHECK(summary["bad"] == 0);
  CHECK(summary["streams"].get<int64_t>() > 0);
  CHECK(summary["plain"].get<int64_t>() > 0);
  CHECK(script.exit_code() == 0);
  WARN(drills << (how.hang ? " hang" : " crash") << " drills; the front resumed " << resumed
              << " streams and retried " << retried << " requests; the client saw " << summary["ok"]
              << " correct answers");
  return summary;
}

TEST_CASE("openai: the official npm client streams through crash drills, every stream complete and golden",
          "[openai][drills]") {
  if (test::SkipWithout("llama-tiny-f32")) return;
  test::DrillNode n;
  n.Start();
  INFO(n.Log());
  REQUIRE(n.WaitServing());
  DrillWithClients(n, test::TestData("llama-tiny-f32/golden.json"));
}

// A drill node on llama3-tok-tiny (Llama-3's tokenizer and chat template,
// made runnable in `models`); its probe asks the golden's first prompt (a
// margin of 0.006: sure).
test::DrillNodeSpec TokTinySpec(const test::TempDir& models, std::string* model) {
  auto made = test::TokTinyCheckpoint(models, "llama3");
  INFO((made.ok() ? *made : made.error().message()));
  REQUIRE(made.ok());
  *model = *made;
  auto cases = test::TokTinyGoldens("llama3", /*chats=*/false);
  REQUIRE(!cases.empty());
  REQUIRE(cases[0].margin >= test::kExactMargin);
  test::DrillNodeSpec spec;
  spec.model = *made;
  spec.sets = {"probe.prompt=" + json(cases[0].prompt).dump(),
               "probe.expect_token_ids=" + json(cases[0].output_ids).dump()};
  return spec;
}

// The front's resumed streams: (chats, text completions).
std::pair<int64_t, int64_t> Resumed(const test::DrillNode& n) {
  auto f = JsonCall(n.FrontSocket(), json{{"type", "status"}}, 5000);
  if (!f.ok()) return {-1, -1};
  const json& c = (*f)["counters"];
  const int64_t chats = c.value("resumed_chat", int64_t{0});
  return {chats, c.value("resumed", int64_t{0}) - chats};
}

TEST_CASE("openai: chats and text completions on a real tokenizer go through crash drills with transformers' text",
          "[openai][drills]") {
  test::TempDir models;
  std::string model;
  test::DrillNode n(TokTinySpec(models, &model));
  n.Start();
  INFO(n.Log());
  REQUIRE(n.WaitServing());
  // The clients alternate chats and text completions. Drills go on until
  // five of them (three in sanitizer builds, whose engines are several
  // times slower) each cut and resumed streams of both kinds.
  const int wanted = test::kSanitized ? 3 : 5;
  int both = 0, drills = 0;
  std::pair<int64_t, int64_t> last = Resumed(n);
  ClientDrills how;
  how.min_drills = wanted;
  how.after_each = [&] {
    auto now = Resumed(n);
    ++drills;
    if (now.first > last.first && now.second > last.second) ++both;
    last = now;
  };
  how.more = [&] { return both < wanted; };
  json summary = DrillWithClients(n, model + "/golden.json", how);
  WARN(drills << " SIGKILL drills, " << both << " of them cut chats and text completions alike; resumed "
              << last.first << " chat streams and " << last.second << " completion streams");
  CHECK(both >= wanted);
  CHECK(summary["chats"].get<int64_t>() > 0);
}

TEST_CASE("openai: chats and text completions on a real tokenizer go through SIGSTOP drills hidden by hedging",
          "[openai][drills][hedge]") {
  test::TempDir models;
  std::string model;
  test::DrillNodeSpec spec = TokTinySpec(models, &model);
  spec.sets.push_back("front.hedge_after_ms=200");
  test::DrillNode n(spec);
  n.Start();
  INFO(n.Log());
  REQUIRE(n.WaitServing());
  ClientDrills how;
  how.hang = true;
  how.min_drills = test::kSanitized ? 3 : 5;  // as above
  json summary = DrillWithClients(n, model + "/golden.json", how);
  CHECK(summary["chats"].get<int64_t>() > 0);
}

TEST_CASE("openai: chat streams cut on the KV pool resume from the dead engine's KV", "[openai][drills][kv_pool]") {
  test::TempDir models;
  std::string model;
  test::DrillNodeSpec spec = TokTinySpec(models, &model);
  spec.kv_pool = true;
  test::DrillNode n(spec);
  n.Start();
  INFO(n.Log());
  REQUIRE(n.WaitServing());
  // Each engine process's adopted and recomputed sequences, from its own
  // /wsup/status after every drill: a killed engine's counts go with it.
  std::map<int64_t, std::pair<int64_t, int64_t>> by_pid;
  ClientDrills how;
  how.script_args = {"--only", "chats"};
  how.after_each = [&] {
    auto st = n.Status();
    if (!st) return;
    for (const auto& e : (*st)["engines"]) {
      const int port = e.value("port", 0);
      if (port <= 0) continue;
      auto headers = n.ControlAuth(e.value("slot", ""));
      test::HttpResult r = test::HttpRequestOnce(port, "GET", "/wsup/status", "", 10s, headers);
      json es = json::parse(r.body, nullptr, false);
      if (!es.is_object() || !es.contains("resume")) continue;
      by_pid[e.value("pid", int64_t{0})] = {es["resume"].value("adopted_sequences", int64_t{0}),
                                            es["resume"].value("recomputed_sequences", int64_t{0})};
    }
  };
  json summary = DrillWithClients(n, model + "/golden.json", how);
  CHECK(summary["chats"] == summary["ok"]);
  int64_t adopted = 0, recomputed = 0;
  for (const auto& [pid, counts] : by_pid) {
    adopted += counts.first;
    recomputed += counts.second;
  }
  WARN("resumed chat streams: " << adopted << " adopted the dead engine's KV, " << recomputed << " recomputed it");
  CHECK(adopted > 0);
}

}  // namespace
}  // namespace wsup
