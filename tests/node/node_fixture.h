// A node under test, for the end-to-end suites (tests/node, tests/chaos):
// the real `wsup start` with the real holder, engines and front on the tiny
// checkpoint, on the CPU, in a temporary directory with kernel-chosen ports.
//
// Every process of a node carries WSUP_TEST_NODE=<its directory> in its
// environment (the supervisor passes its environment on), so the fixture
// ends whatever the node left running when it is destroyed, whether the
// test passed or not, and whatever the test did to the supervisor.
#pragma once

#include <signal.h>
#include <sqlite3.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "tests/http/http_test_client.h"
#include "tests/sanitized.h"
#include "tests/test_util.h"
#include "wire/json_call.h"

namespace wsup::nodetest {

using namespace std::chrono_literals;
using nlohmann::json;

// Sanitizer builds run the engines several times slower: the probe's
// budget grows with them, and so does every bound derived from it.
#if WSUP_TEST_SANITIZED
constexpr bool kSanitizedNode = true;
constexpr int kProbeMs = 1000;
#else
constexpr bool kSanitizedNode = false;
constexpr int kProbeMs = 150;
#endif

inline const std::vector<int> kGolden = {92, 16, 97, 246, 28, 201, 169, 207, 160, 234, 48, 216, 188, 48, 232, 118};

inline std::vector<int> GoldenIds() {
  auto g = json::parse(test::ReadAll(test::TestData("llama-tiny-f32/golden.json")));
  return g["cases"][0]["output_ids"].get<std::vector<int>>();
}

// One node under test.
class Node {
 public:
  explicit Node(std::vector<std::string> extra_sets = {}, std::string model = "")
      : sets_(std::move(extra_sets)), model_(std::move(model)) {}

  std::string Sock() const { return dir_.Join("run/wsup.sock"); }
  std::string FrontSock() const { return dir_.Join("run/front.sock"); }
  std::string Db() const { return dir_.Join("state/wsup.db"); }
  const test::TempDir& dir() const { return dir_; }
  // A config file of the test's own instead of config/demo.toml (the same
  // overrides apply; a reload reads the file again).
  void UseConfig(std::string path) { config_ = std::move(path); }

  std::vector<std::string> Argv(const std::string& cmd) const {
    std::string eng = test::BinPath("wsup-engine");
    std::vector<std::string> a = {test::BinPath("wsup"), cmd,
                                  config_.empty() ? std::string(WSUP_SOURCE_DIR) + "/config/demo.toml" : config_};
    std::vector<std::string> sets = {
        "node.state_dir=" + dir_.Join("state"),
        "node.runtime_dir=" + dir_.Join("run"),
        "engine.command=[\"" + eng +
            "\", \"--model\", \"{model}\", \"--port\", \"{port}\", \"--weight-cache\", \"{mode}\", \"--socket\", "
            "\"{socket}\", \"--device\", \"{devices}\", \"--revision\", \"{revision}\", \"--kv-cache-mib\", \"8\"]",
        "engine.primary_port=0",
        "engine.standby_port=0",
        "front.listen=127.0.0.1:0",
        "admin.listen=127.0.0.1:0",
        "model.path=" + (model_.empty() ? test::TestData("llama-tiny-f32") : model_),
        "probe.interval_ms=" + std::to_string(kProbeMs),
        "probe.timeout_ms=" + std::to_string(kProbeMs),
        "probe.failures=3",
        "probe.jitter_ms=0",
        "front.hedge_after_ms=0",  // the demo hedges; a test that wants it says so
    };
    sets.insert(sets.end(), sets_.begin(), sets_.end());
    for (const auto& s : sets) {
      a.push_back("--set");
      a.push_back(s);
    }
    return a;
  }

  void Start() {
    sup_ = test::Child::Start(Argv("start"), dir_.Join("supervisor.log"), {}, {{"WSUP_TEST_NODE", dir_.path()}});
  }
  // Every live process of this node (supervisor, front, holders, engines).
  std::vector<test::TaggedProcess> Processes() const { return test::TaggedProcesses("WSUP_TEST_NODE", dir_.path()); }
  test::Child& sup() { return sup_; }
  std::string Log() const { return test::ReadAll(dir_.Join("supervisor.log")); }

