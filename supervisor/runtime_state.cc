#include "supervisor/runtime_state.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <signal.h>

#include <cerrno>
#include <string_view>
#include <utility>

#include <nlohmann/json.hpp>

#include "common/fs.h"
#include "common/json_fields.h"
#include "common/json_limits.h"
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

Result<ProcessRef> ProcFromJson(const json& j, std::string_view key) {
  WSUP_ASSIGN_OR_RETURN(const json* o, ObjectFieldOr(j, key));
  if (!o) return Corrupt("field '" + std::string(key) + "' is missing");
  ProcessRef p;
  auto pid = Field<int>(*o, "pid");
  if (!pid.ok()) return pid.error().With(key);
  auto start = Field<uint64_t>(*o, "start_time");
  if (!start.ok()) return start.error().With(key);
  p.pid = *pid;
  p.start_time = *start;
  return p;
}

json VersionToJson(const EngineVersion& v) {
  json env = json::object();
  for (const auto& [k, val] : v.env) env[k] = val;
  return json{{"command", v.command}, {"env", env}};
}

Result<EngineVersion> VersionFromJson(const json& j) {
  EngineVersion v;
  WSUP_ASSIGN_OR_RETURN(const json* command, ArrayFieldOr(j, "command"));
  if (!command) return Corrupt("field 'command' is missing");
  for (size_t i = 0; i < command->size(); ++i) {
    const json& arg = (*command)[i];
    if (!arg.is_string()) {
      return Corrupt("command[" + std::to_string(i) + "] is " + JsonTypeName(arg) + ", not a string");
    }
    v.command.push_back(arg.get<std::string>());
  }
  WSUP_ASSIGN_OR_RETURN(const json* env, ObjectFieldOr(j, "env"));
  if (!env) return Corrupt("field 'env' is missing");
  for (const auto& [name, value] : env->items()) {
    if (!value.is_string()) return Corrupt("env '" + name + "' is " + JsonTypeName(value) + ", not a string");
    v.env.emplace_back(name, value.get<std::string>());
  }
  return v;
}

Result<RuntimeState::Front> FrontFromJson(const json& f) {
  RuntimeState::Front front;
  WSUP_ASSIGN_OR_RETURN(front.proc, ProcFromJson(f, "proc"));
  WSUP_ASSIGN_OR_RETURN(front.control_socket, Field<std::string>(f, "control_socket"));
  WSUP_ASSIGN_OR_RETURN(front.listen, Field<std::string>(f, "listen"));
  return front;
}

Result<RuntimeState::Holder> HolderFromJson(const json& h) {
  RuntimeState::Holder holder;
  WSUP_ASSIGN_OR_RETURN(holder.rank, Field<int>(h, "rank"));
  WSUP_ASSIGN_OR_RETURN(holder.proc, ProcFromJson(h, "proc"));
  WSUP_ASSIGN_OR_RETURN(holder.socket, Field<std::string>(h, "socket"));
  WSUP_ASSIGN_OR_RETURN(holder.record_path, Field<std::string>(h, "record_path"));
  return holder;
}

// The engine without its version (read on its own: a malformed one is dropped).
Result<RuntimeState::Engine> EngineFromJson(const json& e) {
  RuntimeState::Engine engine;
  WSUP_ASSIGN_OR_RETURN(engine.slot, Field<std::string>(e, "slot"));
  WSUP_ASSIGN_OR_RETURN(engine.proc, ProcFromJson(e, "proc"));
  WSUP_ASSIGN_OR_RETURN(engine.port, Field<int>(e, "port"));
  WSUP_ASSIGN_OR_RETURN(engine.role, Field<std::string>(e, "role"));
  WSUP_ASSIGN_OR_RETURN(engine.started_ms, FieldOr<int64_t>(e, "started_ms", 0));
  WSUP_ASSIGN_OR_RETURN(engine.cache_result, FieldOr<std::string>(e, "cache_result", ""));
  WSUP_ASSIGN_OR_RETURN(engine.nonce, FieldOr<std::string>(e, "nonce", ""));
  WSUP_ASSIGN_OR_RETURN(engine.control_token, FieldOr<std::string>(e, "control_token", ""));
  return engine;
}

Result<RuntimeState::Rollout> RolloutFromJson(const json& r) {
  RuntimeState::Rollout ro;
  WSUP_ASSIGN_OR_RETURN(ro.id, Field<int64_t>(r, "id"));
  WSUP_ASSIGN_OR_RETURN(ro.step, Field<std::string>(r, "step"));
  WSUP_ASSIGN_OR_RETURN(ro.new_slot, Field<std::string>(r, "new_slot"));
  WSUP_ASSIGN_OR_RETURN(ro.old_slot, Field<std::string>(r, "old_slot"));
  WSUP_ASSIGN_OR_RETURN(ro.started_ms, Field<int64_t>(r, "started_ms"));
  for (auto [key, out] : {std::pair<const char*, EngineVersion*>{"from", &ro.from}, {"to", &ro.to}}) {
    WSUP_ASSIGN_OR_RETURN(const json* v, ObjectFieldOr(r, key));
    if (!v) return Corrupt(std::string("field '") + key + "' is missing");
    auto version = VersionFromJson(*v);
    if (!version.ok()) return version.error().With(key);
    *out = std::move(*version);
  }
  WSUP_ASSIGN_OR_RETURN(ro.new_proven, FieldOr<bool>(r, "new_proven", false));
  WSUP_ASSIGN_OR_RETURN(ro.rolling_back, FieldOr<bool>(r, "rolling_back", false));
  WSUP_ASSIGN_OR_RETURN(ro.cause, FieldOr<std::string>(r, "cause", ""));
  WSUP_ASSIGN_OR_RETURN(ro.command_before, FieldOr<std::string>(r, "command_before", ""));
  WSUP_ASSIGN_OR_RETURN(ro.command_after, FieldOr<std::string>(r, "command_after", ""));
  WSUP_ASSIGN_OR_RETURN(ro.steps_json, FieldOr<std::string>(r, "steps_json", "[]"));
  return ro;
}

