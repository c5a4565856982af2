// End-to-end tests of a node: the real `wsup start` with the real holder,
// engines and front on the tiny checkpoint, on the CPU. Each test starts its
// own node in a temporary directory with kernel-chosen ports, drives it with
// signals and the CLI, and checks what clients see and what the ledger says.
#include <catch2/catch.hpp>
#include <signal.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "client/client.h"
#include "testkit/http_client.h"
#include "tests/node/node_fixture.h"
#include "testkit/test_util.h"
#include "wire/json_call.h"

namespace wsup {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;
using namespace nodetest;


TEST_CASE("node: serves correct completions through the front with a proven standby", "[node]") {
  if (!Have()) return;
  REQUIRE(GoldenIds() == kGolden);
  Node n;
  n.Start();
  REQUIRE(n.WaitServing());
  auto s = *n.Status();
  CHECK(s["engines"].size() == 2);
  CHECK(!test::EngineOf(s, "active").is_null());
  CHECK(test::EngineOf(s, "standby").value("semantic_ready", false));
  CHECK(s["holders"].size() == 1);
  CHECK(s["holders"][0].value("kept_fds", 0) >= 1);
  CHECK(Complete(n.FrontPort()) == kGolden);
  auto status = n.Cli({"status", "--json"});
  CHECK(status.exit_code == 0);
  auto sj = json::parse(status.output);
  for (const char* k : {"state", "active", "engines", "holders", "front"}) CHECK(sj.contains(k));
  for (const auto& e : sj["engines"]) {
    for (const char* k : {"slot", "role", "pid", "port", "semantic_ready", "comm_warm"}) CHECK(e.contains(k));
  }
  // Both engines attached to the holder: two cache hits.
  REQUIRE(test::WaitFor([&] { return Query(n.Db(), "select * from cache_events where result='hit'").rows.size() == 2; }, 5s));
}

TEST_CASE("node: an engine that announces readiness on {ready_fd} is not polled while it loads", "[node]") {
  if (!Have()) return;
  std::string eng = test::BinPath("wsup-engine");
  Node n({"engine.command=[\"" + eng +
          "\", \"--model\", \"{model}\", \"--port\", \"{port}\", \"--weight-cache\", \"{mode}\", \"--socket\", "
          "\"{socket}\", \"--device\", \"{devices}\", \"--revision\", \"{revision}\", \"--kv-cache-mib\", \"8\", \"--ready-fd\", \"{ready_fd}\"]"});
  n.Start();
  bool serving = n.WaitServing(30s);
  std::string log = n.Log();
  INFO(log);
  REQUIRE(serving);
  CHECK(log.find("engine a: announced readiness: listening on") != std::string::npos);
  CHECK(log.find("engine b: announced readiness: listening on") != std::string::npos);
  CHECK(Complete(n.FrontPort()) == kGolden);
}

TEST_CASE("node: SIGKILL of the active engine fails over, records it, and re-arms from the holder", "[node]") {
  if (!Have()) return;
  Node n;
  n.Start();
  REQUIRE(n.WaitServing());
  int port = n.FrontPort();
  auto s = *n.Status();
  auto active = test::EngineOf(s, "active");
  std::string from = active.value("slot", "");
  pid_t pid = active.value("pid", 0);
  REQUIRE(pid > 0);
  REQUIRE(::kill(pid, SIGKILL) == 0);
  // The front serves from the standby.
  CHECK(Complete(port) == kGolden);
  REQUIRE(test::WaitFor([&] { return Query(n.Db(), "select * from failovers").rows.size() == 1; }, 10s));
  auto f = Query(n.Db(), "select * from failovers").rows[0];
  CHECK(f["trigger"] == "crash");
  CHECK(f["from_slot"] == from);
  CHECK(f["to_slot"] != from);
  CHECK(std::stoll(f["detected_ms"]) >= std::stoll(f["fault_ms"]));
  CHECK(std::stoll(f["swapped_ms"]) >= std::stoll(f["detected_ms"]));
  REQUIRE(test::WaitFor([&] { return !Query(n.Db(), "select first_ok_ms from failovers where first_ok_ms is not null").rows.empty(); }, 10s));
  // Re-armed: a new engine in the failed slot, proven, from the holder (a hit).
  REQUIRE(n.WaitServing());
  REQUIRE(test::WaitFor([&] { return Query(n.Db(), "select * from cache_events where result='hit'").rows.size() == 3; }, 10s));
  REQUIRE(test::WaitFor([&] { return !Query(n.Db(), "select * from recoveries where failover_id is not null").rows.empty(); }, 10s));
  auto rec = Query(n.Db(), "select * from recoveries where failover_id is not null").rows[0];
  CHECK(rec["cache_result"] == "hit");
  CHECK(rec["slot"] == from);
}

TEST_CASE("node: a hung (SIGSTOPped) active engine is failed over within interval x failures + timeout", "[node]") {
  if (!Have()) return;
  Node n;
  n.Start();
  REQUIRE(n.WaitServing());
  auto active = test::EngineOf(*n.Status(), "active");
  pid_t pid = active.value("pid", 0);
  auto t0 = std::chrono::steady_clock::now();
  REQUIRE(::kill(pid, SIGSTOP) == 0);
  REQUIRE(test::WaitFor([&] { return Query(n.Db(), "select * from failovers").rows.size() == 1; }, 15s));
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
  auto f = Query(n.Db(), "select * from failovers").rows[0];
  CHECK(f["trigger"] == "hang");  // its probes timed out: a hang, not a wrong answer
  // interval x 3 failures + timeout; the margin covers a probe already in
  // flight and a loaded CI machine.
  INFO("stop to failover row: " << ms << " ms; detect " << f["detect_ms"]);
  CHECK(ms < kProbeMs * 4 + 1400 + kProbeMs * 4);
  CHECK(Complete(n.FrontPort()) == kGolden);
  ::kill(pid, SIGCONT);
}

TEST_CASE("node: an engine on a corrupted checkpoint is never promoted", "[node]") {
  if (!Have()) return;
  // A copy of the checkpoint with one tensor's bytes altered.
  test::TempDir bad;
  std::string src = test::TestData("llama-tiny-f32");
  for (const auto& f : std::filesystem::directory_iterator(src)) {
    std::filesystem::copy_file(f.path(), bad.Join(f.path().filename()));
  }
  {
    std::fstream fs(bad.Join("model.safetensors"), std::ios::in | std::ios::out | std::ios::binary);
    fs.seekp(-4096, std::ios::end);
    std::string junk(2048, '\x7f');
    fs.write(junk.data(), static_cast<std::streamsize>(junk.size()));
  }
  Node n({"engine.ready_timeout_ms=20000"}, bad.path());
  n.Start();
  // Both engines come up and answer, wrongly: neither is ever promoted.
  REQUIRE(n.WaitStatus(
      [](const json& s) {
        int failed = 0;
        for (const auto& e : s["engines"]) failed += e.value("restarts", 0) >= 1;
        return failed >= 1;
      },
      20s));
  auto s = *n.Status();
  CHECK(s["active"].is_null());
  CHECK(s.value("state", "") != "serving");
  CHECK(n.Log().find("wrong answer") != std::string::npos);
}

TEST_CASE("node: SIGKILL of the holder: engines keep answering, the holder returns from kept fds", "[node]") {
  if (!Have()) return;
  Node n;
  n.Start();
  REQUIRE(n.WaitServing());
  auto s = *n.Status();
  pid_t hpid = s["holders"][0].value("pid", 0);
  REQUIRE(hpid > 0);
  REQUIRE(::kill(hpid, SIGKILL) == 0);
  CHECK(Complete(n.FrontPort()) == kGolden);
  REQUIRE(test::WaitFor([&] { return Query(n.Db(), "select * from holder_restarts").rows.size() == 1; }, 10s));
  auto hr = Query(n.Db(), "select * from holder_restarts").rows[0];
  CHECK(hr["from_fds"] == "1");
  REQUIRE(n.WaitStatus([&](const json& s) { return s["holders"][0].value("pid", 0) != hpid &&
                                                   s["holders"][0].value("pid", 0) > 0; }, 10s));
  CHECK(test::ReadAll(n.dir().Join("state/logs/holder-0.log")).find("adopt") != std::string::npos);
  // The next re-arm attaches to the restarted holder: a cache hit.
  auto standby = test::EngineOf(*n.Status(), "standby");
  REQUIRE(::kill(standby.value("pid", 0), SIGKILL) == 0);
  REQUIRE(test::WaitFor([&] { return Query(n.Db(), "select * from cache_events where result='hit'").rows.size() == 3; }, 15s));
  CHECK(Complete(n.FrontPort()) == kGolden);
}

TEST_CASE("node: kv.pool_mib - the supervisor keeps the holder's KV pool, and a SIGKILLed holder comes back "
          "serving the same pool",
          "[node][kv]") {
  if (!Have()) return;
  Node n({"kv.pool_mib=8"});
  n.Start();
  REQUIRE(n.WaitServing());
  // The pool's id, once the supervisor has kept it.
  auto kept_id = [&](const json& s) -> std::string {
    const json& h = s["holders"][0];
    if (!h.contains("kv_pool") || !h["kv_pool"].is_object()) return "";
    return h["kv_pool"].value("id", "");
  };
  std::string id;
  REQUIRE(n.WaitStatus([&](const json& s) { return !(id = kept_id(s)).empty(); }, 10s));
  auto s = *n.Status();
  CHECK(s["holders"][0]["kv_pool"].value("bytes", uint64_t{0}) == 8u << 20);
  const std::string socket = s["holders"][0].value("socket", "");
  auto info = QueryHolderInfo(socket, 5000);
  REQUIRE(info.ok());
  REQUIRE(info->kv_pool.has_value());
  CHECK(info->kv_pool->id == id);
  CHECK_FALSE(info->kv_pool->adopted);

  pid_t hpid = s["holders"][0].value("pid", 0);
  REQUIRE(hpid > 0);
  REQUIRE(::kill(hpid, SIGKILL) == 0);
  CHECK(Complete(n.FrontPort()) == kGolden);  // engines keep serving
  // A new holder, ready, serving the kept pool under its id.
  REQUIRE(n.WaitStatus(
      [&](const json& st) {
        const json& h = st["holders"][0];
        return h.value("pid", 0) != hpid && h.value("pid", 0) > 0 && h.value("ready", false) &&
               n.Log().find("serves the kept KV pool " + id + " again") != std::string::npos;
      },
      15s));
  CHECK(kept_id(*n.Status()) == id);
  auto again = QueryHolderInfo(socket, 5000);
  REQUIRE(again.ok());
  REQUIRE(again->kv_pool.has_value());
  CHECK(again->kv_pool->id == id);
  CHECK(again->kv_pool->adopted);
  CHECK(again->kv_pool->bytes == 8u << 20);
  CHECK(std::filesystem::exists(n.dir().Join("run/holder-0.kvpool.json")));
  std::string holder_log = test::ReadAll(n.dir().Join("state/logs/holder-0.log"));
  CHECK(holder_log.find("KV pool " + id + ": 8388608 bytes (8 MiB) in 1 allocations in host memory: adopted from "
                        "kept fds") != std::string::npos);
  CHECK(Complete(n.FrontPort()) == kGolden);
}

TEST_CASE("node: SIGKILL of the supervisor under load fails no request - a restart re-adopts everything", "[node]") {
  if (!Have()) return;
  Node n;
  n.Start();
  REQUIRE(n.WaitServing());
  auto before = *n.Status();
  int port = n.FrontPort();
  std::atomic<bool> stop{false};
  std::atomic<int> ok{0}, bad{0};
  std::thread load([&] {
    while (!stop) {
      (Complete(port) == kGolden ? ok : bad)++;
    }
  });
  REQUIRE(test::WaitFor([&] { return ok.load() >= 3; }, 10s));
  n.sup().Kill(SIGKILL);
  REQUIRE(n.sup().Wait(5s) >= 0);
  int at_kill = ok.load();
  REQUIRE(test::WaitFor([&] { return ok.load() >= at_kill + 5; }, 10s));
  n.Start();
  REQUIRE(n.WaitServing());
  REQUIRE(test::WaitFor([&] { return ok.load() >= at_kill + 10; }, 10s));
  stop = true;
  load.join();
  CHECK(bad.load() == 0);
  auto after = *n.Status();
  // Same processes: adopted, not restarted.
  CHECK(after["front"]["pid"] == before["front"]["pid"]);
  CHECK(after["holders"][0]["pid"] == before["holders"][0]["pid"]);
  // Both engines adopted, none refused adoption. Their pids stay the same
  // unless an adopted engine later fails its probes (a slow machine: the
  // sanitizer build under load), which is the probes' business, not adoption's.
  const std::string log = n.Log();
  INFO(log);
  size_t adopted = 0;
  for (size_t at = log.find("adopted engine "); at != std::string::npos; at = log.find("adopted engine ", at + 1)) {
    ++adopted;
  }
  CHECK(adopted == 2);
  CHECK(log.find("not adopted") == std::string::npos);
  std::set<int> pb, pa;
  for (const auto& e : before["engines"]) pb.insert(e.value("pid", 0));
  for (const auto& e : after["engines"]) pa.insert(e.value("pid", 0));
  if (pa != pb) WARN("an adopted engine was restarted after its adoption (its probes failed); see the log");
}

// Every row of every ledger table, by table and id: what another connection
// can read is committed.
std::set<std::string> CommittedRows(const std::string& db) {
  std::set<std::string> out;
  for (const char* table : {"failovers", "cache_events", "recoveries", "holder_restarts", "probe_transitions"}) {
    for (const auto& row : Query(db, std::string("SELECT id FROM ") + table).rows) {
      out.insert(std::string(table) + "#" + row.at("id"));
    }
  }
  return out;
}

TEST_CASE("node: the supervisor SIGKILLed 20 times while it writes: the ledger stays whole, no committed row is lost",
          "[node]") {
  if (!Have()) return;
  Node n;
  n.Start();
  REQUIRE(n.WaitServing());
  std::set<std::string> committed;
  for (int round = 0; round < 20; ++round) {
    INFO("round " << round << "\n" << n.Log());
    // A crash drill makes the supervisor write: the failover row, then the
    // re-armed slot's cache event and recovery. The kill lands in the middle.
    auto drill = n.Cli({"failover", "--drill", "--kill", "--json"});
    INFO(drill.output);
    REQUIRE(drill.exit_code == 0);
    n.sup().Kill(SIGKILL);
    REQUIRE(n.sup().Wait(10s) >= 0);
    // What is readable now was committed before the kill: all of it must
    // survive, along with everything committed in earlier rounds.
    std::set<std::string> now = CommittedRows(n.Db());
    for (const auto& r : committed) CHECK(now.count(r) == 1);
    committed.insert(now.begin(), now.end());
    n.Start();
    REQUIRE(n.WaitServing());
  }
  std::set<std::string> end = CommittedRows(n.Db());
  for (const auto& r : committed) CHECK(end.count(r) == 1);
  // Twenty failovers were acknowledged; each one's row is there.
  CHECK(Query(n.Db(), "SELECT id FROM failovers WHERE drill = 1").rows.size() >= 20);
  auto ic = Query(n.Db(), "PRAGMA integrity_check");
  REQUIRE(ic.rows.size() == 1);
  CHECK(ic.rows[0].begin()->second == "ok");
}

TEST_CASE("node: a ledger that cannot be written: the failover still happens, and the loss is logged, counted and shown",
          "[node]") {
  if (!Have()) return;
  Node n;
  n.Start();
  REQUIRE(n.WaitServing());
  // Another process holds the ledger's write lock for longer than the
  // writer's busy timeout: from the supervisor's side the ledger is read-only.
  sqlite3* h = nullptr;
  REQUIRE(sqlite3_open(n.Db().c_str(), &h) == SQLITE_OK);
  sqlite3_busy_timeout(h, 10'000);
  REQUIRE(sqlite3_exec(h, "BEGIN EXCLUSIVE", nullptr, nullptr, nullptr) == SQLITE_OK);
  auto s = *n.Status();
  pid_t active = test::EngineOf(s, "active").value("pid", 0);
  std::string from = test::EngineOf(s, "active").value("slot", "");
  REQUIRE(::kill(active, SIGKILL) == 0);
  // The failover happens regardless.
  CHECK(Complete(n.FrontPort()) == kGolden);
  CHECK(n.WaitStatus([&](const json& st) { return st.value("active", json()).is_string() && st["active"] != from; },
                     10s));
  // The rows it could not write are counted and shown, with the cause.
  bool counted = n.WaitStatus([](const json& st) { return st["ledger_writes"].value("write_errors", 0) >= 1; }, 60s);
  sqlite3_exec(h, "ROLLBACK", nullptr, nullptr, nullptr);
  sqlite3_close(h);
  REQUIRE(counted);
  auto st = n.Cli({"status"});
  INFO(st.output);
  CHECK(st.output.find("NOT recorded") != std::string::npos);
  CHECK(st.output.find("locked") != std::string::npos);
  auto admin = (*n.Status()).value("admin", "");
  auto m = test::HttpRequestOnce(std::atoi(admin.c_str() + admin.rfind(':') + 1), "GET", "/metrics", "", 5s);
  CHECK(m.body.find("wsup_ledger_write_errors_total 0") == std::string::npos);
  CHECK(m.body.find("wsup_ledger_write_errors_total") != std::string::npos);
  CHECK(n.Log().find("ledger: row not written") != std::string::npos);
}

TEST_CASE("node: SIGKILL of the front: restarted on the same socket, no connection refused", "[node]") {
  if (!Have()) return;
  Node n;
  n.Start();
  REQUIRE(n.WaitServing());
  int port = n.FrontPort();
  pid_t fpid = (*n.Status())["front"].value("pid", 0);
  REQUIRE(fpid > 0);
  REQUIRE(::kill(fpid, SIGKILL) == 0);
  // Connections made while no front runs wait in the kept socket's backlog.
  int refused = 0, good = 0;
  for (int i = 0; i < 10; ++i) {
    test::HttpConn c;
    if (!c.Connect(port, 2s)) {
      ++refused;
      continue;
    }
    good += Complete(port) == kGolden;
  }
  CHECK(refused == 0);
  CHECK(good == 10);
  REQUIRE(n.WaitStatus([&](const json& s) { return s["front"].value("pid", 0) != fpid; }, 10s));
}

TEST_CASE("node: client mode with a fingerprint mismatch loads from disk and records the miss", "[node]") {
  if (!Have()) return;
  test::TempDir hd;
  std::string hsock = hd.Join("holder.sock");
  // An operator's holder of another revision.
  int p[2];
  REQUIRE(::pipe(p) == 0);
  auto holder = test::Child::Start({test::BinPath("wsup-holder"), "--model", test::TestData("llama-tiny-f32"),
                                    "--socket", hsock, "--revision", "other-rev", "--ready-fd", "3"},
                                   hd.Join("holder.log"), {p[1]});
  ::close(p[1]);
  char buf[64];
  REQUIRE(::read(p[0], buf, sizeof buf) > 0);
  ::close(p[0]);
  Node n({"weight_cache.mode=\"client\"", "weight_cache.socket=\"" + hsock + "\""});
  n.Start();
  REQUIRE(n.WaitServing());
  CHECK(Complete(n.FrontPort()) == kGolden);
  REQUIRE(test::WaitFor([&] { return Query(n.Db(), "select * from cache_events where result='miss'").rows.size() == 2; }, 10s));
  auto miss = Query(n.Db(), "select * from cache_events where result='miss'").rows[0];
  CHECK(miss["diff_json"].find("revision") != std::string::npos);
  auto rep = n.Cli({"report", "--miss-tail"});
  CHECK(rep.exit_code == 0);
  CHECK(rep.output.find("miss") != std::string::npos);
  auto repj = n.Cli({"report", "--miss-tail", "--json"});
  REQUIRE(repj.exit_code == 0);
  auto rj = json::parse(repj.output);
  INFO(repj.output);
  CHECK(rj.dump().find("revision") != std::string::npos);
}

TEST_CASE("node: engine-made layouts - the first engine publishes (a miss with its load time), the next attaches "
          "(a hit) - a holder crash keeps the layout: the new holder adopts it and a re-armed engine attaches it",
          "[node][layout]") {
  if (!Have()) return;
  std::string eng = test::BinPath("wsup-engine");
  Node n({"weight_cache.layout=\"engine\"",
          "engine.command=[\"" + eng +
              "\", \"--model\", \"{model}\", \"--port\", \"{port}\", \"--weight-cache\", \"{mode}\", \"--socket\", "
              "\"{socket}\", \"--layout\", \"{layout}\", \"--kv-cache-mib\", \"8\"]"});
  n.Start();
  REQUIRE(n.WaitServing());
  CHECK(Complete(n.FrontPort()) == kGolden);
  auto events = [&](const std::string& where) {
    return Query(n.Db(), "select * from cache_events where " + where).rows;
  };
  REQUIRE(test::WaitFor([&] { return events("1=1").size() == 2; }, 10s));
  auto misses = events("result='miss'");
  REQUIRE(misses.size() == 1);
  CHECK(misses[0]["miss_reason"] == "published");
  CHECK_FALSE(misses[0]["load_ms"].empty());
  auto hits = events("result='hit'");
  REQUIRE(hits.size() == 1);
  CHECK_FALSE(hits[0]["attach_ms"].empty());
  auto cache_info = [&] {
    auto info = test::Run({test::BinPath("wsup"), "cache", "info", "--socket", n.dir().Join("run/holder.sock"),
                           "--json"},
                          30s);
    INFO(info.output);
    REQUIRE(info.exit_code == 0);
    return json::parse(info.output);
  };
  auto ij = cache_info();
  REQUIRE(ij["layouts"].size() == 1);
  CHECK(ij["layouts"][0]["state"] == "committed");
  CHECK(ij["layout_max_bytes"] == 0);
  CHECK(ij["layout_bytes"].get<uint64_t>() > 0);
  const std::string hash = ij["layouts"][0].value("layout_hash", "");
  REQUIRE(hash.size() == 64);
  // The supervisor keeps the committed layout (its record and fds).
  REQUIRE(n.WaitStatus([](const json& s) { return s["holders"][0].value("kept_layouts", 0) == 1; }, 15s));
  CHECK(n.Status()->at("holders")[0].value("kept_layout_fds", 0) > 0);
  auto text = n.Cli({"status"});
  CHECK(text.output.find("kept layouts 1") != std::string::npos);

  // The standby re-armed: it attaches the committed layout.
  auto standby = test::EngineOf(*n.Status(), "standby");
  REQUIRE(standby.is_object());
  REQUIRE(::kill(standby.value("pid", 0), SIGKILL) == 0);
  REQUIRE(test::WaitFor([&] { return events("result='hit'").size() == 2; }, 30s));
  REQUIRE(n.WaitServing());

  // A holder crash: the engines keep serving; the new holder adopts the kept
  // layout, no byte loaded and nothing published.
  pid_t hpid = n.Status()->at("holders")[0].value("pid", 0);
  REQUIRE(hpid > 0);
  REQUIRE(::kill(hpid, SIGKILL) == 0);
  CHECK(Complete(n.FrontPort()) == kGolden);
  REQUIRE(test::WaitFor([&] { return Query(n.Db(), "select * from holder_restarts").rows.size() == 1; }, 15s));
  CHECK(Query(n.Db(), "select * from holder_restarts").rows[0]["from_fds"] == "1");
  REQUIRE(n.WaitStatus([&](const json& s) { return s["holders"][0].value("pid", 0) != hpid &&
                                                   s["holders"][0].value("state", "") == "ready"; }, 15s));
  ij = cache_info();
  REQUIRE(ij["layouts"].size() == 1);
  CHECK(ij["layouts"][0]["state"] == "committed");
  CHECK(ij["layouts"][0]["layout_hash"] == hash);
  CHECK(ij["layouts"][0].value("adopted", false));
  CHECK(ij.value("adopted", false));
  CHECK(n.Status()->at("holders")[0].value("kept_layouts", 0) == 1);
  const std::string hlog = test::ReadAll(n.dir().Join("state/logs/holder-0.log"));
  CHECK(hlog.find("adopted 1 of 1 kept layouts") != std::string::npos);
  CHECK(Complete(n.FrontPort()) == kGolden);

  // A kill drill: the re-armed engine attaches the adopted layout - a hit,
  // no new publish and no miss.
  REQUIRE(n.WaitServing());
  auto drill = n.Cli({"failover", "--drill", "--kill", "--json"});
  INFO(drill.output);
  REQUIRE(drill.exit_code == 0);
  REQUIRE(test::WaitFor([&] { return events("result='hit'").size() == 3; }, 30s));
  REQUIRE(n.WaitServing());
  CHECK(events("result='miss'").size() == 1);
  CHECK(Complete(n.FrontPort()) == kGolden);
  ij = cache_info();
  REQUIRE(ij["layouts"].size() == 1);
  CHECK(ij["layouts"][0]["attaches"] == 1);  // the re-armed engine; the keeper takes no attach
  INFO(n.Log());
  CHECK(n.Log().find("was kept, but the holder does not serve it") == std::string::npos);
}

TEST_CASE("node: a kept layout the new holder refuses is dropped and logged, never attached - the next engine "
          "publishes it again",
          "[node][layout]") {
  if (!Have()) return;
  // The holder's command: a wrapper that damages the kept layouts' record
  // (a layout hash that is no hex) before it starts the real holder, as a
  // record that disagrees with its fds would be.
  test::TempDir tools;
  const std::string wrap = tools.Join("holder-wrap.sh");
  {
    std::ofstream f(wrap);
    f << "#!/bin/sh\n"
         "p=; n=\n"
         "for a in \"$@\"; do\n"
         "  if [ \"$n\" = 1 ]; then p=$a; fi; n=\n"
         "  if [ \"$a\" = --adopt-layouts ]; then n=1; fi\n"
         "done\n"
         "if [ -n \"$p\" ]; then sed -i 's/\"layout_hash\":\"[0-9a-f]/\"layout_hash\":\"g/' \"$p\"; fi\n"
         "exec " << test::BinPath("wsup-holder") << " \"$@\"\n";
  }
  REQUIRE(::chmod(wrap.c_str(), 0755) == 0);
  std::string eng = test::BinPath("wsup-engine");
  Node n({"weight_cache.layout=\"engine\"",
          "holder.command=[\"" + wrap + "\", \"--layout\", \"engine\", \"--socket\", \"{socket}\", \"--backend\", "
              "\"{backend}\"]",
          "engine.command=[\"" + eng +
              "\", \"--model\", \"{model}\", \"--port\", \"{port}\", \"--weight-cache\", \"{mode}\", \"--socket\", "
              "\"{socket}\", \"--layout\", \"{layout}\", \"--kv-cache-mib\", \"8\"]"});
  n.Start();
  REQUIRE(n.WaitServing());
  auto events = [&](const std::string& where) {
    return Query(n.Db(), "select * from cache_events where " + where).rows;
  };
  REQUIRE(test::WaitFor([&] { return events("1=1").size() == 2; }, 10s));
  REQUIRE(n.WaitStatus([](const json& s) { return s["holders"][0].value("kept_layouts", 0) == 1; }, 15s));

  pid_t hpid = n.Status()->at("holders")[0].value("pid", 0);
  REQUIRE(hpid > 0);
  REQUIRE(::kill(hpid, SIGKILL) == 0);
  CHECK(Complete(n.FrontPort()) == kGolden);
  REQUIRE(test::WaitFor([&] { return Query(n.Db(), "select * from holder_restarts").rows.size() == 1; }, 15s));
  // The new holder refused the damaged layout; the supervisor drops it.
  REQUIRE(n.WaitStatus([&](const json& s) { return s["holders"][0].value("pid", 0) != hpid &&
                                                   s["holders"][0].value("state", "") == "ready" &&
                                                   s["holders"][0].value("kept_layouts", -1) == 0; }, 15s));
  INFO(n.Log());
  CHECK(n.Log().find("was kept, but the holder does not serve it") != std::string::npos);
  const std::string hlog = test::ReadAll(n.dir().Join("state/logs/holder-0.log"));
  INFO(hlog);
  CHECK(hlog.find("field 'layout_hash' is not 64 lower-case hex digits") != std::string::npos);
  CHECK(hlog.find("it is not adopted") != std::string::npos);
  auto info = test::Run({test::BinPath("wsup"), "cache", "info", "--socket", n.dir().Join("run/holder.sock"),
                         "--json"},
                        30s);
  REQUIRE(info.exit_code == 0);
  CHECK(json::parse(info.output)["layouts"].empty());
  CHECK(Complete(n.FrontPort()) == kGolden);

  // Never attached: the re-armed engine publishes the layout again.
  REQUIRE(n.WaitServing());
  auto standby = test::EngineOf(*n.Status(), "standby");
  REQUIRE(standby.is_object());
  REQUIRE(::kill(standby.value("pid", 0), SIGKILL) == 0);
  REQUIRE(test::WaitFor([&] { return events("result='miss'").size() == 2; }, 30s));
  CHECK(events("result='miss'")[1]["miss_reason"] == "published");
  CHECK(events("result='hit'").size() == 1);
  REQUIRE(n.WaitServing());
  CHECK(Complete(n.FrontPort()) == kGolden);
  // And the supervisor keeps the new commit.
  CHECK(n.WaitStatus([](const json& s) { return s["holders"][0].value("kept_layouts", 0) == 1; }, 15s));
}

TEST_CASE("node: a MoE model at tp 2 with expert parallelism - holders and engines hold the same experts and serve "
          "its golden", "[node][moe]") {
  if (!Have()) return;
  const std::string model = test::TestData("qwen3moe-tiny-f32");
  REQUIRE(test::HaveTestData("qwen3moe-tiny-f32"));
  auto g = json::parse(test::ReadAll(model + "/golden.json"));
  REQUIRE(g["cases"][0]["prompt"] == "Hello, world");
  const auto golden = g["cases"][0]["output_ids"].get<std::vector<int>>();
  std::string ids;
  for (int id : golden) ids += (ids.empty() ? "" : ", ") + std::to_string(id);
  std::string eng = test::BinPath("wsup-engine");
  // The holders get --ep-size {ep} --ep-rank {rank} from the supervisor; the
  // engines --tp {tp} --ep-size {ep} from their command. Daemon mode: a rank
  // whose experts differ from its holder's is a mismatch and never serves.
  Node n({"parallel.tp=2", "parallel.expert_parallel=true",
          "engine.command=[\"" + eng +
              "\", \"--model\", \"{model}\", \"--port\", \"{port}\", \"--weight-cache\", \"{mode}\", "
              "\"--socket\", \"{socket}\", \"--device\", \"{devices}\", \"--tp\", \"{tp}\", \"--ep-size\", "
              "\"{ep}\", \"--revision\", \"{revision}\", \"--kv-cache-mib\", \"8\"]",
          "probe.expect_token_ids=[" + ids + "]"},
         model);
  n.Start();
  const bool serving = n.WaitServing();
  INFO(n.Log());
  REQUIRE(serving);
  auto s = *n.Status();
  CHECK(s["holders"].size() == 2);
  CHECK(Complete(n.FrontPort()) == golden);
  CHECK(Query(n.Db(), "select * from cache_events where result='miss'").rows.empty());
}

TEST_CASE("node: daemon mode with a mismatch: clear error, bounded retries, degraded", "[node]") {
  if (!Have()) return;
  std::string eng = test::BinPath("wsup-engine");
  Node n({"engine.command=[\"" + eng +
              "\", \"--model\", \"{model}\", \"--port\", \"{port}\", \"--weight-cache\", \"daemon\", \"--socket\", "
              "\"{socket}\", \"--device\", \"cpu\", \"--revision\", \"not-the-holders\"]",
          "supervisor.max_restarts=2", "supervisor.restart_backoff_ms=50"});
  n.Start();
  REQUIRE(n.WaitStatus([](const json& s) { return s.value("state", "") == "degraded"; }, 30s));
  auto s = *n.Status();
  CHECK(s.value("degraded_reason", "").size() > 0);
  // Bounded: no restart loop.
  auto r1 = s["engines"][0].value("restarts", 0) + s["engines"][1].value("restarts", 0);
  CHECK(r1 <= 4);
  // The node is degraded at the first refusal; the other engine's own
  // refusal reaches its log a moment later.
  CHECK(test::WaitFor(
      [&] { return test::ReadAll(n.dir().Join("state/logs/engine-a.log")).find("revision") != std::string::npos; }, 20s));
}

TEST_CASE("node: failover drills through the CLI, planned and with --kill", "[node]") {
  if (!Have()) return;
  Node n;
  n.Start();
  REQUIRE(n.WaitServing());
  for (bool kill : {false, true}) {
    REQUIRE(n.WaitServing());
    std::vector<std::string> args = {"failover", "--drill", "--json"};
    if (kill) args.push_back("--kill");
    auto r = n.Cli(args);
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    auto j = json::parse(r.output);
    CHECK(j.value("ok", false));
    CHECK(j.value("from_slot", "") != j.value("to_slot", ""));
    CHECK(j.contains("swap_ms"));
    CHECK(j.contains("first_ok_ms"));
    CHECK(Complete(n.FrontPort()) == kGolden);
  }
  CHECK(Query(n.Db(), "select * from failovers where drill=1").rows.size() == 2);
  auto no = n.Cli({"failover"});
  CHECK(no.exit_code != 0);
}

TEST_CASE("node: kill drills are the operator's - more of them than the crash-loop budget leave the node serving",
          "[node]") {
  if (!Have()) return;
  // A budget of one restart per slot: without the drills' exemption the
  // second kill of a slot would leave it down and the node degraded.
  Node n({"supervisor.max_restarts=1"});
  n.Start();
  for (int i = 0; i < 4; ++i) {
    REQUIRE(n.WaitServing());
    // A drill waits for the standby's next passing probe (it refuses one
    // not proven recently): asked again until it is taken.
    test::RunResult r;
    REQUIRE(test::WaitFor(
        [&] {
          r = n.Cli({"failover", "--drill", "--kill", "--json"});
          return r.exit_code == 0 || r.output.find("not proven recently") == std::string::npos;
        },
        30s));
    INFO("drill " << i << ": " << r.output);
    REQUIRE(r.exit_code == 0);
    CHECK(json::parse(r.output).value("ok", false));
  }
  REQUIRE(n.WaitServing());
  auto st = n.Status();
  REQUIRE(st);
  INFO(st->dump());
  CHECK(st->value("state", "") == "serving");
  CHECK(Query(n.Db(), "select * from failovers where drill=1").rows.size() == 4);
}

TEST_CASE("node: status, report and stop find the node through --config and --set", "[node]") {
  if (!Have()) return;
  Node n;
  n.Start();
  REQUIRE(n.WaitServing());
  // The same config and overrides as `start`, minus the command itself.
  auto args = n.Argv("status");
  args.erase(args.begin() + 2);  // the config path goes after --config
  std::vector<std::string> status = {args[0], "status", "--json", "--config",
                                     std::string(WSUP_SOURCE_DIR) + "/config/demo.toml"};
  status.insert(status.end(), args.begin() + 2, args.end());
  auto r = test::Run(status, 30s);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK(json::parse(r.output).value("state", "") == "serving");
  std::vector<std::string> report = status;
  report[1] = "report";
  report[2] = "--miss-tail";
  auto rep = test::Run(report, 30s);
  INFO(rep.output);
  CHECK(rep.exit_code == 0);
  CHECK(rep.output.find("hit rate") != std::string::npos);
  std::vector<std::string> stop = status;
  stop[1] = "stop";
  stop.erase(stop.begin() + 2);
  CHECK(test::Run(stop, 60s).exit_code == 0);
  CHECK(n.sup().Wait(30s) == 0);
}

TEST_CASE("node: the control socket refuses another uid", "[node]") {
  if (!Have()) return;
  if (SkipWithoutRoot("to act as another uid")) return;
  Node n;
  n.Start();
  REQUIRE(n.WaitServing());
  // Either the connect is refused (the socket is 0600 in a 0700 dir) or the
  // supervisor answers with a refusal.
  const std::string socket = n.SupervisorSocket();
  int code = test::RunForkedAs(
      65534,
      [&] {
        auto r = JsonCall(socket, json{{"type", "status"}}, 2000);
        return !r.ok() || r->value("type", "") == "error" ? 0 : 1;
      },
      10s);
  CHECK(code == 0);
  CHECK(n.Status().has_value());
}

TEST_CASE("node: systemd-analyze verify passes on the unit", "[node]") {
  if (::system("command -v systemd-analyze >/dev/null 2>&1") != 0) {
    WARN("SKIP: systemd-analyze is not installed");
    return;
  }
  test::TempDir d;
  std::string unit = test::ReadAll(std::string(WSUP_SOURCE_DIR) + "/systemd/wsup@.service");
  REQUIRE(!unit.empty());
  // Point the unit at the built binary so the verifier can check it exists.
  std::string bin = test::BinPath("wsup");
  for (size_t pos; (pos = unit.find("/usr/local/bin/wsup")) != std::string::npos;) unit.replace(pos, 19, bin);
  std::ofstream(d.Join("wsup@.service")) << unit;
  auto r = test::Run({"/bin/sh", "-c", "systemd-analyze verify " + d.Join("wsup@demo.service") + " 2>&1"}, 60s);
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("wsup@.service") == std::string::npos);
}

}  // namespace
}  // namespace wsup
