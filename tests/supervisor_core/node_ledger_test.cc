// NodeLedger (supervisor/node_ledger.h) on a real ledger in a temporary
// folder and fake timers: a caller waiting on rows is answered once the
// ledger has handled them, says whether they are on disk (a row another
// connection's lock kept out is named lost, with its cause), and says so
// when the ledger has not handled them within its settle time. Real time
// passes only while a bounded wait polls the ledger's writer thread.
#include <catch2/catch.hpp>

#include <chrono>
#include <optional>

#include "state/sqlite.h"
#include "supervisor/node_ledger.h"
#include "tests/fake_timers.h"
#include "testkit/test_util.h"

namespace wsup {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;

struct LedgerRig {
  test::TempDir dir;
  FakeClock clock;
  testing::FakeTimers timers{&clock};
  NodeLedger ledger{timers, clock};
  std::optional<NodeLedger::Settled> settled;

  explicit LedgerRig(const LedgerOptions& options = {}) { REQUIRE(ledger.Open(dir.path(), options).ok()); }

  // A failover row, queued; its sequence number.
  uint64_t Row() {
    FailoverRecord rec;
    rec.trigger = "drill";
    rec.reason = "test";
    rec.from_slot = "a";
    rec.to_slot = "b";
    rec.fault_ms = rec.detected_ms = rec.swapped_ms = clock.WallMs();
    uint64_t seq = 0;
    REQUIRE(ledger.ledger().RecordFailover(rec, &seq).ok());
    return seq;
  }
  void Wait(std::vector<uint64_t> rows, std::string unrecorded = "") {
    ledger.WhenSettled(std::move(rows), std::move(unrecorded),
                       [this](const NodeLedger::Settled& s) { settled = s; });
  }
  // Lets the writer finish (real time, bounded), then the polls run.
  void SettleWriter() {
    REQUIRE(test::WaitFor([&] { return ledger.ledger().HandledSeq() >= ledger.ledger().QueuedSeq(); }, 10s));
    timers.Advance(100);
  }
};

TEST_CASE("node ledger: a caller is answered once its row is on disk, and told it is recorded", "[supervisor][ledger]") {
  LedgerRig rig;
  rig.Wait({rig.Row()});
  CHECK_FALSE(rig.settled);  // nothing answers before the writer has handled the row
  rig.SettleWriter();
  REQUIRE(rig.settled);
  CHECK(rig.settled->checked);
  CHECK(rig.settled->lost.empty());
  CHECK(rig.settled->warning.empty());
  json reply{{"ok", true}};
  rig.settled->Stamp(reply);
  CHECK(reply["recorded"] == true);
  CHECK_FALSE(reply.contains("ledger_error"));
  CHECK(rig.timers.armed() == 0);
}

TEST_CASE("node ledger: a row kept out by another connection's lock is named lost, with its cause",
          "[supervisor][ledger]") {
  LedgerOptions opts;
  opts.busy_timeout_ms = 50;
  opts.retry_ms = 100;
  LedgerRig rig(opts);
  auto other = Db::Open(Ledger::PathIn(rig.dir.path()), false);
  REQUIRE(other.ok());
  REQUIRE(other->Exec("BEGIN EXCLUSIVE").ok());
  rig.Wait({rig.Row()});
  rig.SettleWriter();
  REQUIRE(other->Exec("ROLLBACK").ok());
  REQUIRE(rig.settled);
  json reply{{"ok", true}};
  rig.settled->Stamp(reply);
  INFO(reply.dump());
  CHECK(reply["recorded"] == false);
  CHECK(reply["ledger_error"].get<std::string>().find("locked") != std::string::npos);
  CHECK(rig.ledger.StatusJson()["write_errors"] == 1);
}

TEST_CASE("node ledger: a ledger that has not handled the row within its settle time is answered with a warning",
          "[supervisor][ledger]") {
  LedgerOptions opts;
  opts.busy_timeout_ms = 5000;  // the writer waits on the lock in real time, far longer than the test takes
  opts.retry_ms = 10'000;
  LedgerRig rig(opts);
  auto other = Db::Open(Ledger::PathIn(rig.dir.path()), false);
  REQUIRE(other.ok());
  REQUIRE(other->Exec("BEGIN EXCLUSIVE").ok());
  rig.Wait({rig.Row()});
  rig.timers.Advance(rig.ledger.ledger().MaxSettleMs() - 100);
  CHECK_FALSE(rig.settled);
  rig.timers.Advance(200);
  REQUIRE(rig.settled);
  json reply{{"ok", true}};
  rig.settled->Stamp(reply);
  INFO(reply.dump());
  CHECK(reply["recorded"] == false);
  CHECK(reply["warning"].get<std::string>().find("has not committed this row") != std::string::npos);
  CHECK(reply["ledger_error"].get<std::string>().find("not committed within") != std::string::npos);
  REQUIRE(other->Exec("ROLLBACK").ok());
  rig.ledger.Close();
}

TEST_CASE("node ledger: a row refused before it was queued is the answer's error, a plain answer names no rows",
          "[supervisor][ledger]") {
  LedgerRig rig;
  rig.Wait({}, "failover: the ledger is closed");
  rig.SettleWriter();
  REQUIRE(rig.settled);
  json refused{{"ok", true}};
  rig.settled->Stamp(refused);
  CHECK(refused["recorded"] == false);
  CHECK(refused["ledger_error"] == "failover: the ledger is closed");

  rig.settled.reset();
  rig.Wait({});
  rig.SettleWriter();
  REQUIRE(rig.settled);
  json plain{{"ok", true}};
  rig.settled->Stamp(plain);
  CHECK(plain == json{{"ok", true}});
}

TEST_CASE("node ledger: a failed write is logged and kept for `wsup status`, and counted for /metrics",
          "[supervisor][ledger]") {
  LedgerRig rig;
  CHECK_FALSE(rig.ledger.StatusJson().contains("last_error"));
  rig.ledger.Check(Status::Ok(), "fence");
  CHECK(rig.ledger.last_error().empty());
  rig.ledger.ledger().Close();
  FenceRecord rec;
  rec.slot = "a";
  rec.kind = "kv_pool";
  auto id = rig.ledger.Check(rig.ledger.ledger().RecordFence(rec), "fence");
  CHECK_FALSE(id);
  CHECK(rig.ledger.last_error().rfind("fence: ", 0) == 0);
  json status = rig.ledger.StatusJson();
  CHECK(status["last_error"] == rig.ledger.last_error());
  CHECK(status["write_errors"] == 1);
  Metrics m;
  rig.ledger.Report(m);
  CHECK(m.ledger_write_errors == 1);
  CHECK(m.ledger_lost_rows == 1);
}

}  // namespace
}  // namespace wsup