// Every field read checked: the file is another process's (an older wsup's,
// or damaged), and this runs on the loop.
Result<RuntimeState> StateFromJson(const json& j) {
  RuntimeState s;
  WSUP_ASSIGN_OR_RETURN(s.config_path, Field<std::string>(j, "config_path"));
  WSUP_ASSIGN_OR_RETURN(s.node_name, Field<std::string>(j, "node_name"));
  WSUP_ASSIGN_OR_RETURN(s.supervisor, ProcFromJson(j, "supervisor"));
  WSUP_ASSIGN_OR_RETURN(s.epoch, FieldOr<int64_t>(j, "epoch", 0));
  WSUP_ASSIGN_OR_RETURN(s.saved_ms, FieldOr<int64_t>(j, "saved_ms", 0));
  WSUP_ASSIGN_OR_RETURN(s.kv_pool_owner, FieldOr<std::string>(j, "kv_pool_owner", ""));
  if (!j.contains("front")) return Corrupt("field 'front' is missing");
  WSUP_ASSIGN_OR_RETURN(const json* front, ObjectFieldOr(j, "front"));
  if (front) {
    auto f = FrontFromJson(*front);
    if (!f.ok()) return f.error().With("front");
    s.front = std::move(*f);
  }
  WSUP_ASSIGN_OR_RETURN(const json* holders, ArrayFieldOr(j, "holders"));
  if (!holders) return Corrupt("field 'holders' is missing");
  for (size_t i = 0; i < holders->size(); ++i) {
    auto h = HolderFromJson((*holders)[i]);
    if (!h.ok()) return h.error().With("holders[" + std::to_string(i) + "]");
    s.holders.push_back(std::move(*h));
  }
  // The versions and the rollout came later: a file without them is read
  // as before, and a malformed one is dropped (and said), never the
  // processes the file names.
  auto note = [&s](const std::string& what, const Error& e) {
    s.dropped += (s.dropped.empty() ? "" : "; ") + what + " (" + e.message() + ")";
  };
  WSUP_ASSIGN_OR_RETURN(const json* engines, ArrayFieldOr(j, "engines"));
  if (!engines) return Corrupt("field 'engines' is missing");
  for (size_t i = 0; i < engines->size(); ++i) {
    const json& e = (*engines)[i];
    auto engine = EngineFromJson(e);
    if (!engine.ok()) return engine.error().With("engines[" + std::to_string(i) + "]");
    s.engines.push_back(std::move(*engine));
    if (e.contains("version")) {
      auto v = ObjectFieldOr(e, "version");
      auto version = v.ok() && *v ? VersionFromJson(**v) : Result<EngineVersion>(Corrupt("it is not an object"));
      if (version.ok()) {
        s.engines.back().version = std::move(*version);
      } else {
        note("engine " + s.engines.back().slot + "'s version", version.error());
      }
    }
  }
  if (j.contains("engine_version")) {
    auto v = ObjectFieldOr(j, "engine_version");
    auto version = v.ok() && *v ? VersionFromJson(**v) : Result<EngineVersion>(Corrupt("it is not an object"));
    if (version.ok()) {
      s.engine_version = std::move(*version);
    } else {
      note("the node's engine version", version.error());
    }
  }
  if (j.contains("rollout") && !j["rollout"].is_null()) {
    auto r = j["rollout"].is_object() ? RolloutFromJson(j["rollout"])
                                      : Result<RuntimeState::Rollout>(Corrupt("it is not an object"));
    if (r.ok()) {
      s.rollout = std::move(*r);
    } else {
      note("the rollout in progress", r.error());
    }
  }
  return s;
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
  // Replaced, not thrown: a rollout's cause may quote an engine's words cut short.
  return j.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
}

Result<RuntimeState> RuntimeState::FromJson(const std::string& text, const std::string& path) {
  auto bad = [&path](const std::string& why) {
    return Corrupt(path + ": not a valid wsup runtime state (" + why +
                   "); if no wsup processes run, remove the file and start again");
  };
  auto j = ParseJsonChecked(text, "the file", "it was damaged");
  if (!j.ok()) return bad(j.error().message());
  if (!j->is_object()) return bad(std::string("it is ") + JsonTypeName(*j) + ", not an object");
  auto version = FieldOr<int64_t>(*j, "version", 0);
  if (!version.ok()) return bad(version.error().message());
  if (*version != kVersion) {
    return Corrupt(path + ": state version " + std::to_string(*version) + ", expected " + std::to_string(kVersion) +
                   "; it was written by another wsup version: stop the old processes with `wsup stop` "
                   "or remove the file");
  }
  auto s = StateFromJson(*j);
  if (!s.ok()) return bad(s.error().message());
  return s;
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
