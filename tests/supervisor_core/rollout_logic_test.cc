// Rollouts on the supervisor's logic rig (logic_rig.h): the real Supervisor
// on fake processes and a fake clock, with engines that answer HTTP
// (fake_engine.h) and a front that answers the probe through it, so that
// every step of a roll runs as on a node, and the test decides when a
// process stops, dies, or is slow to start. Checked:
//   - the new engine's recovery row is dated when it was proven, not when
//     it next became a standby;
//   - a rolled-back roll ends with both slots on the old version, proven,
//     the node serving: a new version that answers wrongly or exits with
//     the permanent-failure code, the old version's standby killed in the
//     watch window, the new active killed in it;
//   - a supervisor restarted during each step ends the roll's row as
//     interrupted, leaves both slots on one version (finished when the new
//     one was proven and serves, rolled back otherwise), and the next
//     reload rolls or says nothing changed accordingly;
//   - `wsup reload --set` applies its overrides and keeps them.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <thread>

#include <nlohmann/json.hpp>

#include "state/report.h"
#include "tests/supervisor_core/fake_engine.h"
#include "tests/supervisor_core/logic_rig.h"
#include "wire/json_call.h"

namespace wsup {
namespace {

using namespace std::chrono_literals;
using logic::FakeEngine, logic::Rig;
using nlohmann::json;

// Fast real-time probes against the fake engines; a short watch window.
constexpr const char* kProbeToml = "interval_ms = 60\ntimeout_ms = 60\njitter_ms = 0\nsuccesses = 1\nfailures = 3\n";
constexpr const char* kSupervisorToml = "rollout_watch_ms = 1000\n";

// How the engine processes of one version behave.
enum class Body {
  kServes,  // answers the probe right
  kWrong,   // answers it wrongly
  kExit78,  // exits at once with the permanent-failure code (a checkpoint it refuses)
  kHeld,    // does not answer until the test releases it (a slow start)
};

// A reload asked on another thread while the test runs the loop.
struct Call {
  std::thread thread;
  std::atomic<bool> done{false};
  std::optional<json> reply;
  ~Call() {
    if (thread.joinable()) thread.join();
  }
};

struct RollRig {
  std::map<pid_t, std::unique_ptr<FakeEngine>> engines;
  std::map<pid_t, std::string> version_of;  // each engine process's version tag, from its argv
  std::map<pid_t, std::pair<int, std::string>> held;  // port and nonce of a held engine
  std::vector<std::unique_ptr<FakeEngine>> fronts;
  std::map<std::string, Body> bodies;  // by version tag; kServes when absent
  std::unique_ptr<Rig> rig;

  RollRig() {
    rig = std::make_unique<Rig>(
        "client", 600'000, kProbeToml,
        [this](Rig& r) {
          r.procs.on_spawn = [this, &r](pid_t pid, const std::string& kind, const ChildSpec& spec) {
            OnSpawn(r, pid, kind, spec);
          };
          r.procs.on_death = [this](pid_t pid) {
            held.erase(pid);
            auto it = engines.find(pid);
            if (it != engines.end()) it->second->Stop();
          };
        },
        kSupervisorToml);
  }
  ~RollRig() {
    rig.reset();
    engines.clear();
    fronts.clear();
  }

