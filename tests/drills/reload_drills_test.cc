// Rolling upgrades on a real node under load (issue 16, acceptance 1):
// config/demo.toml copied into the test's folder with the tested build's
// engine command in its [engine] section, 8 clients (half streaming)
// through the front, and `wsup reload` after the test rewrites the file:
//   - a new engine version (an extra flag): both engines end on it, not one
//     request fails, is lost or wrong, every attach is a cache hit, and the
//     ledger has a `rollouts` row `done` with its steps;
//   - a version that answers wrongly (its own, corrupted, weights): rolled
//     back, the old active never stopped, not one request failed, a row
//     `rolled_back` whose reason names the probe;
//   - a changed model.path: refused at its line and column, the node
//     untouched;
//   - a reload while a roll runs: refused, saying so;
//   - a front setting: applied at once, nothing restarted;
//   - a new version that fails as the active engine in the watch window
//     (the test kills it): its crash fails over to the old version, and
//     the roll is rolled back;
//   - the old version's standby killed in the watch window: rolled back,
//     both slots on the old version (the old slot takes the traffic back);
//   - each rolled slot's recovery row is dated when it was proven (within
//     50 ms of its probe's verdict);
//   - `wsup reload --set` applies its override; a SIGHUP during a roll is
//     refused and logged.
// And a supervisor SIGKILLed during each step of a roll, then started
// again: every row ends, both slots run one version, the next reload does
// the right thing.
#include <catch2/catch.hpp>

#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>

#include <nlohmann/json.hpp>

#include "testkit/failover_drill.h"
#include "testkit/failover_load.h"
#include "state/report.h"
#include "testkit/http_client.h"
#include "tests/drills/drill_node.h"
#include "testkit/test_util.h"

