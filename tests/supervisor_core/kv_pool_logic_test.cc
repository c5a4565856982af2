// The node's KV pool, in-process: the real Supervisor on fake processes
// (logic_rig.h) whose engines answer HTTP (fake_engine.h), so the test
// decides when an engine's lifeline closes and when its process is gone.
// Checked: the pool goes to the promoted engine only after the old active's
// exit (never at its lifeline's EOF), a planned drill releases before it
// grants, and an engine that will not let the pool go is killed and the
// pool waits for its exit. At no moment do two engines map the pool.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <optional>
#include <map>
#include <memory>
#include <thread>

#include <nlohmann/json.hpp>

#include "tests/supervisor_core/fake_engine.h"
#include "tests/supervisor_core/logic_rig.h"
#include "state/report.h"
#include "testkit/http_client.h"
#include "wire/json_call.h"

namespace wsup {
namespace {

using namespace std::chrono_literals;
using logic::FakeEngine, logic::Rig;
using nlohmann::json;

// Fast real-time probes (they run on real timers against the fake engines),
// and the pool.
constexpr const char* kPoolToml =
    "interval_ms = 40\ntimeout_ms = 30\njitter_ms = 0\nsuccesses = 1\nfailures = 2\n"
    "[kv]\npool_mib = 8\nscratch_mib = 1\n";

// The rig with a FakeEngine for every engine process, and the order of the
// deaths it saw.
struct PoolRig {
  std::map<pid_t, std::unique_ptr<FakeEngine>> engines;
  std::map<pid_t, uint64_t> died_at;  // FakeEngine::NextSeq() when the process died
  std::map<pid_t, std::pair<std::string, uint64_t>> spawned;  // slot kind and NextSeq() at its spawn
  std::unique_ptr<Rig> rig;
  // Two engines mapping the pool at one moment, seen by Watch().
  int overlaps = 0;

  explicit PoolRig(const std::string& toml = kPoolToml) {
    rig = std::make_unique<Rig>("client", 600'000, toml, [this](Rig& r) {
      r.procs.on_spawn = [this](pid_t pid, const std::string& kind, const ChildSpec& spec) {
        if (kind.rfind("engine-", 0) != 0) return;
        spawned[pid] = {kind, FakeEngine::NextSeq()};
        std::string port, nonce, token;
        for (size_t i = 0; i + 1 < spec.argv.size(); ++i) {
          if (spec.argv[i] == "--port") port = spec.argv[i + 1];
        }
        for (const auto& [k, v] : spec.env_set) {
          if (k == "WSUP_ENGINE_NONCE") nonce = v;
          if (k == "WSUP_CONTROL_TOKEN") token = v;
        }
        CHECK(token.size() == 32);  // every engine start gets a fresh secret
        auto e = std::make_unique<FakeEngine>(std::atoi(port.c_str()), nonce, "world", token);
        REQUIRE(e->Start());
        engines[pid] = std::move(e);
      };
      r.procs.on_death = [this](pid_t pid) {
        auto it = engines.find(pid);
        if (it == engines.end()) return;
        if (!died_at.count(pid)) died_at[pid] = FakeEngine::NextSeq();
        // A dead engine answers nothing, and maps nothing any more.
        it->second->Stop();
      };
    });
  }
  ~PoolRig() {
    rig.reset();
    engines.clear();
  }