  void OnSpawn(Rig& r, pid_t pid, const std::string& kind, const ChildSpec& spec) {
    if (kind == "front") {
      // The front's listening socket, served: the probe through the front answers.
      REQUIRE(!spec.pass_fds.empty());
      auto f = FakeEngine::Front(spec.pass_fds[0], "world");
      REQUIRE(f->Start());
      fronts.push_back(std::move(f));
      return;
    }
    if (kind.rfind("engine-", 0) != 0) return;
    std::string port, nonce, tag = "v1";
    for (size_t i = 0; i + 1 < spec.argv.size(); ++i) {
      if (spec.argv[i] == "--port") port = spec.argv[i + 1];
      if (spec.argv[i] == "--version") tag = spec.argv[i + 1];
    }
    for (const auto& [k, v] : spec.env_set) {
      if (k == "WSUP_ENGINE_NONCE") nonce = v;
    }
    version_of[pid] = tag;
    const Body body = bodies.count(tag) ? bodies[tag] : Body::kServes;
    if (body == Body::kExit78) {
      r.procs.Exit(pid, kExitConfig);
      return;
    }
    if (body == Body::kHeld) {
      held[pid] = {std::atoi(port.c_str()), nonce};
      return;
    }
    StartEngine(pid, std::atoi(port.c_str()), nonce, body == Body::kWrong ? "wrong" : "world");
  }
  void StartEngine(pid_t pid, int port, const std::string& nonce, const std::string& text) {
    auto e = std::make_unique<FakeEngine>(port, nonce, text);
    REQUIRE(e->Start());
    engines[pid] = std::move(e);
  }
  // The held engines start answering.
  void Release() {
    auto all = std::move(held);
    held.clear();
    for (const auto& [pid, pn] : all) StartEngine(pid, pn.first, pn.second, "world");
  }

  // The config file's engine command at version `tag` (v1: the first one).
  void SetVersion(const std::string& tag) {
    const std::string path = rig->dir.Join("node.toml");
    std::string text = test::ReadAll(path);
    const std::string key = "\"--port\", \"{port}\"";
    const size_t at = text.find(key);
    REQUIRE(at != std::string::npos);
    const size_t end = text.find(']', at);
    text.replace(at, end - at, key + (tag == "v1" ? "" : ", \"--version\", \"" + tag + "\""));
    REQUIRE(WriteFileAtomic(path, text).ok());
  }

  bool Until(const std::function<bool()>& cond, std::chrono::milliseconds limit = 20s) {
    return rig->SettleUntil(cond, limit, 5);
  }
  json Status() { return rig->Status(); }
  std::string Sock() { return rig->dir.Join("run/wsup.sock"); }

