#include "testkit/node.h"

#include <signal.h>

#include <filesystem>

#include "testkit/http_client.h"
#include "wire/json_call.h"

namespace wsup::test {

using nlohmann::json;
using namespace std::chrono_literals;

namespace {

// The folder's tag in every process of the node.
constexpr const char* kTag = "WSUP_TEST_NODE";

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

json EngineOf(const json& status, const std::string& role) {
  if (!status.is_object()) return json();
  for (const auto& e : status.value("engines", json::array())) {
    if (e.is_object() && e.value("role", "") == role) return e;
  }
  return json();
}

Node::Node(NodeSpec spec) : spec_(std::move(spec)) {}

std::string Node::ConfigPath() const {
  return spec_.config_file.empty() ? std::string(WSUP_SOURCE_DIR) + "/config/" + spec_.config : spec_.config_file;
}

std::vector<std::string> Node::Argv(const std::string& cmd) const {
  std::vector<std::string> a = {BinPath("wsup"), cmd, ConfigPath()};
  std::vector<std::string> sets = {
      "node.state_dir=" + dir_.Join("state"),
      "node.runtime_dir=" + dir_.Join("run"),
      "engine.primary_port=0",
      "engine.standby_port=0",
      "front.listen=127.0.0.1:0",
      "admin.listen=127.0.0.1:0",
      "front.hedge_after_ms=0",  // the demo hedges; a test that wants it says so
  };
  if (spec_.probe_ms > 0) {
    sets.push_back("probe.interval_ms=" + std::to_string(spec_.probe_ms));
    sets.push_back("probe.timeout_ms=" + std::to_string(spec_.probe_ms));
    sets.push_back("probe.jitter_ms=0");
  }
  if (spec_.probe_failures > 0) sets.push_back("probe.failures=" + std::to_string(spec_.probe_failures));
  if (spec_.unlimited_restarts) {
    sets.push_back("supervisor.restart_backoff_ms=0");
    sets.push_back("supervisor.max_restarts=1000");
  }
  if (!spec_.command_in_file) {
    sets.push_back("engine.command=" + EngineCommandToml(spec_.kv_pool, spec_.engine_args, spec_.engine_prefix));
    bool is_path = spec_.model.find('/') != std::string::npos;
    sets.push_back("model.path=" + (is_path ? spec_.model : TestData(spec_.model)));
  }
  sets.insert(sets.end(), spec_.sets.begin(), spec_.sets.end());
  for (const auto& s : sets) {
    a.push_back("--set");
    a.push_back(s);
  }
  return a;
}

void Node::Start() {
  auto env = spec_.env;
  env.emplace_back(kTag, dir_.path());
  sup_ = Child::Start(Argv("start"), dir_.Join("supervisor.log"), {}, env);
}

RunResult Node::Cli(std::vector<std::string> args) const {
  std::vector<std::string> a = {BinPath("wsup")};
  a.insert(a.end(), args.begin(), args.end());
  a.push_back("--socket");
  a.push_back(SupervisorSocket());
  return Run(a, 60s);
}

void Node::Stop() {
  if (sup_.running()) {
    (void)Cli({"stop"});
    sup_.Wait(30s);
  }
}

Node::~Node() {
  Stop();
  // Anything still running from this node (a test that killed the
  // supervisor) is ended by its recorded pids...
  json st = json::parse(ReadAll(dir_.Join("run/state.json")), nullptr, false);
  if (st.is_object()) {
    auto kill = [](const json& p) {
      int pid = p.is_object() ? p.value("pid", 0) : 0;
      if (pid > 0) ::kill(-pid, SIGKILL);
    };
    if (st.contains("front") && st["front"].is_object()) kill(st["front"].value("proc", json()));
    for (const auto& h : st.value("holders", json::array())) kill(h.value("proc", json()));
    for (const auto& e : st.value("engines", json::array())) kill(e.value("proc", json()));
  }
  // ... and whatever no state file names (a process started a moment
  // before its supervisor was killed): everything carrying the node's tag.
  sup_.Kill(SIGKILL);
  sup_.Wait(5s);
  KillLeftovers(kTag, dir_.path(), 0ms);
}

std::vector<TaggedProcess> Node::Processes() const { return TaggedProcesses(kTag, dir_.path()); }

std::string Node::LogTails(size_t lines) const {
  std::string out = "== supervisor.log (last " + std::to_string(lines) + " lines)" + Tail(Log(), lines) + "\n";
  std::error_code ec;
  for (const auto& f : std::filesystem::directory_iterator(dir_.Join("state/logs"), ec)) {
    out += "== " + f.path().filename().string() + Tail(ReadAll(f.path().string()), lines) + "\n";
  }
  return out;
}

std::optional<json> Node::Status() const {
  auto r = JsonCall(SupervisorSocket(), json{{"type", "status"}}, 2000, "the supervisor");
  if (!r.ok()) return std::nullopt;
  return std::move(*r);
}

bool Node::WaitStatus(const std::function<bool(const json&)>& pred, std::chrono::milliseconds limit) const {
  return WaitFor(
      [&] {
        auto s = Status();
        return s && pred(*s);
      },
      limit);
}

bool Node::WaitServing(std::chrono::milliseconds limit) const {
  return WaitStatus(
      [](const json& s) {
        if (s.value("state", "") != "serving") return false;
        int ready = 0;
        for (const auto& e : s.value("engines", json::array())) {
          ready += e.value("semantic_ready", false) && e.value("role", "") != "none";
        }
        return ready == 2;
      },
      limit);
}

int Node::FrontPort() const {
  auto s = Status();
  if (!s || !(*s)["front"].is_object()) return 0;
  std::string l = (*s)["front"].value("listen", "");
  size_t colon = l.rfind(':');
  return colon == std::string::npos ? 0 : std::atoi(l.c_str() + colon + 1);
}

std::string Node::ControlToken(const std::string& slot) const {
  json st = json::parse(ReadAll(dir_.Join("run/state.json")), nullptr, false);
  if (!st.is_object()) return "";
  for (const auto& e : st.value("engines", json::array())) {
    if (e.is_object() && e.value("slot", "") == slot) return e.value("control_token", "");
  }
  return "";
}

std::vector<std::pair<std::string, std::string>> Node::ControlAuth(const std::string& slot) const {
  std::string token = ControlToken(slot);
  if (token.empty()) return {};
  return {{"Authorization", "Bearer " + token}};
}

std::string Node::Metrics() const {
  auto s = Status();
  if (!s) return "";
  const std::string admin = s->value("admin", "");
  const size_t colon = admin.rfind(':');
  if (colon == std::string::npos) return "";
  return HttpRequestOnce(std::atoi(admin.c_str() + colon + 1), "GET", "/metrics", "", std::chrono::seconds(5)).body;
}

std::optional<json> Node::EngineStatus(const std::string& role) const {
  auto s = Status();
  if (!s) return std::nullopt;
  const json e = EngineOf(*s, role);
  if (!e.is_object()) return std::nullopt;
  auto r = HttpRequestOnce(e.value("port", 0), "GET", "/wsup/status", "", std::chrono::seconds(2),
                           ControlAuth(e.value("slot", "")));
  json j = json::parse(r.body, nullptr, false);
  if (r.status != 200 || !j.is_object()) return std::nullopt;
  return j;
}

double MetricValue(const std::string& text, const std::string& name) {
  size_t pos = 0;
  while ((pos = text.find(name + " ", pos)) != std::string::npos) {
    if (pos == 0 || text[pos - 1] == '\n') return std::atof(text.c_str() + pos + name.size() + 1);
    pos += name.size();
  }
  return -1;
}

}  // namespace wsup::test