namespace wsup {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

// demo.toml with its [engine] command replaced by `command` (a TOML array),
// its model path by `model`, and a rollout watch window of `watch_ms` (a
// short one keeps the test short; the roll still waits for it).
std::string DemoWith(const std::string& command, const std::string& model, int64_t watch_ms = 1000) {
  std::string text = test::ReadAll(std::string(WSUP_SOURCE_DIR) + "/config/demo.toml");
  const size_t at = text.find("\ncommand = [");
  REQUIRE(at != std::string::npos);
  const size_t end = text.find("]\n", at);
  REQUIRE(end != std::string::npos);
  text.replace(at + 1, end + 1 - (at + 1), "command = " + command);
  const size_t p = text.find("\npath = \"");
  REQUIRE(p != std::string::npos);
  const size_t pe = text.find('\n', p + 1);
  text.replace(p + 1, pe - (p + 1), "path = \"" + model + "\"");
  // [supervisor] is the file's last section.
  return text + "rollout_watch_ms = " + std::to_string(watch_ms) + "\n";
}

void Write(const std::string& path, const std::string& text) {
  // Written whole to a new name and renamed: the supervisor never reads half a file.
  std::ofstream(path + ".new") << text;
  std::filesystem::rename(path + ".new", path);
}

// A service manager's notification socket, as systemd's: every datagram
// the supervisor sends (READY=1, RELOADING=1, STATUS=...), read on a
// thread so the sender never finds the queue full.
class NotifyListener {
 public:
  explicit NotifyListener(const std::string& path) : path_(path) {
    fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd_ >= 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    REQUIRE(path.size() < sizeof(a.sun_path));
    std::memcpy(a.sun_path, path.c_str(), path.size() + 1);
    REQUIRE(::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    thread_ = std::thread([this] {
      char buf[4096];
      while (!stop_) {
        pollfd p{fd_, POLLIN, 0};
        if (::poll(&p, 1, 50) <= 0) continue;
        ssize_t n = ::recv(fd_, buf, sizeof buf, MSG_DONTWAIT);
        if (n <= 0) continue;
        std::lock_guard<std::mutex> lk(mu_);
        got_.emplace_back(buf, static_cast<size_t>(n));
      }
    });
  }
  ~NotifyListener() {
    stop_ = true;
    thread_.join();
    ::close(fd_);
  }
  std::vector<std::string> Messages() {
    std::lock_guard<std::mutex> lk(mu_);
    return got_;
  }

 private:
  std::string path_;
  int fd_ = -1;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::mutex mu_;
  std::vector<std::string> got_;
};

// The node's status once its rollout is at `step` and `also` holds of that
// status (nothing more when none), within 60 s; REQUIREs that it gets there.
json StatusAtStep(test::DrillNode& node, const std::string& step,
                  const std::function<bool(const json&)>& also = nullptr) {
  json at;
  REQUIRE(test::WaitFor(
      [&] {
        auto s = node.Status();
        if (!s || (*s)["rollout"].value("step", "") != step) return false;
        at = *s;
        return !also || also(at);
      },
      60s));
  return at;
}

// Index of the first message at or after `from` that contains `what`; -1 if none.
int Find(const std::vector<std::string>& m, const std::string& what, int from = 0) {
  for (int i = std::max(from, 0); i < static_cast<int>(m.size()); ++i) {
    if (m[static_cast<size_t>(i)].find(what) != std::string::npos) return i;
  }
  return -1;
}

struct Totals {
  int64_t requests = 0, ok = 0, not_ok = 0;
  std::string examples;
};
Totals Count(const std::vector<test::RequestRecord>& records) {
  Totals t;
  for (const auto& r : records) {
    if (r.client < 0) continue;  // the prober
    ++t.requests;
    if (r.outcome == test::Outcome::kOk) {
      ++t.ok;
    } else {
      ++t.not_ok;
      if (t.examples.size() < 2000) t.examples += std::string(test::OutcomeName(r.outcome)) + ": " + r.detail + "\n";
    }
  }
  return t;
}

TEST_CASE("reload: a new engine version rolls standby first under load, a wrong one rolls back, cold keys are refused",
          "[drills][reload]") {
  if (test::SkipWithout("llama-tiny-f32")) return;
  const std::vector<test::GoldenCase> golden = test::DrillGolden("llama-tiny-f32");
  test::TempDir files;
  const std::string cfg = files.Join("node.toml");
  const std::string model = test::TestData("llama-tiny-f32");
  Write(cfg, DemoWith(test::EngineCommandToml(true), model));
  test::DrillNodeSpec spec;
  spec.config_file = cfg;
  spec.command_in_file = true;
  // What systemd would be told (Type=notify, ExecReload=wsup reload).
  NotifyListener notify(files.Join("notify.sock"));
  spec.env = {{"NOTIFY_SOCKET", files.Join("notify.sock")}};
  test::DrillNode node(spec);
  node.Start();
  INFO(node.Log());
  REQUIRE(node.WaitServing());

  test::LoadGenerator load(test::DrillLoad(node, 8), golden);
  load.Start();
  REQUIRE(test::WaitFor([&] { return load.completed() >= 16; }, 60s));

  // 1. A new version: both engines end on it.
  const int64_t t_roll = std::chrono::duration_cast<std::chrono::milliseconds>(
                             std::chrono::system_clock::now().time_since_epoch()).count();
  Write(cfg, DemoWith(test::EngineCommandToml(true, {"--max-batch", "16"}), model));
  auto r = node.Cli({"reload", "--json"});
  INFO(r.output << node.LogTails());
  REQUIRE(r.exit_code == 0);
  json done = json::parse(r.output);
  CHECK(done.value("outcome", "") == "done");
  CHECK(done["steps"].size() >= 7);
  REQUIRE(node.WaitServing());
  auto st = node.Status();
  REQUIRE(st);
  for (const auto& e : (*st)["engines"]) {
    INFO(e.dump());
    CHECK(e.value("version", "").find("--max-batch") != std::string::npos);
  }
  CHECK((*st)["rollout"]["last"].value("outcome", "") == "done");
  {
    // Each rolled slot's recovery row is dated when it was proven: its
    // probe's verdict, not the next time it became a standby.
    auto reader = LedgerReader::Open(node.dir().Join("state/wsup.db"));
    REQUIRE(reader.ok());
    std::vector<RecoveryRecord> recs;
    CHECK(test::WaitFor(
        [&] {
          auto r = reader->Recoveries(t_roll);
          if (!r.ok()) return false;
          recs.clear();
          for (const auto& rec : *r) {
            if (rec.cause == "rollout") recs.push_back(rec);
          }
          return recs.size() == 2;
        },
        10s));
    auto verdicts = reader->ProbeTransitions(t_roll);
    REQUIRE(verdicts.ok());
    for (const auto& rec : recs) {
      int64_t proven = 0;
      for (const auto& v : *verdicts) {
        if (v.slot == rec.slot && v.to_state == "healthy" && v.time_ms <= rec.ready_ms + 50) proven = v.time_ms;
      }
      INFO("slot " << rec.slot << " ready_ms " << rec.ready_ms << ", proven at " << proven);
      CHECK(proven > 0);
      CHECK(std::llabs(rec.ready_ms - proven) <= 50);
    }
  }
  {
    // The unit went active, then reloading, then active again once the
    // roll was done.
    auto m = notify.Messages();
    const int ready = Find(m, "READY=1");
    const int reloading = Find(m, "RELOADING=1", ready + 1);
    const int back = Find(m, "READY=1", reloading + 1);
    INFO(json(m).dump(1));
    CHECK(ready >= 0);
    CHECK(reloading > ready);
    if (reloading >= 0) CHECK(m[static_cast<size_t>(reloading)].find("MONOTONIC_USEC=") != std::string::npos);
    CHECK(back > reloading);
    if (back >= 0) CHECK(m[static_cast<size_t>(back)].find("rollout done") != std::string::npos);
  }

  // 1b. A setting that needs no restart: applied at once, the front told.
  {
    std::string text = DemoWith(test::EngineCommandToml(true, {"--max-batch", "16"}), model);
    const size_t q = text.find("queue_timeout_ms = 10000");
    REQUIRE(q != std::string::npos);
    Write(cfg, text.replace(q, 24, "queue_timeout_ms = 20000"));
    auto at_once = node.Cli({"reload", "--json"});
    INFO(at_once.output);
    CHECK(at_once.exit_code == 0);
    json j = json::parse(at_once.output);
    CHECK(j.value("outcome", "") == "applied");
    REQUIRE(j["changes"].size() == 1);
    CHECK(j["changes"][0].value("key", "") == "front.queue_timeout_ms");
    CHECK(j["changes"][0].value("effect", "") == "at_once");
    CHECK(test::WaitFor(
        [&] {
          return test::ReadAll(node.dir().Join("state/logs/front.log")).find("queue timeout 20000 ms") !=
                 std::string::npos;
        },
        10s));
    // An override given to reload applies as one in the file would.
    auto set = node.Cli({"reload", "--set", "probe.successes=1", "--json"});
    INFO(set.output);
    CHECK(set.exit_code == 0);
    json sj = json::parse(set.output);
    CHECK(sj.value("outcome", "") == "applied");
    CHECK(sj["changes"].dump().find("\"key\":\"probe.successes\"") != std::string::npos);
  }

  // 1c. A new version that fails as the active engine within the watch
  // window (the test kills it there): its crash fails over to the old
  // version, still the standby, and the roll is rolled back.
  {
    Write(cfg, DemoWith(test::EngineCommandToml(true, {"--max-batch", "12"}), model, 120'000));
    auto rolling = std::async(std::launch::async, [&] { return node.Cli({"reload", "--json"}); });
    json watching = StatusAtStep(node, "watching");
    const json fresh = test::EngineOf(watching, "active");
    INFO(fresh.dump());
    REQUIRE(fresh.value("version", "").find("\"12\"") != std::string::npos);
    REQUIRE(::kill(fresh.value("pid", 0), SIGKILL) == 0);
    auto out = rolling.get();
    INFO(out.output);
    CHECK(out.exit_code == 1);
    json j = json::parse(out.output);
    CHECK(j.value("outcome", "") == "rolled_back");
    CHECK(j.value("reason", "").find("engine " + fresh.value("slot", "") + " failed") != std::string::npos);
    REQUIRE(node.WaitServing());
    // Both on the old version again: the promoted old standby, and the
    // killed slot restarted with it.
    REQUIRE(test::WaitFor(
        [&] {
          auto s = node.Status();
          if (!s) return false;
          for (const auto& e : (*s)["engines"]) {
            const std::string v = e.value("version", "");
            if (v.find("\"16\"") == std::string::npos || !e.value("semantic_ready", false)) return false;
          }
          // The crash's failover ends with a correct answer through the
          // front; a reload before that is refused (it says so).
          return !(*s)["failover"].value("in_progress", true);
        },
        60s));
    // The crash went to the old version's engine at once, whether its
    // drain had ended or not (the kill may land before it does).
    auto fo = LedgerReader::Open(node.dir().Join("state/wsup.db"));
    REQUIRE(fo.ok());
    auto rows = fo->Failovers();
    REQUIRE(rows.ok());
    REQUIRE(!rows->empty());
    const FailoverRecord& crash = rows->back();
    INFO(crash.reason);
    // The logs as they are now (an INFO captures its text when it runs).
    INFO(node.LogTails(300));
    CHECK(crash.trigger == "crash");
    CHECK(crash.from_slot == fresh.value("slot", ""));
    CHECK(crash.to_slot != "none");
    CHECK(crash.to_slot != fresh.value("slot", ""));
  }

  // 1d. The old version's standby killed in the watch window: rolled
  // back, and both slots run the old version again (it comes back, takes
  // the traffic back, then the new slot is replaced).
  {
    st = node.Status();
    REQUIRE(st);
    const std::string old_slot = test::EngineOf(*st, "active").value("slot", "");
    Write(cfg, DemoWith(test::EngineCommandToml(true, {"--max-batch", "10"}), model, 120'000));
    auto rolling = std::async(std::launch::async, [&] { return node.Cli({"reload", "--json"}); });
    json watching =
        StatusAtStep(node, "watching", [](const json& s) { return test::EngineOf(s, "standby").is_object(); });
    const json old_standby = test::EngineOf(watching, "standby");
    INFO(watching.dump());
    REQUIRE(old_standby.value("slot", "") == old_slot);
    REQUIRE(old_standby.value("version", "").find("\"16\"") != std::string::npos);
    REQUIRE(::kill(old_standby.value("pid", 0), SIGKILL) == 0);
    auto out = rolling.get();
    INFO(out.output << node.LogTails(200));
    CHECK(out.exit_code == 1);
    json j = json::parse(out.output);
    CHECK(j.value("outcome", "") == "rolled_back");
    CHECK(j.value("reason", "").find("engine " + old_slot + " failed") != std::string::npos);
    // When the reload answers, both engines run the old version, proven,
    // and the old slot serves.
    auto now = node.Status();
    REQUIRE(now);
    INFO(now->dump());
    CHECK(now->value("state", "") == "serving");
    CHECK(now->value("active", "") == old_slot);
    for (const auto& e : (*now)["engines"]) {
      CHECK(e.value("version", "").find("\"16\"") != std::string::npos);
      CHECK(e.value("semantic_ready", false));
    }
    REQUIRE(test::WaitFor(
        [&] {
          auto s = node.Status();
          return s && !(*s)["failover"].value("in_progress", true);
        },
        60s));
    REQUIRE(node.WaitServing());
  }

  // 2. A version that answers wrongly: its own weights, corrupted.
  test::TempDir bad;
  for (const auto& f : std::filesystem::directory_iterator(model)) {
    std::filesystem::copy_file(f.path(), bad.Join(f.path().filename()));
  }
  {
    std::fstream fs(bad.Join("model.safetensors"), std::ios::in | std::ios::out | std::ios::binary);
    fs.seekp(-4096, std::ios::end);
    std::string junk(2048, '\x7f');
    fs.write(junk.data(), static_cast<std::streamsize>(junk.size()));
  }
  // The active engine as this case begins (case 1c moved the traffic).
  st = node.Status();
  REQUIRE(st);
  const json active_before = test::EngineOf(*st, "active");
  const std::string wrong = "[\"" + test::BinPath("wsup-engine") + "\", \"--model\", \"" + bad.path() +
                            "\", \"--port\", \"{port}\", \"--weight-cache\", \"off\", \"--kv-cache-mib\", \"8\"]";
  Write(cfg, DemoWith(wrong, model));
  auto back = node.Cli({"reload", "--json"});
  INFO(back.output << node.LogTails(200));
  CHECK(back.exit_code == 1);
  json rb = json::parse(back.output);
  CHECK(rb.value("outcome", "") == "rolled_back");
  CHECK(rb.value("reason", "").find("probe") != std::string::npos);
  // When the reload answers, the rolled slot is back on the old version,
  // proven, and the node serves (not left failed with the wrong version).
  st = node.Status();
  REQUIRE(st);
  CHECK(st->value("state", "") == "serving");
  for (const auto& e : (*st)["engines"]) {
    INFO(e.dump());
    CHECK(e.value("semantic_ready", false));
    CHECK(e.value("version", "").find("--max-batch") != std::string::npos);
    CHECK_FALSE(e.contains("failure"));
  }
  REQUIRE(node.WaitServing());
  st = node.Status();
  REQUIRE(st);
  // The old active never stopped: the same process serves.
  if (test::EngineOf(*st, "active").value("pid", 0) != active_before.value("pid", -1)) {
    FAIL_CHECK("the active engine changed during a rolled-back reload: " << active_before.dump() << " before, "
                                                                          << st->dump() << " after\n"
                                                                          << node.LogTails(120));
  }
  for (const auto& e : (*st)["engines"]) {
    INFO(e.dump());
    CHECK(e.value("version", "").find("--max-batch") != std::string::npos);
  }

  // 3. A cold key: refused at its place in the file, nothing touched.
  std::string moved = DemoWith(test::EngineCommandToml(true, {"--max-batch", "16"}), model + "-elsewhere");
  Write(cfg, moved);
  auto cold = node.Cli({"reload"});
  INFO(cold.output);
  CHECK(cold.exit_code == 1);
  CHECK(cold.output.find(cfg + ":") != std::string::npos);
  CHECK(cold.output.find(": model.path: cannot change while the node runs") != std::string::npos);
  auto after_cold = node.Status();
  REQUIRE(after_cold);
  for (const char* role : {"active", "standby"}) {
    const json was = test::EngineOf(*st, role), now = test::EngineOf(*after_cold, role);
    if (!was.is_object() || !now.is_object() || now.value("pid", 0) != was.value("pid", -1)) {
      FAIL_CHECK("the " << role << " engine changed during a refused reload: " << st->dump() << " before, "
                        << after_cold->dump() << " after\n"
                        << node.LogTails(120));
    }
  }

  // 4. Two at once: the second is refused while the first runs.
  Write(cfg, DemoWith(test::EngineCommandToml(true, {"--max-batch", "8"}), model));
  auto first = std::async(std::launch::async, [&] { return node.Cli({"reload", "--json"}); });
  REQUIRE(test::WaitFor(
      [&] {
        auto s = node.Status();
        return s && (*s)["rollout"].value("in_progress", false);
      },
      30s));
  auto second = node.Cli({"reload"});
  INFO(second.output);
  CHECK(second.exit_code == 1);
  CHECK(second.output.find("a rollout is in progress") != std::string::npos);
  // systemd's reload (SIGHUP) has no one to answer: its refusal is logged.
  REQUIRE(::kill(node.sup().pid(), SIGHUP) == 0);
  CHECK(test::WaitFor(
      [&] { return node.Log().find("reload (SIGHUP) refused: a rollout is in progress") != std::string::npos; }, 10s));
  auto first_done = first.get();
  INFO(first_done.output);
  CHECK(first_done.exit_code == 0);
  REQUIRE(node.WaitServing());

  load.Stop();
  Totals t = Count(load.records());
  INFO(t.examples << node.LogTails());
  CHECK(t.requests > 0);
  CHECK(t.not_ok == 0);
  CHECK(t.ok == t.requests);

  // The ledger: every attach since the first reload a hit, and the rows.
  auto reader = LedgerReader::Open(node.dir().Join("state/wsup.db"));
  REQUIRE(reader.ok());
  auto events = reader->CacheEvents(t_roll);
  REQUIRE(events.ok());
  int attaches = 0;
  for (const auto& e : *events) {
    if (e.mode == "off") continue;  // the wrong version loads its own weights
    INFO("cache event " << e.id << " slot " << e.slot << " " << e.result);
    CHECK(e.result == "hit");
    ++attaches;
  }
  CHECK(attaches >= 4);
  auto rolls = reader->Rollouts();
  REQUIRE(rolls.ok());
  std::vector<std::string> outcomes;
  for (const auto& ro : *rolls) outcomes.push_back(ro.outcome);
  CHECK(outcomes == std::vector<std::string>{"done", "rolled_back", "rolled_back", "rolled_back", "refused", "done"});
  REQUIRE(rolls->size() == 6);
  CHECK((*rolls)[0].command_after.find("--max-batch") != std::string::npos);
  CHECK((*rolls)[0].command_before.find("--max-batch") == std::string::npos);
  CHECK((*rolls)[1].reason.find("failed") != std::string::npos);
  CHECK((*rolls)[2].reason.find("failed") != std::string::npos);
  CHECK((*rolls)[3].reason.find("probe") != std::string::npos);
  CHECK((*rolls)[4].reason.find("model.path") != std::string::npos);
  auto rep = node.Cli({"report"});
  CHECK(rep.output.find("rollouts: 6") != std::string::npos);
}

// The engine's command line as the kernel has it: what the slot really runs.
std::string CmdLine(int pid) {
  std::string s = test::ReadAll("/proc/" + std::to_string(pid) + "/cmdline");
  for (char& ch : s) {
    if (ch == '\0') ch = ' ';
  }
  return s;
}

TEST_CASE("reload: the supervisor SIGKILLed during each step of a roll - every row ends, both slots run one version, "
          "the next reload does the right thing",
          "[drills][reload]") {
  if (test::SkipWithout("llama-tiny-f32")) return;
  test::TempDir files;
  const std::string cfg = files.Join("node.toml");
  const std::string model = test::TestData("llama-tiny-f32");
  // Every version decodes at 20 ms a step, so that a stream of 300 tokens
  // keeps an engine draining for seconds; each has its own --max-batch.
  auto version = [&](const std::string& batch, int64_t watch_ms = 1000) {
    std::vector<std::string> args = {"--min-step-ms", "20"};
    if (!batch.empty()) args.insert(args.end(), {"--max-batch", batch});
    Write(cfg, DemoWith(test::EngineCommandToml(true, args), model, watch_ms));
  };
  version("");
  test::DrillNodeSpec spec;
  spec.config_file = cfg;
  spec.command_in_file = true;
  test::DrillNode node(spec);
  node.Start();
  INFO(node.LogTails(60));
  REQUIRE(node.WaitServing());

  // Both engines run `batch` ("": the first version), proven, and no roll runs.
  auto settled_on = [&](const std::string& batch) {
    return test::WaitFor(
        [&] {
          auto s = node.Status();
          if (!s || s->value("state", "") != "serving" || (*s)["rollout"].value("in_progress", true)) return false;
          for (const auto& e : (*s)["engines"]) {
            const int pid = e.value("pid", 0);
            if (pid <= 0 || !e.value("semantic_ready", false)) return false;
            const std::string cl = CmdLine(pid);
            const bool runs = batch.empty() ? cl.find("--max-batch") == std::string::npos
                                            : cl.find("--max-batch " + batch + " ") != std::string::npos;
            if (!runs) return false;
          }
          return true;
        },
        120s);
  };
  auto wait_step = [&](const std::string& step) {
    return test::WaitFor(
        [&] {
          auto s = node.Status();
          return s && (*s)["rollout"].value("step", "") == step;
        },
        60s);
  };
  // The supervisor dies at once; the step it saved is the one the test meant.
  auto kill_supervisor = [&](const std::string& step) {
    node.sup().Kill(SIGKILL);
    REQUIRE(node.sup().Wait(10s) >= 0);
    const json saved = json::parse(test::ReadAll(node.dir().Join("run/state.json")));
    INFO(saved.dump(1));
    REQUIRE(saved["rollout"].value("step", "") == step);
  };
  auto reload = [&](const std::string& outcome) {
    auto r = node.Cli({"reload", "--json"});
    INFO(r.output << node.LogTails(100));
    REQUIRE(!r.output.empty());
    CHECK(json::parse(r.output).value("outcome", "") == outcome);
  };

  // stopping_standby (a stopped standby keeps the step open): not proven,
  // rolled back; the next reload rolls to the file's version.
  {
    auto s = node.Status();
    REQUIRE(s);
    const int standby = test::EngineOf(*s, "standby").value("pid", 0);
    REQUIRE(::kill(standby, SIGSTOP) == 0);
    version("16");
    auto cut = std::async(std::launch::async, [&] { return node.Cli({"reload"}); });
    REQUIRE(wait_step("stopping_standby"));
    kill_supervisor("stopping_standby");
    cut.get();
    node.Start();
    CHECK(settled_on(""));
    reload("done");
    CHECK(settled_on("16"));
  }
  // starting_new (the new engine stopped before its proof): rolled back.
  {
    version("12");
    auto cut = std::async(std::launch::async, [&] { return node.Cli({"reload"}); });
    int fresh = 0;
    StatusAtStep(node, "starting_new", [&](const json& s) {
      const std::string slot = s["rollout"].value("new_slot", "");
      for (const auto& e : s["engines"]) {
        if (e.value("slot", "") == slot) fresh = e.value("pid", 0);
      }
      return fresh > 0;
    });
    REQUIRE(::kill(fresh, SIGSTOP) == 0);
    kill_supervisor("starting_new");
    cut.get();
    node.Start();
    CHECK(settled_on("16"));
    reload("done");
    CHECK(settled_on("12"));
  }
  // swapping (the old engine drains long streams): the new version was
  // proven and serves, so the roll is finished; the next reload has
  // nothing to do.
  {
    std::vector<std::future<test::HttpResult>> streams;
    const int port = node.FrontPort();
    const std::string body =
        json{{"prompt", "Hello, world"}, {"max_tokens", 300}, {"temperature", 0}, {"stream", true}}.dump();
    for (int i = 0; i < 4; ++i) {
      streams.push_back(std::async(std::launch::async, [port, body] {
        return test::HttpRequestOnce(port, "POST", "/v1/completions", body, 60s,
                                     {{"Content-Type", "application/json"}});
      }));
    }
    version("10");
    auto cut = std::async(std::launch::async, [&] { return node.Cli({"reload"}); });
    REQUIRE(wait_step("swapping"));
    kill_supervisor("swapping");
    cut.get();
    node.Start();
    CHECK(settled_on("10"));
    reload("unchanged");
    for (auto& f : streams) f.get();
  }
  // watching (a long window): finished the same way, with the window the
  // file has when the supervisor starts again.
  {
    version("9", 120'000);
    auto cut = std::async(std::launch::async, [&] { return node.Cli({"reload"}); });
    REQUIRE(wait_step("watching"));
    kill_supervisor("watching");
    cut.get();
    version("9");
    node.Start();
    CHECK(settled_on("9"));
    reload("unchanged");
  }

  // Every row ended: each cut roll interrupted, then the roll that rolled
  // to the file's version or finished the cut one.
  auto reader = LedgerReader::Open(node.dir().Join("state/wsup.db"));
  REQUIRE(reader.ok());
  auto rolls = reader->Rollouts();
  REQUIRE(rolls.ok());
  std::vector<std::string> outcomes;
  for (const auto& ro : *rolls) {
    INFO("rollout #" << ro.id << " " << ro.outcome << ": " << ro.reason);
    CHECK(ro.ended_ms.has_value());
    outcomes.push_back(ro.outcome);
  }
  CHECK(outcomes == std::vector<std::string>{"interrupted", "done", "interrupted", "done", "interrupted", "done",
                                             "interrupted", "done"});
  auto rep = node.Cli({"report"});
  CHECK(rep.output.find("rollouts: 8") != std::string::npos);
  CHECK(rep.output.find(" interrupted") != std::string::npos);
}

}  // namespace
}  // namespace wsup