  void Send(Call& c, json req) {
    const std::string sock = Sock();
    c.thread = std::thread([&c, sock, req] {
      auto r = JsonCall(sock, req, 60'000);
      if (r.ok()) c.reply = *r;
      c.done = true;
    });
  }
  // A reload, answered (the loop runs meanwhile).
  json Reload(json req = json{{"type", "reload"}}) {
    Call c;
    Send(c, std::move(req));
    const bool answered = Until([&] { return c.done.load(); }, 30s);
    c.thread.join();
    INFO(Status().dump(1));
    REQUIRE(answered);
    REQUIRE(c.reply);
    return *c.reply;
  }

  json Engine(const std::string& slot) { return rig->Engine(slot); }
  // The version tag each slot's live process runs.
  std::string VersionOf(const std::string& slot) {
    const pid_t pid = Engine(slot).value("pid", 0);
    return pid > 0 && version_of.count(pid) ? version_of[pid] : "none";
  }
  bool BothOn(const std::string& tag) { return VersionOf("a") == tag && VersionOf("b") == tag; }
  // Serving with two proven engines and no rollout in progress.
  bool Settled() {
    const json s = Status();
    if (s.value("state", "") != "serving" || s["rollout"].value("in_progress", true)) return false;
    int ready = 0;
    for (const auto& e : s["engines"]) ready += e.value("semantic_ready", false) && e.value("role", "") != "none";
    return ready == 2;
  }
  std::string Step() { return Status()["rollout"].value("step", ""); }

  // The ledger's rollouts once `pred` holds for them (the writer commits
  // off the loop).
  std::vector<RolloutRecord> Rollouts(const std::function<bool(const std::vector<RolloutRecord>&)>& pred) {
    std::vector<RolloutRecord> rows;
    Until(
        [&] {
          auto reader = LedgerReader::Open(rig->dir.Join("state/wsup.db"));
          if (!reader.ok()) return false;
          auto r = reader->Rollouts();
          if (!r.ok()) return false;
          rows = *r;
          return pred(rows);
        },
        10s);
    return rows;
  }
  std::vector<RecoveryRecord> Recoveries() {
    auto reader = LedgerReader::Open(rig->dir.Join("state/wsup.db"));
    REQUIRE(reader.ok());
    auto r = reader->Recoveries();
    REQUIRE(r.ok());
    return *r;
  }
};

int64_t StepAt(const RolloutRecord& row, const std::string& step) {
  const json steps = json::parse(row.steps_json);
  for (const auto& s : steps) {
    if (s.value("step", "") == step) return s.value("at_ms", int64_t{0});
  }
  return 0;
}

std::string Steps(const json& reply) {
  std::string out;
  for (const auto& s : reply["steps"]) out += s.value("step", "") + " ";
  return out;
}

TEST_CASE("rollout logic: a new version rolls standby first, and each slot's recovery row is dated when it was proven",
          "[logic][rollout]") {
  RollRig p;
  REQUIRE(p.Until([&] { return p.Settled(); }));
  REQUIRE(p.BothOn("v1"));
  const std::string old_active = p.Status().value("active", "");
  p.SetVersion("v2");
  const json r = p.Reload();
  INFO(r.dump(1));
  CHECK(r.value("outcome", "") == "done");
  REQUIRE(p.Until([&] { return p.Settled(); }));
  CHECK(p.BothOn("v2"));
  CHECK(p.Status().value("active", "") != old_active);

  // The new slot was promoted inside the transition that proved it: its
  // row is written then, not when it next becomes a standby.
  auto rows = p.Rollouts([](const auto& rs) { return !rs.empty() && rs.back().outcome == "done"; });
  REQUIRE(!rows.empty());
  const int64_t proven_new = StepAt(rows.back(), "swapping");
  const int64_t proven_old = StepAt(rows.back(), "done");
  REQUIRE(proven_new > 0);
  const std::string new_slot = old_active == "a" ? "b" : "a";
  std::map<std::string, int64_t> ready;
  for (const auto& rec : p.Recoveries()) {
    if (rec.cause == "rollout") ready[rec.slot] = rec.ready_ms;
  }
  INFO("new slot " << new_slot << " proven at " << proven_new << "; old slot proven at " << proven_old);
  REQUIRE(ready.count(new_slot));
  REQUIRE(ready.count(old_active));
  CHECK(std::llabs(ready[new_slot] - proven_new) <= 50);
  CHECK(std::llabs(ready[old_active] - proven_old) <= 50);
}

TEST_CASE("rollout logic: a new version that answers wrongly or refuses to run is rolled back - both slots on the old "
          "version, proven, the node serving",
          "[logic][rollout]") {
  const Body body = GENERATE(Body::kWrong, Body::kExit78);
  INFO((body == Body::kWrong ? "wrong answers" : "exit 78"));
  RollRig p;
  REQUIRE(p.Until([&] { return p.Settled(); }));
  const json before = p.Status();
  const std::string active = before.value("active", "");
  const int active_pid = p.Engine(active).value("pid", 0);
  p.bodies["v2"] = body;
  p.SetVersion("v2");
  const json r = p.Reload();
  INFO(r.dump(1));
  CHECK(r.value("outcome", "") == "rolled_back");
  CHECK(r.value("reason", "").find("failed") != std::string::npos);
  // When the reload answers, both slots run the old version and are proven:
  // the rolled slot was started again at once, not left to the restart
  // policy that the new version's exit would have exhausted.
  const json now = p.Status();
  INFO(now.dump(1));
  CHECK(now.value("state", "") == "serving");
  CHECK(p.BothOn("v1"));
  for (const auto& e : now["engines"]) {
    CHECK(e.value("semantic_ready", false));
    CHECK_FALSE(e.contains("failure"));
    CHECK(e.value("restarts", -1) == 0);
  }
  CHECK_FALSE(now.contains("degraded_reason"));
  // The old active was never stopped.
  CHECK(p.Engine(active).value("pid", 0) == active_pid);
  CHECK(Steps(r).find("restoring_new") != std::string::npos);
  // Later too: nothing restarts it on the new version, nothing degrades.
  p.rig->Advance(5000);
  CHECK(p.Until([&] { return p.Settled(); }));
  CHECK(p.BothOn("v1"));
  CHECK(p.Status().value("state", "") == "serving");
  // The node's version is the old one: a reload to it changes nothing.
  p.SetVersion("v1");
  CHECK(p.Reload().value("outcome", "") == "unchanged");
}

TEST_CASE("rollout logic: an engine killed in the watch window rolls the roll back - both slots on the old version",
          "[logic][rollout]") {
  const bool kill_old = GENERATE(true, false);
  INFO((kill_old ? "the old version's standby killed" : "the new active killed"));
  RollRig p;
  REQUIRE(p.Until([&] { return p.Settled(); }));
  const std::string old_slot = p.Status().value("active", "");
  const std::string new_slot = old_slot == "a" ? "b" : "a";
  p.SetVersion("v2");
  Call c;
  p.Send(c, json{{"type", "reload"}});
  REQUIRE(p.Until([&] { return p.Step() == "watching"; }));
  const pid_t victim = p.Engine(kill_old ? old_slot : new_slot).value("pid", 0);
  REQUIRE(victim > 0);
  p.rig->procs.Exit(victim, -1, SIGKILL);
  REQUIRE(p.Until([&] { return c.done.load(); }, 30s));
  c.thread.join();
  REQUIRE(c.reply);
  INFO(c.reply->dump(1));
  CHECK(c.reply->value("outcome", "") == "rolled_back");
  CHECK(c.reply->value("reason", "").find("engine " + std::string(kill_old ? old_slot : new_slot) + " failed") !=
        std::string::npos);
  const json now = p.Status();
  INFO(now.dump(1));
  CHECK(p.BothOn("v1"));
  CHECK(now.value("state", "") == "serving");
  // The old slot serves the old version again; the new version's process is gone.
  CHECK(now.value("active", "") == old_slot);
  for (const auto& [pid, tag] : p.version_of) {
    if (tag == "v2") CHECK_FALSE(p.rig->procs.Alive(pid));
  }
  if (kill_old) CHECK(Steps(*c.reply).find("swapping_back") != std::string::npos);
  REQUIRE(p.Until([&] { return p.Settled(); }));
  CHECK(p.BothOn("v1"));
  auto rows = p.Rollouts([](const auto& rs) { return !rs.empty() && rs.back().outcome == "rolled_back"; });
  REQUIRE(!rows.empty());
  CHECK(rows.back().outcome == "rolled_back");
}

TEST_CASE("rollout logic: a supervisor restarted during a roll ends its row as interrupted and leaves both slots on one "
          "version",
          "[logic][rollout]") {
  const std::string at = GENERATE("stopping_standby", "starting_new", "watching", "stopping_old", "starting_old",
                                  "restoring_old");
  // Finished when the new version was proven and serves; rolled back otherwise.
  const bool finishes = at == "watching" || at == "stopping_old" || at == "starting_old";
  INFO("restarted during " << at);
  RollRig p;
  REQUIRE(p.Until([&] { return p.Settled(); }));
  const std::string old_slot = p.Status().value("active", "");
  p.SetVersion("v2");
  if (at == "stopping_standby") p.rig->procs.term_is_slow = true;
  if (at == "starting_new") p.bodies["v2"] = Body::kHeld;
  Call c;
  p.Send(c, json{{"type", "reload"}});
  if (at == "stopping_old" || at == "starting_old" || at == "restoring_old") {
    REQUIRE(p.Until([&] { return p.Step() == "watching"; }));
    if (at == "stopping_old") p.rig->procs.term_is_slow = true;
    if (at == "starting_old") p.bodies["v2"] = Body::kHeld;
    if (at == "restoring_old") {
      // The old version's standby dies, and its restart is slow.
      p.bodies["v1"] = Body::kHeld;
      p.rig->procs.Exit(p.Engine(old_slot).value("pid", 0), -1, SIGKILL);
    }
  }
  REQUIRE(p.Until([&] { return p.Step() == at; }));
  if (at != "stopping_standby" && at != "stopping_old" && at != "watching") {
    REQUIRE(p.Until([&] { return !p.held.empty(); }));
  }
  // What is saved says the step (the file a restarted supervisor reads).
  const json saved = json::parse(test::ReadAll(p.rig->dir.Join("run/state.json")));
  REQUIRE(saved["rollout"].value("step", "") == at);

  p.rig->Restart();
  c.thread.join();  // the reload's connection closed with the old supervisor
  p.rig->procs.term_is_slow = false;
  p.bodies.clear();
  p.Release();
  const std::string want = finishes ? "v2" : "v1";
  const bool settled = p.Until([&] { return p.Settled() && p.BothOn(want); }, 30s);
  INFO(p.Status().dump(1));
  CHECK(settled);
  // Every row ended: the interrupted one, and the roll that finished it or
  // rolled it back.
  auto rows = p.Rollouts([](const auto& rs) {
    for (const auto& r : rs) {
      if (r.outcome == "running") return false;
    }
    return !rs.empty();
  });
  REQUIRE(!rows.empty());
  INFO("first row: " << rows.front().outcome << ": " << rows.front().reason);
  CHECK(rows.front().outcome == "interrupted");
  CHECK(rows.front().ended_ms.has_value());
  CHECK(rows.front().reason.find("restarted during step " + at) != std::string::npos);
  for (const auto& r : rows) {
    INFO("rollout #" << r.id << " " << r.outcome << ": " << r.reason);
    CHECK(r.outcome != "running");
    CHECK(r.outcome != "failed");
  }
  if (rows.size() > 1) CHECK(rows.back().outcome == (finishes ? "done" : "rolled_back"));
  // The next reload: nothing to do when the file's version runs; a roll
  // to it when the roll was rolled back.
  const json r = p.Reload();
  INFO(r.dump(1));
  CHECK(r.value("outcome", "") == (finishes ? "unchanged" : "done"));
  REQUIRE(p.Until([&] { return p.Settled(); }));
  CHECK(p.BothOn("v2"));
}

TEST_CASE("rollout logic: reload --set applies its overrides and keeps them, and a malformed one is refused",
          "[logic][rollout]") {
  RollRig p;
  REQUIRE(p.Until([&] { return p.Settled(); }));
  const json r = p.Reload(json{{"type", "reload"}, {"set", {"probe.failures=7"}}});
  INFO(r.dump(1));
  CHECK(r.value("outcome", "") == "applied");
  REQUIRE(r["changes"].size() == 1);
  CHECK(r["changes"][0].value("key", "") == "probe.failures");
  CHECK(r["changes"][0].value("where", "").rfind("--set:", 0) == 0);
  // Kept: a plain reload after it changes nothing.
  CHECK(p.Reload().value("outcome", "") == "unchanged");
  // A new engine version by --set rolls like one in the file.
  const json roll = p.Reload(json{{"type", "reload"}, {"set", {"engine.command=[\"" + p.rig->dir.Join("engine") +
                                                               "\", \"--port\", \"{port}\", \"--version\", \"v3\"]"}}});
  INFO(roll.dump(1));
  CHECK(roll.value("outcome", "") == "done");
  REQUIRE(p.Until([&] { return p.Settled(); }));
  CHECK(p.BothOn("v3"));
  for (const json& bad : {json{{"type", "reload"}, {"set", "probe.failures=7"}},
                          json{{"type", "reload"}, {"set", {1, 2}}}}) {
    const json e = p.Reload(bad);
    INFO(e.dump());
    CHECK(e.value("type", "") == "error");
    CHECK(e.value("message", "").find("send \"set\" as an array of \"section.key=value\" strings") != std::string::npos);
  }
}

}  // namespace
}  // namespace wsup
