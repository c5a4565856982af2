#include "supervisor/runtime_state.h"

#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include "common/fs.h"
#include "supervisor/process.h"

namespace wsup {

using nlohmann::json;

bool ProcessRef::StillRunning() const {
  if (pid <= 0) return false;
  auto st = ProcessStartTime(pid);
  return st.ok() && *st == start_time && ProcessAlive(pid);
}

Result<ProcessRef> ProcessRef::Of(pid_t pid) {
  WSUP_ASSIGN_OR_RETURN(uint64_t st, ProcessStartTime(pid));
  return ProcessRef{pid, st};
}

namespace {

json ProcToJson(const ProcessRef& p) { return json{{"pid", p.pid}, {"start_time", p.start_time}}; }

ProcessRef ProcFromJson(const json& j) {
  ProcessRef p;
  p.pid = j.at("pid").get<pid_t>();
  p.start_time = j.at("start_time").get<uint64_t>();
  return p;
}

}  // namespace

std::string RuntimeState::ToJson() const {
  json j;
  j["version"] = kVersion;
  j["config_path"] = config_path;
  j["node_name"] = node_name;
  j["supervisor"] = ProcToJson(supervisor);
  j["epoch"] = epoch;
  if (front) {
    j["front"] = {{"proc", ProcToJson(front->proc)},
                  {"control_socket", front->control_socket},
                  {"listen", front->listen}};
  } else {
    j["front"] = nullptr;
  }
  j["holders"] = json::array();
  for (const auto& h : holders) {
    j["holders"].push_back(
        {{"rank", h.rank}, {"proc", ProcToJson(h.proc)}, {"socket", h.socket}, {"record_path", h.record_path}});
  }
  j["engines"] = json::array();
  for (const auto& e : engines) {
    j["engines"].push_back({{"slot", e.slot},
                            {"proc", ProcToJson(e.proc)},
                            {"port", e.port},
                            {"role", e.role},
                            {"started_ms", e.started_ms},
                            {"cache_result", e.cache_result}});
  }
  return j.dump(2) + "\n";
}

Result<RuntimeState> RuntimeState::FromJson(const std::string& text, const std::string& path) {
  try {
    json j = json::parse(text);
    if (j.value("version", 0) != kVersion) {
      return Corrupt(path + ": state version " + std::to_string(j.value("version", 0)) + ", expected " +
                     std::to_string(kVersion) +
                     "; it was written by another wsup version: stop the old processes with `wsup stop` "
                     "or remove the file");
    }
    RuntimeState s;
    s.config_path = j.at("config_path").get<std::string>();
    s.node_name = j.at("node_name").get<std::string>();
    s.supervisor = ProcFromJson(j.at("supervisor"));
    s.epoch = j.value("epoch", int64_t{0});
    if (!j.at("front").is_null()) {
      const auto& f = j.at("front");
      s.front = Front{ProcFromJson(f.at("proc")), f.at("control_socket").get<std::string>(),
                      f.at("listen").get<std::string>()};
    }
    for (const auto& h : j.at("holders")) {
      s.holders.push_back(Holder{h.at("rank").get<int>(), ProcFromJson(h.at("proc")),
                                 h.at("socket").get<std::string>(), h.at("record_path").get<std::string>()});
    }
    for (const auto& e : j.at("engines")) {
      s.engines.push_back(Engine{e.at("slot").get<std::string>(), ProcFromJson(e.at("proc")),
                                 e.at("port").get<int>(), e.at("role").get<std::string>(),
                                 e.value("started_ms", int64_t{0}), e.value("cache_result", std::string())});
    }
    return s;
  } catch (const std::exception& ex) {
    return Corrupt(path + ": not a valid wsup runtime state (" + ex.what() +
                   "); if no wsup processes run, remove the file and start again");
  }
}

std::string RuntimeState::PathIn(const std::string& runtime_dir) { return JoinPath(runtime_dir, "state.json"); }

Status RuntimeState::Save(const std::string& path) const { return WriteFileAtomic(path, ToJson(), 0600); }

Result<std::optional<RuntimeState>> RuntimeState::Load(const std::string& path) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0) return std::optional<RuntimeState>();
  WSUP_ASSIGN_OR_RETURN(std::string text, ReadFile(path, 1 << 20));
  WSUP_ASSIGN_OR_RETURN(RuntimeState s, FromJson(text, path));
  return std::optional<RuntimeState>(std::move(s));
}

}  // namespace wsup
