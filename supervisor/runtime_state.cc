#include "supervisor/runtime_state.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <signal.h>

#include <cerrno>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "common/fs.h"
#include "common/unique_fd.h"
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

json VersionToJson(const EngineVersion& v) {
  json env = json::object();
  for (const auto& [k, val] : v.env) env[k] = val;
  return json{{"command", v.command}, {"env", env}};
}

// Throws (nlohmann) on a malformed version; the callers catch.
EngineVersion VersionFromJson(const json& j) {
  EngineVersion v;
  v.command = j.at("command").get<std::vector<std::string>>();
  const json& env = j.at("env");
  if (!env.is_object()) throw std::runtime_error("env is not an object");
  for (auto it = env.begin(); it != env.end(); ++it) v.env.emplace_back(it.key(), it.value().get<std::string>());
  return v;
}

}  // namespace

std::string RuntimeState::ToJson() const {
  json j;
  j["version"] = kVersion;
  j["config_path"] = config_path;
  j["node_name"] = node_name;
  j["supervisor"] = ProcToJson(supervisor);
  j["epoch"] = epoch;
  j["saved_ms"] = saved_ms;
  if (!kv_pool_owner.empty()) j["kv_pool_owner"] = kv_pool_owner;
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
                            {"cache_result", e.cache_result},
                            {"nonce", e.nonce},
                            {"control_token", e.control_token}});
    if (e.version) j["engines"].back()["version"] = VersionToJson(*e.version);
  }
  if (engine_version) j["engine_version"] = VersionToJson(*engine_version);
  if (rollout) {
    const Rollout& r = *rollout;
    j["rollout"] = {{"id", r.id},
                    {"step", r.step},
                    {"new_slot", r.new_slot},
                    {"old_slot", r.old_slot},
                    {"started_ms", r.started_ms},
                    {"from", VersionToJson(r.from)},
                    {"to", VersionToJson(r.to)},
                    {"new_proven", r.new_proven},
                    {"rolling_back", r.rolling_back},
                    {"cause", r.cause},
                    {"command_before", r.command_before},
                    {"command_after", r.command_after},
                    {"steps_json", r.steps_json}};
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
    s.saved_ms = j.value("saved_ms", int64_t{0});
    s.kv_pool_owner = j.value("kv_pool_owner", std::string());
    if (!j.at("front").is_null()) {
      const auto& f = j.at("front");
      s.front = Front{ProcFromJson(f.at("proc")), f.at("control_socket").get<std::string>(),
                      f.at("listen").get<std::string>()};
    }
    for (const auto& h : j.at("holders")) {
      s.holders.push_back(Holder{h.at("rank").get<int>(), ProcFromJson(h.at("proc")),
                                 h.at("socket").get<std::string>(), h.at("record_path").get<std::string>()});
    }
    // The versions and the rollout came later: a file without them is read
    // as before, and a malformed one is dropped (and said), never the
    // processes the file names.
    auto note = [&s](const std::string& what, const std::exception& ex) {
      s.dropped += (s.dropped.empty() ? "" : "; ") + what + " (" + ex.what() + ")";
    };
    for (const auto& e : j.at("engines")) {
      s.engines.push_back(Engine{e.at("slot").get<std::string>(), ProcFromJson(e.at("proc")),
                                 e.at("port").get<int>(), e.at("role").get<std::string>(),
                                 e.value("started_ms", int64_t{0}), e.value("cache_result", std::string()),
                                 e.value("nonce", std::string()), std::nullopt,
                                 e.value("control_token", std::string())});
      if (e.contains("version")) {
        try {
          s.engines.back().version = VersionFromJson(e.at("version"));
        } catch (const std::exception& ex) {
          note("engine " + s.engines.back().slot + "'s version", ex);
        }
      }
    }
    if (j.contains("engine_version")) {
      try {
        s.engine_version = VersionFromJson(j.at("engine_version"));
      } catch (const std::exception& ex) {
        note("the node's engine version", ex);
      }
    }
    if (j.contains("rollout") && !j.at("rollout").is_null()) {
      try {
        const json& r = j.at("rollout");
        Rollout ro;
        ro.id = r.at("id").get<int64_t>();
        ro.step = r.at("step").get<std::string>();
        ro.new_slot = r.at("new_slot").get<std::string>();
        ro.old_slot = r.at("old_slot").get<std::string>();
        ro.started_ms = r.at("started_ms").get<int64_t>();
        ro.from = VersionFromJson(r.at("from"));
        ro.to = VersionFromJson(r.at("to"));
        ro.new_proven = r.value("new_proven", false);
        ro.rolling_back = r.value("rolling_back", false);
        ro.cause = r.value("cause", std::string());
        ro.command_before = r.value("command_before", std::string());
        ro.command_after = r.value("command_after", std::string());
        ro.steps_json = r.value("steps_json", std::string("[]"));
        s.rollout = std::move(ro);
      } catch (const std::exception& ex) {
        note("the rollout in progress", ex);
      }
    }
    return s;
  } catch (const std::exception& ex) {
    return Corrupt(path + ": not a valid wsup runtime state (" + ex.what() +
                   "); if no wsup processes run, remove the file and start again");
  }
}

