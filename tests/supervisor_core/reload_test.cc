// Reloader (supervisor/reload.h) on its own: a node config in a temporary
// folder, rewritten between reloads, and fake slots, rollout and failover
// behind its hooks. Each test checks the caller's answer, what was applied
// to the running config, and what was handed on (a roll, a refused row).
#include <catch2/catch.hpp>

#include <optional>
#include <string>
#include <vector>

#include "common/fs.h"
#include "supervisor/reload.h"
#include "testkit/test_util.h"
#include "tests/supervisor_core/node_toml.h"

namespace wsup {
namespace {

using nlohmann::json;

const std::string kProbe = "prompt = \"Hello\"\nexpect = \" world\"\n";

std::string Replace(std::string text, const std::string& from, const std::string& to) {
  auto at = text.find(from);
  REQUIRE(at != std::string::npos);
  return text.replace(at, from.size(), to);
}

struct ReloadRig {
  test::TempDir dir;
  std::string path = dir.Join("node.toml");
  FakeClock clock;
  Config cfg;
  Reloader::Pair pair{"a", "b", SlotState::kStandby};
  std::string rollout_busy, failover_busy;
  bool stopping = false;
  std::vector<json> replies;
  std::vector<RolloutRecord> refused_rows;
  std::vector<bool> applied;  // probe_changed of each
  struct Roll {
    std::string standby, active, why;
    EngineVersion version;
  };
  std::optional<Roll> roll;
  std::unique_ptr<Reloader> reloader;

