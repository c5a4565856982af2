// Loader::Read and Loader::CheckRules: every key of the file into a Config,
// then the rules that tie keys together (config_loader.h).
#include "supervisor/config_loader.h"

#include "group/etcd.h"

namespace wsup::config_detail {

Status Loader::Read(const toml::table& root, Config* c) {
  for (const auto& s : Schema()) {
    if (!s.required || root.get(s.name)) continue;
    return ErrAt({file_, 1, 1}, std::string(s.name),
                 "missing required section [" + std::string(s.name) + "]; add it, e.g. " + std::string(s.example));
  }

  // [node]
  const toml::table* node = Section(root, "node");
  WSUP_RETURN_IF_ERROR(Str(node, "node", "name", &c->node.name, true, "name = \"node1\""));
  WSUP_RETURN_IF_ERROR(Str(node, "node", "state_dir", &c->node.state_dir, true, "state_dir = \"/var/lib/wsup\""));
  WSUP_RETURN_IF_ERROR(Str(node, "node", "runtime_dir", &c->node.runtime_dir, true, "runtime_dir = \"/run/wsup\""));
  WSUP_RETURN_IF_ERROR(PlainName("node.name", c->node.name, "it is used in file names and metrics labels"));
  c->node.state_dir = ResolvePath(dir_, c->node.state_dir);
  c->node.runtime_dir = ResolvePath(dir_, c->node.runtime_dir);

  // [model]
  const toml::table* model = Section(root, "model");
  WSUP_RETURN_IF_ERROR(Str(model, "model", "path", &c->model.path, true, "path = \"/models/my-model\""));
  WSUP_RETURN_IF_ERROR(Str(model, "model", "revision", &c->model.revision, false));
  c->model.path = ResolvePath(dir_, c->model.path);

  // [parallel]
  const toml::table* par = Section(root, "parallel");
  WSUP_RETURN_IF_ERROR(Int(par, "parallel", "tp", &c->parallel.tp, 1, 1024));
  {
    std::vector<int64_t> devs;
    bool present = false;
    WSUP_RETURN_IF_ERROR(IntArray(par, "parallel", "devices", &devs, 0, 1023, &present));
    c->parallel.devices.assign(devs.begin(), devs.end());
  }
  WSUP_RETURN_IF_ERROR(Bool(par, "parallel", "expert_parallel", &c->parallel.expert_parallel));

  // [weight_cache]
  const toml::table* wc = Section(root, "weight_cache");
  {
    std::string mode = "daemon", backend = "host", layout = "checkpoint";
    WSUP_RETURN_IF_ERROR(Choice(wc, "weight_cache", "mode", {"daemon", "client", "off"}, &mode));
    WSUP_RETURN_IF_ERROR(Choice(wc, "weight_cache", "backend", {"host", "cuda"}, &backend));
    WSUP_RETURN_IF_ERROR(Choice(wc, "weight_cache", "layout", {"checkpoint", "engine"}, &layout));
    c->weight_cache.layout = layout == "engine" ? CacheLayout::kEngine : CacheLayout::kCheckpoint;
    c->weight_cache.mode = mode == "daemon" ? CacheMode::kDaemon : mode == "client" ? CacheMode::kClient : CacheMode::kOff;
    c->weight_cache.backend = backend == "cuda" ? CacheBackend::kCuda : CacheBackend::kHost;
    std::string socket;
    WSUP_RETURN_IF_ERROR(Str(wc, "weight_cache", "socket", &socket, false));
    if (socket.empty() && value_src_.count("weight_cache.socket"))
      return Err("weight_cache.socket", "is empty; give a socket path or leave the key out for <runtime_dir>/holder.sock");
    c->weight_cache.socket = socket.empty() ? c->node.runtime_dir + "/holder.sock" : ResolvePath(dir_, socket);
    WSUP_RETURN_IF_ERROR(Int(wc, "weight_cache", "layout_max_bytes", &c->weight_cache.layout_max_bytes, 0,
                             kMaxLayoutBytes));
  }

  // [engine]
  const toml::table* eng = Section(root, "engine");
  WSUP_RETURN_IF_ERROR(StrArray(eng, "engine", "command", &c->engine.command, true,
                                "command = [\"wsup-engine\", \"--port\", \"{port}\"]"));
  WSUP_RETURN_IF_ERROR(Command("engine.command", c->engine.command, EnginePlaceholders(), true));
  if (c->engine.command[0].find('/') != std::string::npos)
    c->engine.command[0] = ResolvePath(dir_, c->engine.command[0]);
  WSUP_RETURN_IF_ERROR(Str(eng, "engine", "host", &c->engine.host, false));
  {
    auto addr = ParseListenAddress(c->engine.host + ":1");
    if (c->engine.host.empty() || c->engine.host.front() == '[' || !addr.ok())
      return Err("engine.host", "\"" + Printable(c->engine.host) +
                                    "\" is not an IP address or host name; write e.g. \"127.0.0.1\" or \"::1\" "
                                    "(no brackets, no port)");
  }
  WSUP_RETURN_IF_ERROR(Int(eng, "engine", "primary_port", &c->engine.primary_port, 0, 65535, true, "primary_port = 8001"));
  WSUP_RETURN_IF_ERROR(Int(eng, "engine", "standby_port", &c->engine.standby_port, 0, 65535, true, "standby_port = 8002"));
  WSUP_RETURN_IF_ERROR(Int(eng, "engine", "ready_timeout_ms", &c->engine.ready_timeout_ms, 1, kMaxMs));
  WSUP_RETURN_IF_ERROR(Int(eng, "engine", "stop_timeout_ms", &c->engine.stop_timeout_ms, 0, kMaxMs));
  if (const toml::node* env = Get(eng, "engine", "env")) {
    const toml::table* t = env->as_table();
    // Never the value in an error: engine.env holds secrets (tokens).
    if (!t)
      return Err("engine.env", "expected a table of NAME = \"value\" (e.g. env = { NCCL_DEBUG = \"WARN\" }), got " +
                                   TypeName(*env));
    for (auto&& [k, v] : *t) {
      std::string name(k.str());
      std::string full = "engine.env." + name;
      Location loc = set_.count(full) ? Where(full) : FileLoc(k.source());
      bool ok_name = !name.empty() && !std::isdigit(static_cast<unsigned char>(name[0])) &&
                     std::all_of(name.begin(), name.end(), [](char ch) {
                       return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_';
                     });
      if (!ok_name)
        return ErrAt(loc, full, "is not an environment variable name; use letters, digits and '_', not starting with a digit");
      if (!v.is_string())
        return ErrAt(set_.count(full) ? loc : FileLoc(v.source()), full,
                     "expected a string, got " + TypeName(v) + "; environment values are strings: quote it");
      c->engine.env.emplace_back(name, v.as_string()->get());
    }
    std::sort(c->engine.env.begin(), c->engine.env.end());
  }

  // [probe]
  const toml::table* probe = Section(root, "probe");
  {
    std::string kind = "semantic";
    WSUP_RETURN_IF_ERROR(Choice(probe, "probe", "kind", {"semantic", "port"}, &kind));
    c->probe.kind = kind == "port" ? ProbeKind::kPort : ProbeKind::kSemantic;
  }
  WSUP_RETURN_IF_ERROR(Str(probe, "probe", "prompt", &c->probe.prompt, false));
  if (Get(probe, "probe", "expect")) {
    std::string expect;
    WSUP_RETURN_IF_ERROR(Str(probe, "probe", "expect", &expect, false));
    c->probe.expect = expect;
  }
  {
    std::vector<int64_t> ids;
    bool present = false;
    WSUP_RETURN_IF_ERROR(IntArray(probe, "probe", "expect_token_ids", &ids, 0, INT32_MAX, &present));
    if (present) c->probe.expect_token_ids = ids;
  }
  WSUP_RETURN_IF_ERROR(Int(probe, "probe", "max_tokens", &c->probe.max_tokens, 1, 4096));
  WSUP_RETURN_IF_ERROR(Int(probe, "probe", "interval_ms", &c->probe.interval_ms, 1, kMaxMs));
  WSUP_RETURN_IF_ERROR(Int(probe, "probe", "timeout_ms", &c->probe.timeout_ms, 1, kMaxMs));
  WSUP_RETURN_IF_ERROR(Int(probe, "probe", "failures", &c->probe.failures, 1, 1000));
  WSUP_RETURN_IF_ERROR(Int(probe, "probe", "successes", &c->probe.successes, 1, 1000));
  WSUP_RETURN_IF_ERROR(Int(probe, "probe", "jitter_ms", &c->probe.jitter_ms, 0, kMaxMs));
  WSUP_RETURN_IF_ERROR(Bool(probe, "probe", "comm", &c->probe.comm));
  WSUP_RETURN_IF_ERROR(Int(probe, "probe", "comm_max_age_ms", &c->probe.comm_max_age_ms, 1, kMaxMs));

  // [front], [admin]
  const toml::table* front = Section(root, "front");
  WSUP_RETURN_IF_ERROR(Listen(front, "front", &c->front.listen, "127.0.0.1:8000"));
  WSUP_RETURN_IF_ERROR(Int(front, "front", "queue_timeout_ms", &c->front.queue_timeout_ms, 0, kMaxMs));
  WSUP_RETURN_IF_ERROR(Int(front, "front", "max_queued", &c->front.max_queued, 0, 1'000'000));
  WSUP_RETURN_IF_ERROR(Int(front, "front", "hedge_after_ms", &c->front.hedge_after_ms, 0, 3'600'000));
  WSUP_RETURN_IF_ERROR(Int(front, "front", "hedge_percent", &c->front.hedge_percent, 0, 100));
  if (c->front.hedge_percent > kMaxHedgePercent) {
    // Hedges are work for the standby, which serves them from its small
    // scratch: past one in two, an active that is slow but healthy has
    // every request sent twice, and the standby's probes starve behind them
    // until it is killed.
    return Err("front.hedge_percent", std::to_string(c->front.hedge_percent) +
                                          " would hedge more than one request in two: a slow but healthy active then "
                                          "doubles the node's work and starves the standby's probes until it is "
                                          "killed; give at most " + std::to_string(kMaxHedgePercent) +
                                          " (10 by default)");
  }
  WSUP_RETURN_IF_ERROR(Int(front, "front", "hedge_burst", &c->front.hedge_burst, 1, 1'000'000));
  WSUP_RETURN_IF_ERROR(Int(front, "front", "loops", &c->front.loops, 0, 64));
  const toml::table* admin = Section(root, "admin");
  WSUP_RETURN_IF_ERROR(Listen(admin, "admin", &c->admin.listen, "127.0.0.1:9090"));

  // [supervisor]
  const toml::table* sup = Section(root, "supervisor");
  WSUP_RETURN_IF_ERROR(Int(sup, "supervisor", "restart_backoff_ms", &c->supervisor.restart_backoff_ms, 0, kMaxMs));
  WSUP_RETURN_IF_ERROR(
      Int(sup, "supervisor", "restart_backoff_max_ms", &c->supervisor.restart_backoff_max_ms, 0, kMaxMs));
  WSUP_RETURN_IF_ERROR(Int(sup, "supervisor", "max_restarts", &c->supervisor.max_restarts, 0, 1'000'000));
  WSUP_RETURN_IF_ERROR(Int(sup, "supervisor", "restart_window_ms", &c->supervisor.restart_window_ms, 1, kMaxMs));
  WSUP_RETURN_IF_ERROR(Int(sup, "supervisor", "rollout_watch_ms", &c->supervisor.rollout_watch_ms, 0, kMaxMs));
  WSUP_RETURN_IF_ERROR(Str(sup, "supervisor", "control_socket", &c->supervisor.control_socket, false));
  c->supervisor.control_socket = c->supervisor.control_socket.empty()
                                     ? c->node.runtime_dir + "/wsup.sock"
                                     : ResolvePath(dir_, c->supervisor.control_socket);
  WSUP_RETURN_IF_ERROR(
      Choice(sup, "supervisor", "log_level", {"trace", "debug", "info", "warn", "error"}, &c->supervisor.log_level));

  // [holder]
  const toml::table* holder = Section(root, "holder");
  WSUP_RETURN_IF_ERROR(Str(holder, "holder", "binary", &c->holder.binary, false));
  c->holder.binary = ResolvePath(dir_, c->holder.binary);
  WSUP_RETURN_IF_ERROR(StrArray(holder, "holder", "command", &c->holder.command, false));
  if (Get(holder, "holder", "command")) {
    WSUP_RETURN_IF_ERROR(Command("holder.command", c->holder.command, HolderPlaceholders(), false));
    if (c->holder.command[0].find('/') != std::string::npos)
      c->holder.command[0] = ResolvePath(dir_, c->holder.command[0]);
  }
  WSUP_RETURN_IF_ERROR(Int(holder, "holder", "ready_timeout_ms", &c->holder.ready_timeout_ms, 1, kMaxMs));

  // [kv]
  const toml::table* kv = Section(root, "kv");
  WSUP_RETURN_IF_ERROR(Int(kv, "kv", "pool_mib", &c->kv.pool_mib, 0, kMaxKvPoolMib));
  WSUP_RETURN_IF_ERROR(Int(kv, "kv", "scratch_mib", &c->kv.scratch_mib, 1, kMaxKvScratchMib));

  // [group]: every key but head and lease_ttl_ms is required once the
  // section is there.
  if (const toml::table* g = Section(root, "group")) {
    WSUP_RETURN_IF_ERROR(Str(g, "group", "name", &c->group.name, true, "name = \"dsv3\""));
    WSUP_RETURN_IF_ERROR(PlainName("group.name", c->group.name, "it names the group's keys in etcd"));
    WSUP_RETURN_IF_ERROR(Int(g, "group", "size", &c->group.size, 2, kMaxGroupSize, true, "size = 2"));
    WSUP_RETURN_IF_ERROR(Int(g, "group", "index", &c->group.index, 0, kMaxGroupSize - 1, true, "index = 0"));
    WSUP_RETURN_IF_ERROR(Int(g, "group", "head", &c->group.head, 0, kMaxGroupSize - 1));
    WSUP_RETURN_IF_ERROR(
        StrArray(g, "group", "etcd", &c->group.etcd, true, "etcd = [\"http://10.0.0.1:2379\"]"));
    WSUP_RETURN_IF_ERROR(
        Int(g, "group", "lease_ttl_ms", &c->group.lease_ttl_ms, kMinLeaseTtlMs, kMaxLeaseTtlMs));
  }
  return Status::Ok();
}

Status Loader::CheckRules(Config* c) {
  // parallel
  const auto& devs = c->parallel.devices;
  std::set<int> seen;
  for (int d : devs)
    if (!seen.insert(d).second)
      return Err("parallel.devices", "device " + std::to_string(d) + " is listed twice; give each rank its own device");
  if (c->weight_cache.backend == CacheBackend::kCuda && static_cast<int>(devs.size()) != c->parallel.tp)
    return Err("parallel.devices",
               "lists " + std::to_string(devs.size()) + " device(s) but parallel.tp is " +
                   std::to_string(c->parallel.tp) + "; the cuda backend needs exactly one device per rank, e.g. devices = [" +
                   [&] {
                     std::string s;
                     for (int i = 0; i < c->parallel.tp && i < 8; ++i) s += (i ? ", " : "") + std::to_string(i);
                     return s + (c->parallel.tp > 8 ? ", ..." : "");
                   }() +
                   "]");
  if (c->weight_cache.backend == CacheBackend::kHost && !devs.empty() && static_cast<int>(devs.size()) != c->parallel.tp)
    return Err("parallel.devices", "lists " + std::to_string(devs.size()) + " device(s) but parallel.tp is " +
                                       std::to_string(c->parallel.tp) +
                                       "; give one device per rank, or leave devices out for the host backend");

  // weight_cache
  if (c->weight_cache.layout == CacheLayout::kEngine) {
    if (c->weight_cache.mode == CacheMode::kOff)
      return Err("weight_cache.layout", "\"engine\" needs a holder to publish to: set weight_cache.mode to "
                                        "\"daemon\" or \"client\", or leave layout out");
  } else if (c->weight_cache.layout_max_bytes != 0) {
    return Err("weight_cache.layout_max_bytes", "caps the memory of engine-made layouts; set weight_cache.layout "
                                                "= \"engine\", or leave layout_max_bytes out");
  }

  // kv: the holders make the pool (daemon: the supervisor's, which it keeps;
  // client: holders run by someone else with --kv-pool-mib), and the
  // supervisor says which engine maps it. Without holders there is none.
  if (c->kv.pool_mib > 0 && c->weight_cache.mode == CacheMode::kOff)
    return Err("kv.pool_mib", std::to_string(c->kv.pool_mib) + " MiB needs holders to make the pool, and "
                              "weight_cache.mode = \"off\" has none; set mode = \"daemon\" (the supervisor runs "
                              "the holders and keeps the pool), or leave pool_mib out (0: engines keep their own KV)");

  // engine
  // Port 0: the supervisor picks a free port at each start (tests, ad-hoc runs).
  if (c->engine.primary_port != 0 && c->engine.primary_port == c->engine.standby_port)
    return Err("engine.standby_port", "equals engine.primary_port (" + std::to_string(c->engine.primary_port) +
                                          "); the two engines run at once and need different ports");
  for (const auto* l : {&c->front.listen, &c->admin.listen}) {
    const char* key = l == &c->front.listen ? "front.listen" : "admin.listen";
    for (int port : {c->engine.primary_port, c->engine.standby_port})
      if (port != 0 && l->port == port)
        return Err(key, "uses port " + std::to_string(port) +
                            ", which an engine uses (engine.primary_port / engine.standby_port); pick another port");
  }
  if (c->front.listen.port != 0 && c->front.listen.port == c->admin.listen.port)
    return Err("admin.listen", "uses the same port as front.listen (" + std::to_string(c->front.listen.port) +
                                   "); the front and the admin endpoint need different ports");

  // probe
  auto& p = c->probe;
  if (p.timeout_ms > p.interval_ms)
    return Err("probe.timeout_ms", std::to_string(p.timeout_ms) + " is longer than probe.interval_ms (" +
                                       std::to_string(p.interval_ms) +
                                       "); probes never overlap, so a longer timeout would silently stretch the "
                                       "interval: raise interval_ms or lower timeout_ms to at most interval_ms");
  if (p.jitter_ms > p.interval_ms)
    return Err("probe.jitter_ms", std::to_string(p.jitter_ms) + " is longer than probe.interval_ms (" +
                                      std::to_string(p.interval_ms) + "); allowed: 0 to interval_ms");
  if (p.kind == ProbeKind::kSemantic) {
    if (p.prompt.empty())
      return value_src_.count("probe.prompt") ? Err("probe.prompt", "is empty; the semantic probe needs a prompt with a known answer")
                                              : Missing("probe.prompt", "prompt = \"Hello, world\"");
    if (p.expect && p.expect_token_ids)
      return Err("probe.expect_token_ids",
                 "is set together with probe.expect; give exactly one: expect (the answer's text) or expect_token_ids "
                 "(its token ids)");
    if (!p.expect && !p.expect_token_ids)
      return Err("probe.expect", "missing; the semantic probe needs a known answer: set expect = \"text\" or "
                                 "expect_token_ids = [..] in [probe]");
    if (p.expect && p.expect->empty())
      return Err("probe.expect", "is empty; an empty answer proves nothing: give the expected text");
    if (p.expect_token_ids) {
      if (p.expect_token_ids->empty())
        return Err("probe.expect_token_ids", "is empty; give the token ids of the expected answer");
      if (static_cast<int64_t>(p.expect_token_ids->size()) > p.max_tokens)
        return Err("probe.expect_token_ids",
                   "has " + std::to_string(p.expect_token_ids->size()) + " ids but probe.max_tokens is " +
                       std::to_string(p.max_tokens) + ", so the answer can never match; raise max_tokens to at least " +
                       std::to_string(p.expect_token_ids->size()));
    }
  } else {
    for (const char* k : {"probe.prompt", "probe.expect", "probe.expect_token_ids"})
      if (value_src_.count(k) || set_.count(k))
        return Err(k, "only applies to probe.kind = \"semantic\"; remove it or set kind = \"semantic\"");
  }

  // supervisor
  if (c->supervisor.restart_backoff_max_ms < c->supervisor.restart_backoff_ms)
    return Err("supervisor.restart_backoff_max_ms",
               std::to_string(c->supervisor.restart_backoff_max_ms) + " is below supervisor.restart_backoff_ms (" +
                   std::to_string(c->supervisor.restart_backoff_ms) + "); allowed: at least restart_backoff_ms");

  // holder
  if (!c->holder.binary.empty() && !c->holder.command.empty())
    return Err("holder.command", "is set together with holder.binary; set one: binary (standard arguments) or "
                                 "command (a full command line)");
  if (c->node.state_dir == c->node.runtime_dir)
    return Err("node.runtime_dir", "is the same folder as node.state_dir; runtime files are removed at boot while "
                                   "the ledger must persist: use two folders");
  WSUP_RETURN_IF_ERROR(CheckGroup(*c));
  return CheckSocketPaths(*c);
}

Status Loader::PlainName(const std::string& key, const std::string& value, const std::string& use) const {
  for (char ch : value)
    if (!IsBareKeyChar(ch) && ch != '.')
      return Err(key, "\"" + Printable(value) + "\" has a character other than letters, digits, '.', '_' and '-'; " +
                          use + ", so pick a plain name");
  return Status::Ok();
}

Status Loader::CheckGroup(const Config& c) const {
  const Config::Group& g = c.group;
  if (!g.enabled()) return Status::Ok();
  const std::string members = "allowed: 0 to " + std::to_string(g.size - 1) + " (group.size is " +
                              std::to_string(g.size) + ")";
  if (g.index >= g.size) return Err("group.index", std::to_string(g.index) + " is not a member; " + members);
  if (g.head >= g.size) return Err("group.head", std::to_string(g.head) + " is not a member; " + members);
  if (g.lease_ttl_ms % 1000 != 0)
    return Err("group.lease_ttl_ms", std::to_string(g.lease_ttl_ms) +
                                         " is not whole seconds; etcd grants leases in seconds: write a multiple of 1000");
  if (g.etcd.empty())
    return Err("group.etcd", "is empty; the members agree through etcd: list its endpoints, e.g. etcd = "
                             "[\"http://10.0.0.1:2379\"]");
  std::set<std::string> seen;
  for (const std::string& e : g.etcd) {
    // The client's own rules (group/etcd.h): what it cannot reach is
    // refused here, not at the first call.
    auto endpoint = group::ParseEtcdEndpoint(e);
    if (!endpoint.ok())
      return Err("group.etcd", "\"" + Printable(e) + "\" is not an etcd endpoint: " + endpoint.error().message());
    if (!seen.insert(endpoint->ToString()).second)
      return Err("group.etcd", "\"" + Printable(e) + "\" is listed twice; list each etcd member once");
  }
  if (static_cast<int64_t>(c.parallel.tp) * g.size > 1024)
    return Err("group.size", std::to_string(g.size) + " members of parallel.tp " + std::to_string(c.parallel.tp) +
                                 " ranks each make " + std::to_string(static_cast<int64_t>(c.parallel.tp) * g.size) +
                                 " ranks; at most 1024");
  return Status::Ok();
}

Status Loader::CheckSocketPaths(const Config& c) const {
  // Every Unix socket the node binds, and the key that places it: a key of
  // its own when the file (or --set) gives one, else node.runtime_dir. A
  // path past sun_path would be cut short or refused by bind, and the
  // holders and the front would crash-loop on it.
  struct Socket {
    std::string key;
    std::string path;
    const char* what;
  };
  auto given = [&](const std::string& key) { return value_src_.count(key) > 0 || set_.count(key) > 0; };
  std::vector<Socket> sockets;
  sockets.push_back({given("supervisor.control_socket") ? "supervisor.control_socket" : "node.runtime_dir",
                     c.supervisor.control_socket, "the supervisor's control socket"});
  sockets.push_back({"node.runtime_dir", JoinPath(c.node.runtime_dir, "front.sock"), "the front's control socket"});
  if (c.weight_cache.mode != CacheMode::kOff) {
    // The last rank's is the longest ("holder.sock.7").
    sockets.push_back({given("weight_cache.socket") ? "weight_cache.socket" : "node.runtime_dir",
                       HolderSocket(c, std::max(1, c.parallel.tp) - 1),
                       c.parallel.tp > 1 ? "the last holder's socket" : "the holder's socket"});
  }
  // What node.runtime_dir leaves room for: its longest socket name.
  size_t runtime_suffix = 0;
  for (const auto& s : sockets) {
    if (s.key == "node.runtime_dir") runtime_suffix = std::max(runtime_suffix, s.path.size() - c.node.runtime_dir.size());
  }
  for (const auto& s : sockets) {
    if (s.path.size() <= kMaxSocketPathBytes) continue;
    const std::string what = std::string(s.what) + " " + Printable(s.path, 400) + " is " +
                             std::to_string(s.path.size()) + " bytes, longer than the " +
                             std::to_string(kMaxSocketPathBytes) + " a Unix socket path may have";
    if (s.key == "node.runtime_dir") {
      return Err(s.key, what + "; choose a runtime_dir of at most " +
                            std::to_string(kMaxSocketPathBytes - std::min(runtime_suffix, kMaxSocketPathBytes)) +
                            " bytes (it is " + std::to_string(c.node.runtime_dir.size()) + ")");
    }
    const size_t suffix = s.key == "weight_cache.socket" ? s.path.size() - c.weight_cache.socket.size() : 0;
    return Err(s.key, what + "; give a path of at most " + std::to_string(kMaxSocketPathBytes - suffix) + " bytes");
  }
  return Status::Ok();
}

}  // namespace wsup::config_detail
