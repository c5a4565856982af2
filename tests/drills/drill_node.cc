#include "tests/drills/drill_node.h"

#include <signal.h>

#include <catch2/catch.hpp>

#include <filesystem>

#include "wire/json_call.h"

namespace wsup::test {

using nlohmann::json;
using namespace std::chrono_literals;

DrillNode::DrillNode(std::vector<std::string> extra_sets) { spec_.sets = std::move(extra_sets); }

DrillNode::DrillNode(DrillNodeSpec spec) : spec_(std::move(spec)) {}

std::string DrillNode::ConfigPath() const {
  return spec_.config_file.empty() ? std::string(WSUP_SOURCE_DIR) + "/config/" + spec_.config : spec_.config_file;
}

RunResult DrillNode::Cli(std::vector<std::string> args) const {
  std::vector<std::string> a = {BinPath("wsup")};
  a.insert(a.end(), args.begin(), args.end());
  a.push_back("--socket");
  a.push_back(SupervisorSocket());
  return Run(a, 60s);
}

std::string EngineCommandToml(bool kv_pool, const std::vector<std::string>& extra,
                              const std::vector<std::string>& prefix) {
  std::string cmd = "[";
  for (const auto& p : prefix) cmd += "\"" + p + "\", ";
  cmd += "\"" + BinPath("wsup-engine") +
         "\", \"--model\", \"{model}\", \"--port\", \"{port}\", \"--weight-cache\", \"{mode}\", \"--socket\", "
         "\"{socket}\", \"--device\", \"{devices}\", \"--revision\", \"{revision}\", \"--kv-cache-mib\", \"8\"" +
         std::string(kv_pool ? ", \"--kv-pool\", \"--kv-scratch-mib\", \"{kv_scratch_mib}\"" : "");
  for (const auto& e : extra) cmd += ", \"" + e + "\"";
  return cmd + "]";
}

void DrillNode::Start() {
  std::vector<std::string> a = {BinPath("wsup"), "start", ConfigPath()};
  std::vector<std::string> sets = {
      "node.state_dir=" + dir_.Join("state"),
      "node.runtime_dir=" + dir_.Join("run"),
      "engine.primary_port=0",
      "engine.standby_port=0",
      "front.listen=127.0.0.1:0",
      "admin.listen=127.0.0.1:0",
      "probe.interval_ms=" + std::to_string(kDrillProbeMs),
      "probe.timeout_ms=" + std::to_string(kDrillProbeMs),
      "probe.jitter_ms=0",
      "supervisor.restart_backoff_ms=0",
      // Every crash drill is a restart; the drills must not exhaust the budget.
      "supervisor.max_restarts=1000",
      // The demo hedges; a test that wants it says so (its sets come last).
      "front.hedge_after_ms=0",
  };
  if (!spec_.command_in_file) {
    sets.push_back("engine.command=" + EngineCommandToml(spec_.kv_pool, spec_.engine_args, spec_.engine_prefix));
    sets.push_back("model.path=" + TestData(spec_.model));
  }
  sets.insert(sets.end(), spec_.sets.begin(), spec_.sets.end());
  for (const auto& s : sets) {
    a.push_back("--set");
    a.push_back(s);
  }
  sup_ = Child::Start(a, dir_.Join("supervisor.log"), {}, spec_.env);
}

namespace {
std::string Tail(const std::string& text, size_t lines) {
  size_t at = text.size();
  for (size_t n = 0; n <= lines && at > 0; ++n) {
    size_t nl = text.rfind('\n', at - 1);
    if (nl == std::string::npos) return text;
    at = nl;
  }
  return text.substr(at);
}
}  // namespace

std::string DrillNode::LogTails(size_t lines) const {
  std::string out = "== supervisor.log (last " + std::to_string(lines) + " lines)" + Tail(Log(), lines) + "\n";
  std::error_code ec;
  for (const auto& f : std::filesystem::directory_iterator(dir_.Join("state/logs"), ec)) {
    out += "== " + f.path().filename().string() + Tail(ReadAll(f.path().string()), lines) + "\n";
  }
  return out;
}

std::optional<json> DrillNode::Status() const {
  auto r = JsonCall(SupervisorSocket(), json{{"type", "status"}}, 2000);
  if (!r.ok()) return std::nullopt;
  return *r;
}

bool DrillNode::WaitServing(std::chrono::milliseconds limit) const {
  return WaitFor(
      [&] {
        auto s = Status();
        if (!s || s->value("state", "") != "serving") return false;
        int ready = 0;
        for (const auto& e : (*s)["engines"]) ready += e.value("semantic_ready", false) && e.value("role", "") != "none";
        return ready == 2;
      },
      limit);
}

int DrillNode::FrontPort() const {
  auto s = Status();
  if (!s) return 0;
  std::string l = (*s)["front"].value("listen", "");
  return std::atoi(l.c_str() + l.rfind(':') + 1);
}

DrillNode::~DrillNode() {
  if (sup_.running()) {
    Run({BinPath("wsup"), "stop", "--socket", SupervisorSocket()}, 60s);
    sup_.Wait(30s);
  }
  // Whatever is still running from this node, by its recorded pids.
  std::string st = ReadAll(dir_.Join("run/state.json"));
  if (st.empty()) return;
  json j = json::parse(st, nullptr, false);
  if (j.is_discarded()) return;
  auto kill = [](const json& p) {
    int pid = p.value("pid", 0);
    if (pid > 0) ::kill(-pid, SIGKILL);
  };
  if (j.contains("front") && j["front"].is_object()) kill(j["front"]["proc"]);
  for (const auto& h : j.value("holders", json::array())) kill(h["proc"]);
  for (const auto& e : j.value("engines", json::array())) kill(e["proc"]);
}

std::string DrillNode::ControlToken(const std::string& slot) const {
  json st = json::parse(ReadAll(dir_.Join("run/state.json")), nullptr, false);
  if (!st.is_object()) return "";
  for (const auto& e : st.value("engines", json::array())) {
    if (e.value("slot", "") == slot) return e.value("control_token", "");
  }
  return "";
}

nlohmann::json EngineOf(const nlohmann::json& status, const std::string& role) {
  for (const auto& e : status.value("engines", nlohmann::json::array())) {
    if (e.value("role", "") == role) return e;
  }
  return nlohmann::json();
}

bench::LoadOptions DrillLoad(const DrillNode& node, int clients) {
  bench::LoadOptions lo;
  lo.port = node.FrontPort();
  REQUIRE(lo.port > 0);
  lo.clients = clients;
  lo.request_timeout_ms = 60'000;
  return lo;
}

bench::DrillPlan DrillPlanOf(int crash, int planned, int hang, int min_requests_between) {
  bench::DrillPlan plan;
  plan.crash = crash;
  plan.planned = planned;
  plan.hang = hang;
  plan.gap = std::chrono::milliseconds(100);
  plan.min_requests_between = min_requests_between;
  plan.ready_limit = std::chrono::seconds(120);
  plan.verbose = false;
  return plan;
}

void CheckNothingLost(const nlohmann::json& analysis) {
  const nlohmann::json& total = analysis["total"];
  CHECK(total["failed"] == 0);
  CHECK(total["lost"] == 0);
  CHECK(total["duplicated"] == 0);
  CHECK(total["wrong"] == 0);
  CHECK(total["ok"] == total["requests"]);
  CHECK(total["requests"].get<int64_t>() > 0);
}

}  // namespace wsup::test