std::string RuntimeState::PathIn(const std::string& runtime_dir) { return JoinPath(runtime_dir, "state.json"); }

Status RuntimeState::Save(const std::string& path) const {
  // No fsync (see the header): the file must survive the supervisor, not the machine.
  std::string tmp = path + ".tmp";
  UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
  if (!fd.valid()) return ErrnoError(tmp + ": cannot write the runtime state (is node.runtime_dir writable?)", errno);
  // 0600 even over a leftover temporary file made looser: the engines'
  // versions hold engine.env's values, which may be secrets.
  if (::fchmod(fd.get(), 0600) != 0) {
    int e = errno;
    ::unlink(tmp.c_str());
    return ErrnoError(tmp + ": cannot make the runtime state private (chmod 0600)", e);
  }
  std::string text = ToJson();
  size_t off = 0;
  while (off < text.size()) {
    ssize_t n = ::write(fd.get(), text.data() + off, text.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      int e = errno;
      ::unlink(tmp.c_str());
      return ErrnoError(tmp + ": writing the runtime state", e);
    }
    off += static_cast<size_t>(n);
  }
  fd.Reset();
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int e = errno;
    ::unlink(tmp.c_str());
    return ErrnoError("renaming " + tmp + " to " + path, e);
  }
  return Status::Ok();
}

Result<std::optional<RuntimeState>> RuntimeState::Load(const std::string& path) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0) return std::optional<RuntimeState>();
  WSUP_ASSIGN_OR_RETURN(std::string text, ReadFile(path, 1 << 20));
  WSUP_ASSIGN_OR_RETURN(RuntimeState s, FromJson(text, path));
  return std::optional<RuntimeState>(std::move(s));
}

Result<std::vector<std::string>> StopLeftovers(const std::string& runtime_dir, int64_t timeout_ms) {
  std::string path = RuntimeState::PathIn(runtime_dir);
  WSUP_ASSIGN_OR_RETURN(std::optional<RuntimeState> st, RuntimeState::Load(path));
  std::vector<std::string> stopped;
  if (!st) return stopped;
  if (st->supervisor.pid != ::getpid() && st->supervisor.StillRunning()) {
    return Refused("the supervisor of node '" + st->node_name + "' (pid " + std::to_string(st->supervisor.pid) +
                   ") is running but does not answer on its control socket; it may be hung: kill it (kill " +
                   std::to_string(st->supervisor.pid) + ") and run `wsup stop` again to stop what it left");
  }
  std::vector<std::pair<ProcessRef, std::string>> procs;
  // Engines first, the front next, holders last: the order of a clean stop.
  for (const auto& e : st->engines) procs.push_back({e.proc, "engine " + e.slot});
  if (st->front) procs.push_back({st->front->proc, "front"});
  for (const auto& h : st->holders) procs.push_back({h.proc, "holder rank " + std::to_string(h.rank)});
  std::vector<std::pair<ProcessRef, std::string>> live;
  for (const auto& [p, what] : procs) {
    if (!p.StillRunning()) continue;
    Status sig = SignalGroup(p.pid, SIGTERM);
    if (!sig.ok()) return sig.error().With("stopping " + what + " (pid " + std::to_string(p.pid) + ")");
    live.push_back({p, what});
  }
  int64_t waited = 0;
  const int64_t step = 10;
  auto any_alive = [&] {
    for (const auto& [p, what] : live) {
      if (p.StillRunning()) return true;
    }
    return false;
  };
  while (any_alive() && waited < timeout_ms) {
    ::usleep(static_cast<useconds_t>(step * 1000));
    waited += step;
  }
  for (const auto& [p, what] : live) {
    bool killed = false;
    if (p.StillRunning()) {
      Status sig = SignalGroup(p.pid, SIGKILL);
      if (!sig.ok()) return sig.error().With("killing " + what + " (pid " + std::to_string(p.pid) + ")");
      killed = true;
    }
    stopped.push_back(what + " pid " + std::to_string(p.pid) + (killed ? " (killed after " +
                      std::to_string(timeout_ms) + " ms)" : ""));
  }
  // SIGKILLed processes are gone once the kernel has torn them down; wait
  // for that (bounded) before the file that names them is removed.
  for (int i = 0; i < 500 && any_alive(); ++i) ::usleep(10'000);
  if (any_alive()) {
    return Timeout("some processes of node '" + st->node_name + "' survived SIGKILL (in uninterruptible I/O?); " +
                   path + " is kept so that `wsup stop` can be run again");
  }
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) return ErrnoError("removing " + path, errno);
  return stopped;
}

}  // namespace wsup