  std::optional<json> Status() const {
    auto r = JsonCall(Sock(), json{{"type", "status"}}, 2000);
    if (!r.ok()) return std::nullopt;
    return *r;
  }
  // Waits until pred(status) holds.
  bool WaitStatus(const std::function<bool(const json&)>& pred, std::chrono::milliseconds limit) const {
    return test::WaitFor(
        [&] {
          auto s = Status();
          return s && pred(*s);
        },
        limit);
  }
  bool WaitServing(std::chrono::milliseconds limit = 60s) const {
    return WaitStatus(
        [](const json& s) {
          if (s.value("state", "") != "serving") return false;
          int ready = 0;
          for (const auto& e : s["engines"]) ready += e.value("semantic_ready", false) && e.value("role", "") != "none";
          return ready == 2;
        },
        limit);
  }
  int FrontPort() const {
    auto s = Status();
    if (!s) return 0;
    std::string l = (*s)["front"].value("listen", "");
    return std::atoi(l.c_str() + l.rfind(':') + 1);
  }
  json Engine(const json& s, const std::string& role) const {
    for (const auto& e : s["engines"]) {
      if (e.value("role", "") == role) return e;
    }
    return json();
  }
  // The Authorization header of the engine of `slot`'s control routes: the
  // token the supervisor gave it, from its 0600 state.json (only the node's
  // user can read it). Empty when none is recorded.
  std::vector<std::pair<std::string, std::string>> ControlAuth(const std::string& slot) const {
    json st = json::parse(test::ReadAll(dir_.Join("run/state.json")), nullptr, false);
    if (!st.is_object()) return {};
    for (const auto& e : st.value("engines", json::array())) {
      if (e.value("slot", "") == slot && !e.value("control_token", "").empty()) {
        return {{"Authorization", "Bearer " + e.value("control_token", "")}};
      }
    }
    return {};
  }

  // Runs `wsup ARGS... --socket SOCK`.
  test::RunResult Cli(std::vector<std::string> args) const {
    std::vector<std::string> a = {test::BinPath("wsup")};
    a.insert(a.end(), args.begin(), args.end());
    a.push_back("--socket");
    a.push_back(Sock());
    return test::Run(a, 60s);
  }

  void Stop() {
    if (sup_.running()) {
      auto r = Cli({"stop"});
      sup_.Wait(30s);
    }
  }
  ~Node() {
    Stop();
    // Anything still running from this node (a test that killed the
    // supervisor) is ended by its recorded pids.
    auto st = test::ReadAll(dir_.Join("run/state.json"));
    if (!st.empty()) {
      try {
        auto j = json::parse(st);
        auto kill = [](const json& p) { ::kill(-p.value("pid", 0), SIGKILL); };
        if (!j["front"].is_null()) kill(j["front"]["proc"]);
        for (const auto& h : j["holders"]) kill(h["proc"]);
        for (const auto& e : j["engines"]) kill(e["proc"]);
      } catch (...) {
      }
    }
    // And whatever no state file names (a process started a moment before
    // its supervisor was killed): everything carrying this node's tag.
    sup_.Kill(SIGKILL);
    sup_.Wait(5s);
    test::KillLeftovers("WSUP_TEST_NODE", dir_.path(), 0ms);
  }

 private:
  test::TempDir dir_;
  std::vector<std::string> sets_;
  std::string model_;
  std::string config_;
  test::Child sup_;
};

// A greedy completion through the front: the generated ids, or empty.
inline std::vector<int> Complete(int port, const std::string& prompt = "Hello, world") {
  json req{{"prompt", prompt}, {"max_tokens", 16}, {"temperature", 0}, {"return_token_ids", true}};
  auto r = test::HttpRequestOnce(port, "POST", "/v1/completions", req.dump(), 20s,
                                 {{"Content-Type", "application/json"}});
  if (r.status != 200) return {};
  try {
    return json::parse(r.body)["choices"][0]["token_ids"].get<std::vector<int>>();
  } catch (...) {
    return {};
  }
}

struct Rows {
  std::vector<std::map<std::string, std::string>> rows;
  // One line per row, "col=value col=value", for test messages.
  std::string Dump() const {
    std::string out;
    for (const auto& r : rows) {
      for (const auto& [k, v] : r) out += k + "=" + v + " ";
      out += "\n";
    }
    return out;
  }
};

inline Rows Query(const std::string& db, const std::string& sql) {
  Rows out;
  sqlite3* h = nullptr;
  if (sqlite3_open_v2(db.c_str(), &h, SQLITE_OPEN_READONLY, nullptr) != SQLITE_OK) return out;
  sqlite3_busy_timeout(h, 2000);
  sqlite3_stmt* st = nullptr;
  if (sqlite3_prepare_v2(h, sql.c_str(), -1, &st, nullptr) == SQLITE_OK) {
    while (sqlite3_step(st) == SQLITE_ROW) {
      std::map<std::string, std::string> row;
      for (int i = 0; i < sqlite3_column_count(st); ++i) {
        auto* t = sqlite3_column_text(st, i);
        row[sqlite3_column_name(st, i)] = t ? reinterpret_cast<const char*>(t) : "";
      }
      out.rows.push_back(row);
    }
  }
  sqlite3_finalize(st);
  sqlite3_close(h);
  return out;
}

inline bool Have() {
  if (!test::HaveTestData("llama-tiny-f32")) {
    WARN("SKIP: testdata/llama-tiny-f32 is missing");
    return false;
  }
  return true;
}

}  // namespace wsup::nodetest
