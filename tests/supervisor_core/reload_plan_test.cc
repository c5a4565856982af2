// What a reload may change (supervisor/reload_plan.h): the engine version
// rolls, probe and policy settings apply at once, everything that needs a
// cold start is refused with its location in the file.
#include <catch2/catch.hpp>

#include <set>
#include <string>

#include "supervisor/reload_plan.h"
#include "testkit/test_util.h"
#include "tests/supervisor_core/node_toml.h"

namespace wsup {
namespace {

const std::string kBase = test::NodeToml("prompt = \"Hello\"\nexpect = \" world\"\n");

Config Parse(const std::string& text) {
  auto c = ParseConfig(text, "/etc/wsup/n.toml");
  if (!c.ok()) FAIL(c.error().message());
  return std::move(*c);
}

std::string Replace(std::string text, const std::string& from, const std::string& to) {
  auto at = text.find(from);
  REQUIRE(at != std::string::npos);
  return text.replace(at, from.size(), to);
}

TEST_CASE("reload plan: nothing changed, nothing to do", "[reload]") {
  ReloadPlan p = PlanReload(Parse(kBase), Parse(kBase));
  CHECK(p.changes.empty());
  CHECK(p.refused.empty());
  CHECK_FALSE(p.roll());
}

TEST_CASE("reload plan: a new engine command or env rolls, probe and policy settings apply at once", "[reload]") {
  std::string next = Replace(kBase, "\"--port\", \"{port}\"]", "\"--port\", \"{port}\", \"--max-batch\", \"8\"]");
  next += "\n[supervisor]\nmax_restarts = 9\n";
  next = Replace(next, "expect = \" world\"", "expect = \" world\"\ninterval_ms = 2000");
  ReloadPlan p = PlanReload(Parse(kBase), Parse(next));
  INFO(p.changes.size());
  CHECK(p.refused.empty());
  CHECK(p.roll());
  CHECK(p.at_once());
  std::set<std::string> keys;
  for (const auto& c : p.changes) keys.insert(c.key + "=" + ReloadEffectName(c.effect));
  CHECK(keys == std::set<std::string>{"engine.command=roll", "probe.interval_ms=at_once", "supervisor.max_restarts=at_once"});
  std::string env = Replace(kBase, "[probe]", "env = { NCCL_DEBUG = \"WARN\" }\n\n[probe]");
  ReloadPlan e = PlanReload(Parse(kBase), Parse(env));
  REQUIRE(e.changes.size() == 1);
  CHECK(e.changes[0].key == "engine.env");
  CHECK(e.roll());
  CHECK(EngineVersionText(Parse(env)).find("NCCL_DEBUG") != std::string::npos);
}

TEST_CASE("reload plan: engine.env values are never shown - their names and a hash are", "[reload]") {
  const std::string secret = "hf_QwErTy0123456789secret";
  Config one = Parse(Replace(kBase, "[probe]", "env = { HF_TOKEN = \"" + secret + "\", NCCL_DEBUG = \"WARN\" }\n\n[probe]"));
  Config two = Parse(Replace(kBase, "[probe]", "env = { HF_TOKEN = \"hf_other\", NCCL_DEBUG = \"WARN\" }\n\n[probe]"));
  const std::string text = EngineVersionText(one);
  INFO(text);
  CHECK(text.find(secret) == std::string::npos);
  CHECK(text.find("WARN") == std::string::npos);
  CHECK(text.find("HF_TOKEN") != std::string::npos);
  CHECK(text.find("NCCL_DEBUG") != std::string::npos);
  CHECK(text.find(EnvValueHash(secret)) != std::string::npos);
  CHECK(EnvValueHash(secret).size() == std::string("sha256:").size() + 16);
  // A changed value is still a change, and still not shown.
  CHECK(EngineVersionText(two) != text);
  ReloadPlan p = PlanReload(one, two);
  REQUIRE(p.changes.size() == 1);
  CHECK(p.changes[0].key == "engine.env");
  CHECK(p.roll());
  for (const auto& ch : p.changes) {
    CHECK(ch.before.find(secret) == std::string::npos);
    CHECK(ch.after.find("hf_other") == std::string::npos);
  }
  for (const auto& [key, value] : ConfigValues(one)) CHECK(value.find(secret) == std::string::npos);
}

TEST_CASE("reload plan: a cold key is refused at its line and column, naming the fix", "[reload]") {
  std::string next = Replace(kBase, "path = \"model\"", "path = \"/models/b\"");
  next = Replace(next, "listen = \"127.0.0.1:8000\"", "listen = \"127.0.0.1:8003\"");
  next = Replace(next, "expect = \" world\"", "expect = \" world\"\nfailures = 5");
  ReloadPlan p = PlanReload(Parse(kBase), Parse(next));
  REQUIRE(p.refused.size() == 2);
  CHECK(p.refused[0].message().rfind("/etc/wsup/n.toml:6:8: model.path: cannot change while the node runs", 0) == 0);
  CHECK(p.refused[0].message().find("wsup stop") != std::string::npos);
  CHECK(p.refused[1].message().rfind("/etc/wsup/n.toml:", 0) == 0);
  CHECK(p.refused[1].message().find("front.listen:") != std::string::npos);
  // The at-once change is listed too; the caller refuses the whole reload.
  CHECK(p.at_once());
  // Keys set by --set are located there.
  auto a = ParseConfig(kBase, "/etc/wsup/n.toml", {"parallel.tp=1"});
  auto b = ParseConfig(kBase, "/etc/wsup/n.toml", {"weight_cache.mode=off"});
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  ReloadPlan s = PlanReload(*a, *b);
  REQUIRE(s.refused.size() == 1);
  CHECK(s.refused[0].message().rfind("--set:1:", 0) == 0);
  CHECK(s.refused[0].message().find("weight_cache.mode") != std::string::npos);
}

TEST_CASE("reload plan: every key of the schema has an effect, and only the version rolls", "[reload]") {
  Config c = Parse(kBase);
  auto values = ConfigValues(c);
  CHECK(values.size() >= 40);
  for (const auto& [key, value] : values) {
    INFO(key);
    CHECK(c.where.count(key) == 1);
    if (EffectOf(key) == ReloadEffect::kRoll) CHECK((key == "engine.command" || key == "engine.env"));
  }
  CHECK(EffectOf("kv.pool_mib") == ReloadEffect::kCold);
  CHECK(EffectOf("probe.expect") == ReloadEffect::kAtOnce);
  CHECK(EffectOf("front.queue_timeout_ms") == ReloadEffect::kAtOnce);
  for (const char* k : {"front.hedge_after_ms", "front.hedge_percent", "front.hedge_burst"}) {
    CHECK(EffectOf(k) == ReloadEffect::kAtOnce);
  }
  CHECK(EffectOf("supervisor.control_socket") == ReloadEffect::kCold);
  // The front's loops are threads it starts with: a restart of the front changes them.
  CHECK(EffectOf("front.loops") == ReloadEffect::kCold);
}

TEST_CASE("reload plan: a slot that runs another version rolls, though the config did not change", "[reload]") {
  const Config c = Parse(kBase);
  const EngineVersion same = VersionOf(c);
  // Both slots run the config's version: nothing to do.
  ReloadPlan none = PlanReload(c, c, {{"a", same}, {"b", same}});
  CHECK(none.changes.empty());
  // One runs another command (a roll a restart cut short): the reload rolls.
  EngineVersion other = same;
  other.command.push_back("--max-batch");
  ReloadPlan p = PlanReload(c, c, {{"a", same}, {"b", other}});
  REQUIRE(p.changes.size() == 1);
  CHECK(p.roll());
  CHECK(p.refused.empty());
  CHECK(p.changes[0].key == "engine.command");
  CHECK(p.changes[0].note.find("engine b runs another version") != std::string::npos);
  CHECK(p.changes[0].where.rfind("/etc/wsup/n.toml:", 0) == 0);
  // Another env only: engine.env.
  EngineVersion env = same;
  env.env.emplace_back("NCCL_DEBUG", "WARN");
  ReloadPlan e = PlanReload(c, c, {{"a", env}});
  REQUIRE(e.changes.size() == 1);
  CHECK(e.changes[0].key == "engine.env");
  // A config change that rolls already: one change for it, none per slot.
  std::string next = Replace(kBase, "\"--port\", \"{port}\"]", "\"--port\", \"{port}\", \"--x\"]");
  ReloadPlan both = PlanReload(c, Parse(next), {{"a", other}, {"b", same}});
  REQUIRE(both.changes.size() == 1);
  CHECK(both.changes[0].note.empty());
  // WithVersion and VersionOf are each other's inverse on the version.
  CHECK(VersionOf(WithVersion(c, other)) == other);
  CHECK(WithVersion(c, other).engine.primary_port == c.engine.primary_port);
}

TEST_CASE("reload plan: reload --set comes after the start's overrides, one per key", "[reload]") {
  CHECK(MergeOverrides({}, {}).empty());
  CHECK(MergeOverrides({"node.state_dir=/s", "probe.failures=3"}, {"probe.failures=7"}) ==
        std::vector<std::string>{"node.state_dir=/s", "probe.failures=7"});
  CHECK(MergeOverrides({"probe.failures=3"}, {" probe.failures = 5", "probe.successes=1"}) ==
        std::vector<std::string>{" probe.failures = 5", "probe.successes=1"});
  // The same again changes nothing.
  const std::vector<std::string> start = {"node.state_dir=/s", "front.listen=127.0.0.1:0"};
  CHECK(MergeOverrides(start, start) == start);
  // As loaded: the later value wins.
  auto c = ParseConfig(kBase, "/etc/wsup/n.toml", MergeOverrides({"probe.failures=3"}, {"probe.failures=7"}));
  REQUIRE(c.ok());
  CHECK(c->probe.failures == 7);
}

}  // namespace
}  // namespace wsup
