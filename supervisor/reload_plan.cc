#include "supervisor/reload_plan.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "common/enum_names.h"
#include "common/sha256.h"

namespace wsup {

namespace {

using nlohmann::json;

std::string Text(const json& j) { return j.dump(); }

// engine.env as {"NAME": "sha256:..."}: the names, and whether a value
// changed, never the value itself (a token, a password).
json EnvShown(const std::vector<std::pair<std::string, std::string>>& env) {
  json out = json::object();
  for (const auto& [k, v] : env) out[k] = EnvValueHash(v);
  return out;
}

}  // namespace

const char* ReloadEffectName(ReloadEffect e) {
  static constexpr EnumNames<ReloadEffect::kCold> kNames{"roll", "at_once", "cold"};
  return kNames(e);
}

ReloadEffect EffectOf(const std::string& key) {
  if (key == "engine.command" || key == "engine.env") return ReloadEffect::kRoll;
  if (key.rfind("probe.", 0) == 0) return ReloadEffect::kAtOnce;
  for (const char* k : {"engine.ready_timeout_ms", "engine.stop_timeout_ms", "front.queue_timeout_ms",
                        "front.max_queued", "front.hedge_after_ms", "front.hedge_percent", "front.hedge_burst",
                        "supervisor.restart_backoff_ms", "supervisor.restart_backoff_max_ms",
                        "supervisor.max_restarts", "supervisor.restart_window_ms", "supervisor.rollout_watch_ms",
                        "supervisor.log_level"}) {
    if (key == k) return ReloadEffect::kAtOnce;
  }
  return ReloadEffect::kCold;
}

std::vector<std::pair<std::string, std::string>> ConfigValues(const Config& c) {
  std::vector<std::pair<std::string, std::string>> v;
  auto add = [&](const char* key, const json& value) { v.emplace_back(key, Text(value)); };
  add("node.name", c.node.name);
  add("node.state_dir", c.node.state_dir);
  add("node.runtime_dir", c.node.runtime_dir);
  add("model.path", c.model.path);
  add("model.revision", c.model.revision);
  add("parallel.tp", c.parallel.tp);
  add("parallel.devices", c.parallel.devices);
  add("parallel.expert_parallel", c.parallel.expert_parallel);
  add("weight_cache.mode", CacheModeName(c.weight_cache.mode));
  add("weight_cache.backend", CacheBackendName(c.weight_cache.backend));
  add("weight_cache.socket", c.weight_cache.socket);
  add("weight_cache.layout", CacheLayoutName(c.weight_cache.layout));
  add("weight_cache.layout_max_bytes", c.weight_cache.layout_max_bytes);
  add("engine.command", c.engine.command);
  add("engine.host", c.engine.host);
  add("engine.primary_port", c.engine.primary_port);
  add("engine.standby_port", c.engine.standby_port);
  add("engine.ready_timeout_ms", c.engine.ready_timeout_ms);
  add("engine.stop_timeout_ms", c.engine.stop_timeout_ms);
  add("engine.env", EnvShown(c.engine.env));
  add("probe.kind", ProbeKindName(c.probe.kind));
  add("probe.prompt", c.probe.prompt);
  add("probe.expect", c.probe.expect ? json(*c.probe.expect) : json(nullptr));
  add("probe.expect_token_ids", c.probe.expect_token_ids ? json(*c.probe.expect_token_ids) : json(nullptr));
  add("probe.max_tokens", c.probe.max_tokens);
  add("probe.interval_ms", c.probe.interval_ms);
  add("probe.timeout_ms", c.probe.timeout_ms);
  add("probe.failures", c.probe.failures);
  add("probe.successes", c.probe.successes);
  add("probe.jitter_ms", c.probe.jitter_ms);
  add("probe.comm", c.probe.comm);
  add("probe.comm_max_age_ms", c.probe.comm_max_age_ms);
  add("front.listen", c.front.listen.ToString());
  add("front.queue_timeout_ms", c.front.queue_timeout_ms);
  add("front.max_queued", c.front.max_queued);
  add("front.hedge_after_ms", c.front.hedge_after_ms);
  add("front.hedge_percent", c.front.hedge_percent);
  add("front.hedge_burst", c.front.hedge_burst);
  add("front.loops", c.front.loops);
  add("admin.listen", c.admin.listen.ToString());
  add("supervisor.restart_backoff_ms", c.supervisor.restart_backoff_ms);
  add("supervisor.restart_backoff_max_ms", c.supervisor.restart_backoff_max_ms);
  add("supervisor.max_restarts", c.supervisor.max_restarts);
  add("supervisor.restart_window_ms", c.supervisor.restart_window_ms);
  add("supervisor.rollout_watch_ms", c.supervisor.rollout_watch_ms);
  add("supervisor.control_socket", c.supervisor.control_socket);
  add("supervisor.log_level", c.supervisor.log_level);
  add("holder.binary", c.holder.binary);
  add("holder.command", c.holder.command);
  add("holder.ready_timeout_ms", c.holder.ready_timeout_ms);
  add("kv.pool_mib", c.kv.pool_mib);
  add("kv.scratch_mib", c.kv.scratch_mib);
  add("group.name", c.group.name);
  add("group.index", c.group.index);
  add("group.size", c.group.size);
  add("group.head", c.group.head);
  add("group.etcd", c.group.etcd);
  add("group.lease_ttl_ms", c.group.lease_ttl_ms);
  return v;
}

bool ReloadPlan::roll() const {
  for (const auto& c : changes) {
    if (c.effect == ReloadEffect::kRoll) return true;
  }
  return false;
}

bool ReloadPlan::at_once() const {
  for (const auto& c : changes) {
    if (c.effect == ReloadEffect::kAtOnce) return true;
  }
  return false;
}

ReloadPlan PlanReload(const Config& running, const Config& next, const std::vector<SlotVersion>& slots) {
  ReloadPlan plan;
  auto before = ConfigValues(running);
  auto after = ConfigValues(next);
  for (size_t i = 0; i < before.size() && i < after.size(); ++i) {
    if (before[i].second == after[i].second) continue;
    ReloadChange ch;
    ch.key = after[i].first;
    ch.effect = EffectOf(ch.key);
    ch.before = before[i].second;
    ch.after = after[i].second;
    auto w = next.where.find(ch.key);
    ch.where = w != next.where.end() ? w->second : next.path + ":1:1";
    if (ch.effect == ReloadEffect::kCold) {
      const std::string shown_before = ch.before.size() > 120 ? ch.before.substr(0, 117) + "..." : ch.before;
      plan.refused.push_back(Refused(ch.where + ": " + ch.key + ": cannot change while the node runs (it is " +
                                     shown_before + "); put it back to reload the rest, or apply it with a cold "
                                     "start (`wsup stop`, then `wsup start`)"));
    }
    plan.changes.push_back(std::move(ch));
  }
  if (plan.roll()) return plan;
  // The config did not change the version, but a slot runs another one.
  const EngineVersion want = VersionOf(next);
  for (const auto& sv : slots) {
    if (sv.version == want) continue;
    ReloadChange ch;
    ch.key = sv.version.command != want.command ? "engine.command" : "engine.env";
    ch.effect = ReloadEffect::kRoll;
    for (const auto& [k, v] : ConfigValues(WithVersion(next, sv.version))) {
      if (k == ch.key) ch.before = v;
    }
    for (const auto& [k, v] : ConfigValues(next)) {
      if (k == ch.key) ch.after = v;
    }
    auto w = next.where.find(ch.key);
    ch.where = w != next.where.end() ? w->second : next.path + ":1:1";
    ch.note = "engine " + sv.slot + " runs another version than the config's";
    plan.changes.push_back(std::move(ch));
    break;  // one roll moves both slots
  }
  return plan;
}

std::string EnvValueHash(const std::string& value) { return "sha256:" + Sha256Hex(value).substr(0, 16); }

EngineVersion VersionOf(const Config& c) { return EngineVersion{c.engine.command, c.engine.env}; }

Config WithVersion(Config c, const EngineVersion& v) {
  c.engine.command = v.command;
  c.engine.env = v.env;
  return c;
}

std::vector<std::string> MergeOverrides(const std::vector<std::string>& base, const std::vector<std::string>& more) {
  auto key_of = [](const std::string& o) {
    std::string k = o.substr(0, o.find('='));
    const size_t b = k.find_first_not_of(" \t");
    const size_t e = k.find_last_not_of(" \t");
    return b == std::string::npos ? std::string() : k.substr(b, e - b + 1);
  };
  std::vector<std::string> out;
  auto add = [&](const std::string& o) {
    const std::string k = key_of(o);
    out.erase(std::remove_if(out.begin(), out.end(), [&](const std::string& x) { return key_of(x) == k; }),
              out.end());
    out.push_back(o);
  };
  for (const auto& o : base) add(o);
  for (const auto& o : more) add(o);
  return out;
}

std::string EngineVersionText(const Config& c) {
  json j = c.engine.command;
  std::string out = j.dump();
  if (!c.engine.env.empty()) out += " env " + EnvShown(c.engine.env).dump();
  return out;
}

}  // namespace wsup
