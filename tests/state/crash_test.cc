// Crash safety with real processes: a writer is SIGKILLed twenty times at
// varying moments; the ledger must stay intact and keep every row the writer
// reported as committed.
#include <signal.h>

#include <set>
#include <sstream>

#include <catch2/catch.hpp>

#include "state/schema.h"
#include "state/sqlite.h"
#include "testkit/test_util.h"

namespace wsup {
namespace {

// Ids on complete lines: a line cut by the kill does not count.
std::vector<int64_t> CommittedIds(const std::string& log) {
  std::vector<int64_t> ids;
  size_t start = 0;
  for (;;) {
    size_t nl = log.find('\n', start);
    if (nl == std::string::npos) break;
    ids.push_back(std::stoll(log.substr(start, nl - start)));
    start = nl + 1;
  }
  return ids;
}

size_t Lines(const std::string& path) {
  std::string s = test::ReadAll(path);
  return static_cast<size_t>(std::count(s.begin(), s.end(), '\n'));
}

TEST_CASE("ledger: SIGKILL at any moment keeps every committed row", "[state][crash]") {
  test::TempDir dir;
  std::string db_path = dir.Join("wsup.db");
  std::set<int64_t> committed;
  for (int round = 0; round < 20; ++round) {
    std::string log = dir.Join("writer-" + std::to_string(round) + ".out");
    // Round 0 and every fifth round are killed as soon as they start (during
    // open or migration); the others after 1..4 committed batches, that is
    // somewhere inside the next one.
    size_t wait_lines = static_cast<size_t>(round % 5);
    auto child = test::Child::Start({LEDGER_WRITER_PATH, db_path}, log);
    if (wait_lines > 0) {
      bool reached = test::WaitFor([&] { return Lines(log) >= wait_lines || !child.running(); },
                                   std::chrono::seconds(20));
      REQUIRE(reached);
      INFO(test::ReadAll(log));
      REQUIRE(child.running());
    }
    child.Kill(SIGKILL);
    REQUIRE(child.Wait(std::chrono::seconds(10)) == 128 + SIGKILL);
    std::string out = test::ReadAll(log);
    // stderr shares the log: a failing writer would show up as a non-number.
    for (int64_t id : CommittedIds(out)) committed.insert(id);
  }
  REQUIRE(committed.size() >= 20);  // the test proves something only if rows were written

  auto db = Db::Open(db_path, false);
  REQUIRE(db.ok());
  CHECK(*db->QueryText("PRAGMA integrity_check") == "ok");
  CHECK(*SchemaVersion(*db) == kSchemaVersion);
  auto st = db->Prepare("SELECT COUNT(*) FROM failovers f JOIN recoveries r ON r.failover_id = f.id "
                        "WHERE f.id = ?1 AND f.first_ok_ms IS NOT NULL");
  REQUIRE(st.ok());
  for (int64_t id : committed) {
    st->Reset();
    st->Bind(1, id);
    auto row = st->Step();
    REQUIRE(row.ok());
    REQUIRE(*row);
    INFO("failover " << id << " was reported committed");
    CHECK(st->Int(0) == 1);
  }
}

}  // namespace
}  // namespace wsup