  ReloadRig() {
    Write(test::NodeToml(kProbe));
    auto c = LoadConfig(path);
    REQUIRE(c.ok());
    cfg = std::move(*c);
    Reloader::Hooks h;
    h.stopping = [this] { return stopping; };
    h.rollout_busy = [this] { return rollout_busy; };
    h.failover_busy = [this] { return failover_busy; };
    h.pair = [this] { return pair; };
    h.running = [] { return std::vector<SlotVersion>{}; };
    h.record_refused = [this](const RolloutRecord& rec) { refused_rows.push_back(rec); };
    h.applied = [this](bool probe_changed) { applied.push_back(probe_changed); };
    h.roll = [this](const std::string& standby, const std::string& active, const EngineVersion& v,
                    const std::string& why, const std::shared_ptr<JsonConn>&) { roll = Roll{standby, active, why, v}; };
    h.reply = [this](const std::shared_ptr<JsonConn>&, const json& reply) { replies.push_back(reply); };
    reloader = std::make_unique<Reloader>(cfg, clock, std::move(h));
  }
  void Write(const std::string& text) { REQUIRE(WriteFileAtomic(path, text).ok()); }
  json Reload(const std::vector<std::string>& sets = {}) {
    const size_t before = replies.size();
    reloader->Reload(nullptr, "test", sets);
    return replies.size() > before ? replies.back() : json();
  }
};

const std::string kNewCommand = "\"--port\", \"{port}\", \"--max-batch\", \"8\"]";

TEST_CASE("reloader: an unchanged file changes nothing, a probe setting applies at once", "[supervisor][reload]") {
  ReloadRig rig;
  json same = rig.Reload();
  CHECK(same["type"] == "reload");
  CHECK(same["outcome"] == "unchanged");
  CHECK(rig.applied.empty());

  rig.Write(test::NodeToml(kProbe + "interval_ms = 2345\n"));
  json r = rig.Reload();
  INFO(r.dump());
  CHECK(r["outcome"] == "applied");
  CHECK(r["changes"][0]["key"] == "probe.interval_ms");
  CHECK(rig.cfg.probe.interval_ms == 2345);
  REQUIRE(rig.applied.size() == 1);
  CHECK(rig.applied[0]);
  CHECK_FALSE(rig.roll);
}

TEST_CASE("reloader: a new engine command is handed to the rollout, standby first, the node's version waits for it",
          "[supervisor][reload]") {
  ReloadRig rig;
  const std::vector<std::string> before = rig.cfg.engine.command;
  rig.Write(Replace(test::NodeToml(kProbe), "\"--port\", \"{port}\"]", kNewCommand));
  json r = rig.Reload();
  CHECK(r.is_null());  // the rollout answers when it ends
  REQUIRE(rig.roll);
  CHECK(rig.roll->standby == "b");
  CHECK(rig.roll->active == "a");
  CHECK(rig.roll->version.command.back() == "8");
  CHECK(rig.cfg.engine.command == before);
}

TEST_CASE("reloader: a roll that cannot begin is refused whole, naming why and what to do", "[supervisor][reload]") {
  ReloadRig rig;
  // A probe change and a new command together: nothing is applied.
  rig.Write(Replace(test::NodeToml(kProbe + "interval_ms = 2345\n"), "\"--port\", \"{port}\"]", kNewCommand));
  const int64_t interval = rig.cfg.probe.interval_ms;

  rig.pair.standby_state = SlotState::kWarming;
  json unproven = rig.Reload();
  INFO(unproven.dump());
  CHECK(unproven["outcome"] == "refused");
  CHECK(unproven["error"].get<std::string>().find("the standby (b) is warming, not proven ready") == 0);
  CHECK(unproven["error"].get<std::string>().find("reload again once `wsup status` shows both engines") !=
        std::string::npos);
  CHECK(unproven["changes"].size() == 2);

  rig.pair = {"", "", SlotState::kIdle};
  CHECK(rig.Reload()["error"].get<std::string>().find("no active engine serves") == 0);

  rig.pair = {"a", "b", SlotState::kStandby};
  rig.failover_busy = "a failover from a to b is in progress";
  CHECK(rig.Reload()["error"].get<std::string>().find(rig.failover_busy) == 0);

  CHECK(rig.cfg.probe.interval_ms == interval);
  CHECK(rig.applied.empty());
  CHECK_FALSE(rig.roll);
}

TEST_CASE("reloader: refused while stopping, while a rollout runs, for a file that does not parse, and for a cold key",
          "[supervisor][reload]") {
  ReloadRig rig;
  rig.stopping = true;
  CHECK(rig.Reload()["error"] == "the node is stopping");
  rig.stopping = false;

  rig.rollout_busy = "a rollout is in progress (step swap, started 3 s ago)";
  json busy = rig.Reload();
  CHECK(busy["error"].get<std::string>().rfind(rig.rollout_busy + "; wait until `wsup status` shows it ended", 0) == 0);
  rig.rollout_busy.clear();

  rig.Write("[node\n");
  json bad = rig.Reload();
  INFO(bad.dump());
  CHECK(bad["outcome"] == "refused");
  CHECK(bad["error"].get<std::string>().find(rig.path) != std::string::npos);
  CHECK(rig.refused_rows.empty());

  // A cold key: refused at its place in the file, and the refusal is a row.
  rig.Write(Replace(test::NodeToml(kProbe), "127.0.0.1:8000", "127.0.0.1:8100"));
  json cold = rig.Reload();
  INFO(cold.dump());
  CHECK(cold["outcome"] == "refused");
  CHECK(cold["error"].get<std::string>().find("front.listen") != std::string::npos);
  REQUIRE(rig.refused_rows.size() == 1);
  CHECK(rig.refused_rows[0].outcome == "refused");
  CHECK(rig.refused_rows[0].reason == cold["error"]);
  CHECK(rig.cfg.front.listen.port == 8000);
  CHECK(rig.applied.empty());
}

TEST_CASE("reloader: `--set` values apply on top of the file and are kept for the next reload", "[supervisor][reload]") {
  ReloadRig rig;
  json r = rig.Reload({"probe.interval_ms=3456"});
  INFO(r.dump());
  CHECK(r["outcome"] == "applied");
  CHECK(rig.cfg.probe.interval_ms == 3456);
  // The next plain reload keeps it: nothing changed.
  CHECK(rig.Reload()["outcome"] == "unchanged");
  CHECK(rig.cfg.probe.interval_ms == 3456);
}

}  // namespace
}  // namespace wsup
