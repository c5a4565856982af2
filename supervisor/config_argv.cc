// The names of the config's enums, the placeholders of engine.command and
// holder.command and the argument lists they make, and the summary that
// `wsup check` prints.
#include <algorithm>
#include <cctype>
#include <map>
#include <sstream>

#include "common/enum_names.h"
#include "supervisor/config.h"

namespace wsup {

const char* CacheModeName(CacheMode m) {
  static constexpr EnumNames<CacheMode::kOff> kNames{"daemon", "client", "off"};
  return kNames(m);
}

const char* CacheBackendName(CacheBackend b) { return b == CacheBackend::kCuda ? "cuda" : "host"; }
const char* CacheLayoutName(CacheLayout l) { return l == CacheLayout::kEngine ? "engine" : "checkpoint"; }
const char* ProbeKindName(ProbeKind k) { return k == ProbeKind::kPort ? "port" : "semantic"; }

const std::vector<std::string>& EnginePlaceholders() {
  static const std::vector<std::string> names = {"port",     "model",  "socket",   "devices",     "mode",
                                                 "backend",  "tp",     "revision", "runtime_dir", "nonce",
                                                 "ready_fd", "layout", "ep",       "kv_pool_mib", "kv_scratch_mib"};
  return names;
}

const std::vector<std::string>& HolderPlaceholders() {
  static const std::vector<std::string> names = {"rank",    "device", "socket",   "model",       "mode",
                                                 "backend", "tp",     "revision", "runtime_dir", "layout",
                                                 "layout_max_bytes", "ep", "kv_pool_mib", "kv_scratch_mib"};
  return names;
}

Result<std::vector<std::string>> ExpandPlaceholders(const std::vector<std::string>& argv,
                                                    const std::map<std::string, std::string>& vars) {
  std::vector<std::string> out;
  out.reserve(argv.size());
  for (const auto& arg : argv) {
    std::string r;
    for (size_t i = 0; i < arg.size(); ++i) {
      if (arg[i] == '{') {
        size_t j = i + 1;
        while (j < arg.size() && (std::islower(static_cast<unsigned char>(arg[j])) || arg[j] == '_')) ++j;
        if (j < arg.size() && arg[j] == '}' && j > i + 1) {
          std::string name = arg.substr(i + 1, j - i - 1);
          auto it = vars.find(name);
          if (it == vars.end()) {
            std::string list;
            for (const auto& [k, v] : vars) list += (list.empty() ? "{" : ", {") + k + "}";
            return InvalidArgument("\"" + arg + "\": unknown placeholder {" + name + "}; known: " + list);
          }
          r += it->second;
          i = j;
          continue;
        }
      }
      r += arg[i];
    }
    out.push_back(std::move(r));
  }
  return out;
}

std::string DevicesArg(const Config& config) {
  if (config.parallel.devices.empty()) return "cpu";
  // Appended piece by piece: GCC 12 at -O3 gives a false -Wrestrict error
  // on `const char* + std::string&&`.
  std::string s = "cuda:";
  for (size_t i = 0; i < config.parallel.devices.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(config.parallel.devices[i]);
  }
  return s;
}

std::string HolderSocket(const Config& config, int rank) {
  if (config.parallel.tp <= 1) return config.weight_cache.socket;
  return config.weight_cache.socket + "." + std::to_string(rank);
}

std::string EngineSocketsArg(const Config& config) {
  std::string s;
  for (int r = 0; r < std::max(1, config.parallel.tp); ++r) {
    if (r) s += ',';
    s += HolderSocket(config, r);
  }
  return s;
}

namespace {
std::map<std::string, std::string> CommonVars(const Config& c) {
  return {{"model", c.model.path},
          {"socket", c.weight_cache.socket},
          {"mode", CacheModeName(c.weight_cache.mode)},
          {"backend", CacheBackendName(c.weight_cache.backend)},
          {"layout", CacheLayoutName(c.weight_cache.layout)},
          {"tp", std::to_string(c.parallel.tp)},
          {"ep", std::to_string(c.parallel.ep())},
          {"revision", c.model.revision},
          {"runtime_dir", c.node.runtime_dir},
          {"kv_pool_mib", std::to_string(c.kv.pool_mib)},
          {"kv_scratch_mib", std::to_string(c.kv.scratch_mib)}};
}

// Only when asked: holders of other versions know no --kv-pool-mib.
void AddKvPoolArgs(const Config& c, std::vector<std::string>* argv) {
  if (c.kv.pool_mib > 0) argv->insert(argv->end(), {"--kv-pool-mib", "{kv_pool_mib}"});
}

// The model's revision, and on cuda the rank's GPU (the host backend has
// none): both holder templates pass them.
void AddRevisionAndDevice(const Config& c, std::vector<std::string>* argv) {
  if (!c.model.revision.empty()) argv->insert(argv->end(), {"--revision", "{revision}"});
  if (!c.parallel.devices.empty()) argv->insert(argv->end(), {"--device", "{device}"});
}
}  // namespace

bool EngineAnnouncesReady(const Config& config) {
  for (const auto& a : config.engine.command) {
    if (a.find("{ready_fd}") != std::string::npos) return true;
  }
  return false;
}

Result<std::vector<std::string>> EngineArgv(const Config& config, int port, const std::string& nonce, int ready_fd) {
  auto vars = CommonVars(config);
  vars["port"] = std::to_string(port);
  vars["nonce"] = nonce;
  vars["ready_fd"] = std::to_string(ready_fd);
  vars["devices"] = DevicesArg(config);
  vars["socket"] = EngineSocketsArg(config);
  auto r = ExpandPlaceholders(config.engine.command, vars);
  if (!r.ok()) return r.error().With("engine.command");
  return r;
}

Result<std::vector<std::string>> HolderArgv(const Config& config, int rank, const std::string& default_binary) {
  if (rank < 0 || rank >= config.parallel.tp)
    return InvalidArgument("holder rank " + std::to_string(rank) + " is outside 0.." +
                           std::to_string(config.parallel.tp - 1) + " (parallel.tp); this is a bug in the caller");
  auto vars = CommonVars(config);
  vars["rank"] = std::to_string(rank);
  vars["socket"] = HolderSocket(config, rank);
  vars["device"] = config.parallel.devices.empty() ? "cpu" : std::to_string(config.parallel.devices[rank]);
  vars["layout_max_bytes"] = std::to_string(config.weight_cache.layout_max_bytes);
  std::vector<std::string> tmpl = config.holder.command;
  if (tmpl.empty() && config.weight_cache.layout == CacheLayout::kEngine) {
    // Loads nothing: the engines publish their layouts into it.
    tmpl = {config.holder.binary.empty() ? default_binary : config.holder.binary,
            "--layout", "engine", "--socket", "{socket}", "--backend", "{backend}", "--deployment", config.node.name};
    // cuda: the rank's GPU is where its grants are made.
    AddRevisionAndDevice(config, &tmpl);
    if (config.weight_cache.layout_max_bytes > 0) {
      tmpl.push_back("--layout-max-bytes");
      tmpl.push_back("{layout_max_bytes}");
    }
    AddKvPoolArgs(config, &tmpl);
  } else if (tmpl.empty()) {
    tmpl = {config.holder.binary.empty() ? default_binary : config.holder.binary,
            "--model", "{model}", "--socket", "{socket}", "--tp-size", "{tp}", "--tp-rank", "{rank}",
            "--backend", "{backend}", "--deployment", config.node.name};
    if (config.parallel.expert_parallel) {
      // Only when asked: holders of other versions know no --ep-size.
      tmpl.insert(tmpl.end(), {"--ep-size", "{ep}", "--ep-rank", "{rank}"});
    }
    AddRevisionAndDevice(config, &tmpl);
    AddKvPoolArgs(config, &tmpl);
  }
  auto r = ExpandPlaceholders(tmpl, vars);
  if (!r.ok()) return r.error().With("holder.command");
  return r;
}

std::string DescribeConfig(const Config& c) {
  std::ostringstream os;
  os << "node " << c.node.name << ": state_dir " << c.node.state_dir << ", runtime_dir " << c.node.runtime_dir << "\n";
  os << "model " << c.model.path << (c.model.revision.empty() ? "" : " (revision " + c.model.revision + ")") << "\n";
  os << "parallel: tp " << c.parallel.tp
     << (c.parallel.expert_parallel ? " (experts: ep " + std::to_string(c.parallel.ep()) + ")" : "")
     << ", devices " << DevicesArg(c) << "\n";
  os << "weight cache: mode " << CacheModeName(c.weight_cache.mode) << ", backend "
     << CacheBackendName(c.weight_cache.backend) << ", layout " << CacheLayoutName(c.weight_cache.layout)
     << ", socket " << c.weight_cache.socket;
  if (c.weight_cache.layout_max_bytes > 0) os << ", layouts at most " << c.weight_cache.layout_max_bytes << " bytes";
  os << "\n";
  if (c.kv.pool_mib > 0) {
    os << "kv: a pool of " << c.kv.pool_mib << " MiB per rank, made by the holders and kept by the supervisor; "
       << "the standby's scratch " << c.kv.scratch_mib << " MiB\n";
  }
  os << "engines: " << c.engine.host << ":" << c.engine.primary_port << " and " << c.engine.host << ":"
     << c.engine.standby_port << ", ready within " << c.engine.ready_timeout_ms << " ms: " << c.engine.command[0]
     << "\n";
  os << "probe: " << ProbeKindName(c.probe.kind) << " every " << c.probe.interval_ms << " ms (+0.."
     << c.probe.jitter_ms << " jitter), timeout " << c.probe.timeout_ms << " ms, trip after " << c.probe.failures
     << ", recover after " << c.probe.successes << (c.probe.comm ? ", comm check on" : "") << "\n";
  os << "front " << c.front.listen.ToString() << ", admin " << c.admin.listen.ToString() << "\n";
  if (c.group.enabled()) {
    os << "group " << c.group.name << ": member " << c.group.index << " of " << c.group.size << " (head "
       << c.group.head << "), tp " << static_cast<int64_t>(c.parallel.tp) * c.group.size << " in all, etcd";
    for (const auto& e : c.group.etcd) os << " " << e;
    os << ", lease " << c.group.lease_ttl_ms << " ms\n";
  }
  return os.str();
}

namespace {

std::string At(const Config& c, const std::string& key) {
  auto it = c.where.find(key);
  return it != c.where.end() ? it->second : c.path + ":1:1";
}

std::string Etcd(const Config& c) {
  std::vector<std::string> e = c.group.etcd;
  std::sort(e.begin(), e.end());
  std::string s;
  for (const auto& x : e) s += (s.empty() ? "" : ", ") + x;
  return s;
}

}  // namespace

std::vector<Error> CheckGroupConfigs(const std::vector<Config>& members) {
  std::vector<Error> errors;
  if (members.empty()) return errors;
  auto fail = [&](const Config& c, const std::string& key, const std::string& what) {
    errors.push_back(InvalidArgument(At(c, key) + ": " + key + ": " + what));
  };
  const Config* first = nullptr;
  for (const Config& c : members) {
    if (c.group.enabled()) {
      first = &c;
      break;
    }
  }
  if (!first) return errors;  // nodes on their own: nothing ties them together
  const Config& f = *first;
  std::map<int, const Config*> by_index;
  for (const Config& c : members) {
    if (!c.group.enabled()) {
      fail(c, "group", "has no [group] while " + f.path + " is member " + std::to_string(f.group.index) +
                           " of group " + f.group.name + "; add the member's [group], or check it on its own");
      continue;
    }
    if (&c != &f) {
      // The same group, as every member must name it.
      if (c.group.name != f.group.name)
        fail(c, "group.name", "\"" + c.group.name + "\" differs from " + f.path + "'s \"" + f.group.name +
                                  "\"; members of one group name it alike");
      if (c.group.size != f.group.size)
        fail(c, "group.size", std::to_string(c.group.size) + " differs from " + f.path + "'s " +
                                  std::to_string(f.group.size) + "; every member gives the same size");
      if (c.group.head != f.group.head)
        fail(c, "group.head", std::to_string(c.group.head) + " differs from " + f.path + "'s " +
                                  std::to_string(f.group.head) + "; every member names the same head");
      if (Etcd(c) != Etcd(f))
        fail(c, "group.etcd", "[" + Etcd(c) + "] differs from " + f.path + "'s [" + Etcd(f) +
                                  "]; every member talks to the same etcd cluster");
      if (c.group.lease_ttl_ms != f.group.lease_ttl_ms)
        fail(c, "group.lease_ttl_ms", std::to_string(c.group.lease_ttl_ms) + " differs from " + f.path + "'s " +
                                          std::to_string(f.group.lease_ttl_ms) +
                                          "; members lapse alike, or a partition is seen at different times");
      // Sizes that add up: every member runs the same share of each side.
      if (c.parallel.tp != f.parallel.tp)
        fail(c, "parallel.tp", std::to_string(c.parallel.tp) + " ranks here, " + std::to_string(f.parallel.tp) +
                                   " in " + f.path + "; every member runs the same number of ranks of each side (the "
                                   "group's tp is tp x size)");
      if (c.parallel.expert_parallel != f.parallel.expert_parallel)
        fail(c, "parallel.expert_parallel", std::string(c.parallel.expert_parallel ? "true" : "false") +
                                                " differs from " + f.path +
                                                "'s; the experts are split one way across the whole group");
      if (c.model.revision != f.model.revision)
        fail(c, "model.revision", "\"" + c.model.revision + "\" differs from " + f.path + "'s \"" +
                                      f.model.revision + "\"; the members' ranks must load the same weights");
    }
    auto [it, fresh] = by_index.emplace(c.group.index, &c);
    if (!fresh)
      fail(c, "group.index", std::to_string(c.group.index) + " is also " + it->second->path +
                                 "'s; give each member its own index from 0 to " + std::to_string(f.group.size - 1));
  }
  std::string missing;
  for (int i = 0; i < f.group.size; ++i) {
    if (!by_index.count(i)) missing += (missing.empty() ? "" : ", ") + std::to_string(i);
  }
  if (!missing.empty())
    fail(f, "group.size", std::to_string(f.group.size) + " members, but no config given is member " + missing +
                              "; give every member's config (wsup check A.toml B.toml ...)");
  return errors;
}

namespace {

// One loaded config's checks and summary (CheckConfig, without the read).
CheckOutcome CheckLoaded(const Result<Config>& config, const std::string& path, bool check_paths,
                         const std::string& default_holder) {
  if (!config.ok()) return {1, config.error().message() + "\n"};
  if (check_paths) {
    auto errors = CheckConfigPaths(*config, default_holder);
    if (!errors.empty()) {
      std::string out;
      for (const auto& e : errors) out += e.message() + "\n";
      return {1, out};
    }
  }
  return {0, path + ": ok" + (check_paths ? std::string() : std::string(" (paths not checked: --no-paths)")) + "\n" +
                 DescribeConfig(*config)};
}

}  // namespace

CheckOutcome CheckConfigs(const std::vector<std::string>& paths, const std::vector<std::string>& overrides,
                          bool check_paths, const std::string& default_holder) {
  CheckOutcome all;
  std::vector<Config> loaded;
  for (const auto& p : paths) {
    auto c = LoadConfig(p, overrides);  // each file read once
    CheckOutcome one = CheckLoaded(c, p, check_paths, default_holder);
    if (one.exit_code != 0) all.exit_code = 1;
    if (one.exit_code != 0 || all.exit_code == 0) all.output += one.output;
    if (one.exit_code == 0) loaded.push_back(std::move(*c));
  }
  if (all.exit_code != 0 || loaded.empty() || !loaded[0].group.enabled()) return all;
  if (loaded.size() == 1) {
    all.output += "group " + loaded[0].group.name + ": one member's config given; give every member's (wsup check " +
                  "A.toml B.toml ...) to check the group whole\n";
    return all;
  }
  auto errors = CheckGroupConfigs(loaded);
  if (!errors.empty()) {
    all = {1, ""};
    for (const auto& e : errors) all.output += e.message() + "\n";
    return all;
  }
  all.output += "group " + loaded[0].group.name + ": " + std::to_string(loaded.size()) + " members, whole\n";
  return all;
}

CheckOutcome CheckConfig(const std::string& path, const std::vector<std::string>& overrides, bool check_paths,
                         const std::string& default_holder) {
  return CheckLoaded(LoadConfig(path, overrides), path, check_paths, default_holder);
}

}  // namespace wsup