  json Status() { return rig->Status(); }
  pid_t PidOf(const std::string& role) {
    const json s = Status();
    for (const auto& e : s["engines"]) {
      if (e.value("role", "") == role) return e.value("pid", 0);
    }
    return 0;
  }
  FakeEngine* Engine(pid_t pid) {
    auto it = engines.find(pid);
    return it == engines.end() ? nullptr : it->second.get();
  }
  int Mapping() {
    int n = 0;
    for (auto& [pid, e] : engines) {
      if (!died_at.count(pid) && e->pool_mapped()) ++n;
    }
    return n;
  }
  // Settles until cond, watching that never two live engines map the pool.
  bool Until(const std::function<bool()>& cond, std::chrono::milliseconds limit) {
    return rig->SettleUntil(
        [&] {
          if (Mapping() > 1) ++overlaps;
          return cond();
        },
        limit, 5);
  }
  // Serving: an active engine that maps the pool, a proven standby.
  bool Settled() {
    json s = Status();
    pid_t a = PidOf("active"), b = PidOf("standby");
    return a > 0 && b > 0 && s["kv_pool"].value("state", "") == "held" && Engine(a) && Engine(a)->pool_mapped() &&
           Engine(b) && !Engine(b)->pool_mapped();
  }
  // The first role call to `pid` that asked for the pool (seq 0: none).
  uint64_t PoolCallSeq(pid_t pid) {
    for (const auto& c : Engine(pid)->role_calls()) {
      if (c.kv == "pool") return c.seq;
    }
    return 0;
  }
};

TEST_CASE("kv pool logic: a crash - the promoted engine waits for the old one's exit, not its lifeline",
          "[logic][kv_pool]") {
  PoolRig p;
  bool settled = p.Until([&] { return p.Settled(); }, 20s);
  INFO(p.Status().dump(1));
  REQUIRE(settled);
  const pid_t old_active = p.PidOf("active"), standby = p.PidOf("standby");
  FakeEngine* next = p.Engine(standby);
  CHECK(p.PoolCallSeq(standby) == 0);

  // Killed, but its process lives on (a GPU engine's teardown): the
  // lifeline closes now, the exit comes when the test says.
  p.rig->procs.kill_is_slow = true;
  p.rig->procs.Dying(old_active);
  REQUIRE(p.Until([&] { return p.PidOf("active") == standby; }, 10s));
  // In progress until a correct answer comes through the front (this rig
  // has none): status says so, naming both slots.
  {
    const json st = p.Status();
    const json& fo = st["failover"];
    INFO(fo.dump());
    CHECK(fo.value("in_progress", false));
    CHECK(fo.value("to_slot", "") == st.value("active", ""));
    CHECK(fo.value("from_slot", "") != fo.value("to_slot", ""));
    CHECK_FALSE(fo.value("drill", true));
  }
  // Fake time passes (restart backoff and the like) and real time too:
  // the pool stays fenced, the new active serves from its scratch.
  p.rig->Advance(5000);
  CHECK_FALSE(p.Until([&] { return next->pool_mapped(); }, 300ms));
  CHECK(p.Status()["kv_pool"].value("state", "") == "fenced");
  CHECK(p.Status()["kv_pool"].value("owner", "") != p.Status()["active"].get<std::string>());
  CHECK(p.PoolCallSeq(standby) == 0);
  // It was told it is active, on its scratch.
  bool told = false;
  for (const auto& c : next->role_calls()) told |= c.role == "active" && c.kv == "scratch";
  CHECK(told);

  // The old process is gone: the pool is the new active engine's.
  const std::string old_kind = p.spawned[old_active].first;
  p.rig->procs.Exit(old_active, -1, SIGKILL);
  REQUIRE(p.Until([&] { return next->pool_mapped() && p.Status()["kv_pool"].value("state", "") == "held"; }, 10s));
  REQUIRE(p.died_at.count(old_active));
  CHECK(p.PoolCallSeq(standby) > p.died_at[old_active]);
  CHECK(p.overlaps == 0);
  // The failed slot is restarted, but only after the grant reached the
  // promoted engine: the spawn would have held the grant back.
  pid_t restarted = 0;
  REQUIRE(p.Until(
      [&] {
        for (const auto& [pid, at] : p.spawned) {
          if (at.first == old_kind && pid != old_active) restarted = pid;
        }
        return restarted != 0;
      },
      10s));
  CHECK(p.spawned[restarted].second > p.PoolCallSeq(standby));
}

TEST_CASE("kv pool logic: a planned drill - the old active lets go after its drain, then the new one maps it",
          "[logic][kv_pool]") {
  PoolRig p;
  REQUIRE(p.Until([&] { return p.Settled(); }, 20s));
  const pid_t old_active = p.PidOf("active"), standby = p.PidOf("standby");
  const std::string sock = p.rig->dir.Join("run/wsup.sock");
  std::thread drill([&] { (void)JsonCall(sock, json{{"type", "failover"}, {"drill", true}}, 3000); });
  REQUIRE(p.Until([&] { return p.PidOf("active") == standby && p.Settled(); }, 10s));
  drill.join();
  // The release came first, then the grant.
  uint64_t released = 0;
  for (const auto& c : p.Engine(old_active)->role_calls()) {
    if (c.role == "standby") released = c.seq;
  }
  REQUIRE(released > 0);
  CHECK(p.PoolCallSeq(standby) > released);
  CHECK_FALSE(p.Engine(old_active)->pool_mapped());
  CHECK(p.overlaps == 0);
}

TEST_CASE("kv pool logic: a standby that maps the pool unasked is fenced - killed, recorded, the owner keeps it",
          "[logic][kv_pool]") {
  PoolRig p;
  REQUIRE(p.Until([&] { return p.Settled(); }, 20s));
  const pid_t active = p.PidOf("active"), standby = p.PidOf("standby");
  const std::string owner = p.Status()["kv_pool"].value("owner", "");
  REQUIRE(!owner.empty());
  // The supervisor's own requests carry each engine's token.
  CHECK(p.Engine(active)->unauthorized() == 0);
  CHECK(p.Engine(standby)->unauthorized() == 0);

  p.Engine(standby)->MapPoolUnasked();
  // Seen at the next status refresh (every second of the rig's fake time).
  REQUIRE(p.Until([&] { return p.died_at.count(standby) > 0; }, 10s));
  const json st = p.Status();
  INFO(st.dump(1));
  // The pool never changed hands: the active engine still holds it.
  CHECK(st["kv_pool"].value("owner", "") == owner);
  CHECK(st["kv_pool"].value("state", "") == "held");
  CHECK(p.PidOf("active") == active);
  CHECK(p.Engine(active)->pool_mapped());
  // Recorded: a fences row naming the engine, and the event counted.
  auto reader = LedgerReader::Open(p.rig->dir.Join("state/wsup.db"));
  REQUIRE(reader.ok());
  bool recorded = p.Until(
      [&] {
        auto f = reader->Fences();
        return f.ok() && f->size() == 1;
      },
      10s);
  REQUIRE(recorded);
  auto fences = reader->Fences();
  REQUIRE(fences.ok());
  CHECK((*fences)[0].pid == standby);
  CHECK((*fences)[0].slot_state == "standby");
  CHECK((*fences)[0].kind == "kv_pool");
  CHECK((*fences)[0].pool_owner == owner);
  CHECK((*fences)[0].reason.find("maps the node's KV pool") != std::string::npos);
  // The fenced slot is started again and proven: the node serves as before.
  REQUIRE(p.Until([&] { return p.Settled() && p.PidOf("standby") != standby; }, 20s));
  CHECK(p.PidOf("active") == active);
}

// One request to the supervisor's admin listener, while the rig's loop runs.
test::HttpResult Admin(PoolRig& p, const std::string& method, const std::string& path) {
  std::string listen = p.Status().value("admin", "");
  const int port = std::atoi(listen.c_str() + listen.rfind(':') + 1);
  test::HttpResult r;
  std::atomic<bool> done{false};
  std::thread t([&] {
    r = test::HttpRequestOnce(port, method, path, "", 5s);
    done = true;
  });
  p.rig->SettleUntil([&] { return done.load(); }, 10s);
  t.join();
  return r;
}

TEST_CASE("logic: resumed-stream counters add up over the engines a slot has run, the admin listener only reads",
          "[logic][kv_pool]") {
  PoolRig p;
  REQUIRE(p.Until([&] { return p.Settled(); }, 20s));
  const pid_t first = p.PidOf("active");
  const std::string slot = p.Status().value("active", "");
  const std::string metric = "wsup_engine_resumed_streams_total{slot=\"" + slot + "\",kv=\"adopted\"} ";
  p.Engine(first)->set_resumed(5);
  REQUIRE(p.Until([&] { return Admin(p, "GET", "/metrics").body.find(metric + "5\n") != std::string::npos; }, 10s));
  // The communicator's warmth comes from its status while it serves, not
  // only from the status polls of its start (an adopted engine has none).
  p.Engine(first)->set_warm(false);
  CHECK(p.Until([&] { return !p.rig->Engine(slot).value("comm_warm", true); }, 10s));
  p.Engine(first)->set_warm(true);
  CHECK(p.Until([&] { return p.rig->Engine(slot).value("comm_warm", false); }, 10s));
  // That engine dies; the one started in its slot resumes two more.
  p.rig->procs.Exit(first, -1, SIGKILL);
  pid_t next = 0;
  REQUIRE(p.Until(
      [&] {
        for (const auto& [pid, at] : p.spawned) {
          if (at.first == "engine-" + slot && pid != first && p.Engine(pid)) next = pid;
        }
        return next != 0;
      },
      20s));
  p.Engine(next)->set_resumed(2);
  REQUIRE(p.Until([&] { return Admin(p, "GET", "/metrics").body.find(metric + "7\n") != std::string::npos; }, 20s));
  // Read-only: anything but GET and HEAD is refused.
  for (const char* m : {"POST", "PUT", "DELETE"}) {
    test::HttpResult r = Admin(p, m, "/metrics");
    CHECK(r.status == 405);
    CHECK(r.Header("Allow") == "GET, HEAD");
  }
  CHECK(Admin(p, "HEAD", "/status").status == 200);
}

TEST_CASE("kv pool logic: an engine that will not let the pool go is killed, and the pool waits for its exit",
          "[logic][kv_pool]") {
  PoolRig p;
  REQUIRE(p.Until([&] { return p.Settled(); }, 20s));
  const pid_t old_active = p.PidOf("active"), standby = p.PidOf("standby");
  p.Engine(old_active)->set_release(FakeEngine::Release::kRefuse);
  p.rig->procs.kill_is_slow = true;
  const std::string sock = p.rig->dir.Join("run/wsup.sock");
  std::thread drill([&] { (void)JsonCall(sock, json{{"type", "failover"}, {"drill", true}}, 3000); });
  // Refused: the supervisor kills it (slowly: its exit is the test's).
  REQUIRE(p.Until([&] { return !p.rig->procs.slow_kills.empty(); }, 10s));
  drill.join();
  CHECK(p.rig->procs.slow_kills.front() == old_active);
  CHECK(p.Status()["kv_pool"].value("state", "") == "fenced");
  CHECK_FALSE(p.Until([&] { return p.Engine(standby)->pool_mapped(); }, 300ms));
  p.rig->procs.Exit(old_active, -1, SIGKILL);
  REQUIRE(p.Until([&] { return p.Engine(standby)->pool_mapped(); }, 10s));
  CHECK(p.PoolCallSeq(standby) > p.died_at[old_active]);
  CHECK(p.overlaps == 0);
}

TEST_CASE("logic: a failover that nothing proves through the front ends unproven after its budget - drills are "
          "taken again",
          "[logic]") {
  // This rig's front never answers (its socket is held, nothing accepts),
  // so no correct answer ever comes through it. Slow probes, so that fake
  // time can move by half-seconds while the engines answer in real time.
  PoolRig p(
      "interval_ms = 2000\ntimeout_ms = 2000\njitter_ms = 0\nsuccesses = 1\nfailures = 2\n"
      "[kv]\npool_mib = 8\nscratch_mib = 1\n");
  // Moves fake time by `ms` in half-second looks, the loop running between.
  auto pass = [&](int64_t ms) {
    const int64_t until = p.rig->clock.MonotonicMs() + ms;
    REQUIRE(p.rig->SettleUntil([&] { return p.rig->clock.MonotonicMs() >= until; }, 60s, 500));
  };
  REQUIRE(p.Until([&] { return p.Settled(); }, 20s));
  const pid_t old_active = p.PidOf("active"), standby = p.PidOf("standby");
  p.rig->procs.Exit(old_active, -1, SIGKILL);
  REQUIRE(p.Until([&] { return p.PidOf("active") == standby; }, 10s));
  CHECK(p.Status()["failover"].value("in_progress", false));
  const std::string sock = p.rig->dir.Join("run/wsup.sock");
  // A drill asked on another thread while the loop runs here.
  auto drill = [&] {
    std::optional<json> got;
    std::atomic<bool> done{false};
    std::thread t([&] {
      auto r = JsonCall(sock, json{{"type", "failover"}, {"drill", true}}, 3000);
      if (r.ok()) got = *r;
      done = true;
    });
    (void)p.Until([&] { return done.load(); }, 5s);
    t.join();
    return got;
  };
  auto refused = drill();
  REQUIRE(refused);
  INFO(refused->dump());
  CHECK_FALSE(refused->value("ok", true));
  CHECK(refused->value("error", "").find("a failover is in progress") != std::string::npos);
  // Just short of the budget: still in progress.
  pass(118'000);
  CHECK(p.Status()["failover"].value("in_progress", false));
  // At the budget it ends, unproven; the next drill is judged on the
  // engines alone again.
  pass(3'000);
  CHECK_FALSE(p.Status()["failover"].value("in_progress", true));
  auto next = drill();
  REQUIRE(next);
  INFO(next->dump());
  CHECK(next->value("error", "").find("a failover is in progress") == std::string::npos);
}

}  // namespace
}  // namespace wsup
