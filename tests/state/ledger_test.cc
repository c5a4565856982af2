// Ledger: schema and migrations, rows round-trip, validation, bad paths.
#include "state/ledger.h"

#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <nlohmann/json.hpp>

#include <catch2/catch.hpp>

#include "common/fs.h"
#include "state/report.h"
#include "state/schema.h"
#include "testkit/test_util.h"

namespace wsup {
namespace {

std::unique_ptr<Ledger> MustOpen(const std::string& path, const LedgerOptions& opts = {}) {
  auto l = Ledger::Open(path, opts);
  INFO((l.ok() ? "" : l.error().ToString()));
  REQUIRE(l.ok());
  return std::move(*l);
}

FailoverRecord Failover(int64_t fault_ms, const std::string& trigger = "crash") {
  FailoverRecord f;
  f.trigger = trigger;
  f.drill = trigger == "drill";
  f.reason = "engine a exited on signal 9";
  f.from_slot = "a";
  f.to_slot = "b";
  f.fault_ms = fault_ms;
  f.detected_ms = fault_ms + 2;
  f.swapped_ms = fault_ms + 5;
  return f;
}

// A second connection to the ledger's file, holding `lock` (a BEGIN) until it commits, rolls back or is dropped.
Db Connect(const std::string& path, const char* lock = nullptr) {
  auto db = Db::Open(path, /*create=*/false);
  REQUIRE(db.ok());
  if (lock) REQUIRE(db->Exec(lock).ok());
  return std::move(*db);
}

// A ledger file as an older wsup left it: migrated no further than `version`.
Db AtVersion(const std::string& path, int version) {
  auto db = Db::Open(path, /*create=*/true);
  REQUIRE(db.ok());
  REQUIRE(ConfigureConnection(*db, 1000).ok());
  REQUIRE(Migrate(*db, version).ok());
  return std::move(*db);
}

// What a read returned, which must be `n` rows.
template <typename T>
std::vector<T> Rows(Result<std::vector<T>> rows, size_t n) {
  REQUIRE(rows.ok());
  REQUIRE(rows->size() == n);
  return std::move(*rows);
}

LedgerReader MustRead(const std::string& path) {
  auto reader = LedgerReader::Open(path);
  REQUIRE(reader.ok());
  return std::move(*reader);
}

int Mode(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? static_cast<int>(st.st_mode & 0777) : -1;
}

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::vector<int64_t> FaultTimes(const std::string& path) {
  auto rows = MustRead(path).Failovers();
  REQUIRE(rows.ok());
  std::vector<int64_t> out;
  for (const auto& f : *rows) out.push_back(f.fault_ms);
  return out;
}

std::vector<std::string> Tables(Db& db) {
  std::vector<std::string> names;
  auto st = db.Prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name");
  REQUIRE(st.ok());
  while (true) {
    auto row = st->Step();
    REQUIRE(row.ok());
    if (!*row) break;
    names.push_back(st->Text(0));
  }
  return names;
}

TEST_CASE("ledger: a new ledger gets the latest schema in WAL mode", "[state]") {
  test::TempDir dir;
  std::string path = Ledger::PathIn(dir.path());
  CHECK(path == dir.Join("wsup.db"));
  { auto l = MustOpen(path); }
  Db db = Connect(path);
  CHECK(*SchemaVersion(db) == kSchemaVersion);
  CHECK(*db.QueryText("PRAGMA journal_mode") == "wal");
  CHECK(Tables(db) == std::vector<std::string>{"cache_events", "failovers", "fences", "holder_restarts",
                                                "probe_transitions", "recoveries", "rollouts"});
  CHECK(*db.QueryText("PRAGMA integrity_check") == "ok");
}

TEST_CASE("ledger: migrates a version 1 ledger forward and keeps its rows", "[state]") {
  test::TempDir dir;
  std::string path = dir.Join("wsup.db");
  {
    Db db = AtVersion(path, 1);
    CHECK(*SchemaVersion(db) == 1);
    CHECK(Tables(db) == std::vector<std::string>{"cache_events", "failovers", "recoveries"});
    REQUIRE(db.Exec("INSERT INTO failovers (id, trigger, reason, drill, from_slot, to_slot, fault_ms, detected_ms, "
                     "swapped_ms) VALUES (7, 'probe', 'old row', 0, 'a', 'b', 100, 130, 131)")
                .ok());
  }
  {
    auto l = MustOpen(path);
    auto id = l->RecordFailover(Failover(1000));
    REQUIRE(id.ok());
    CHECK(*id == 8);  // continues after the old rows
    REQUIRE(l->RecordHolderRestart({0, 1000, 3, "exit code 1", true, 12}).ok());
    REQUIRE(l->Flush().ok());
  }
  LedgerReader reader = MustRead(path);
  CHECK(*SchemaVersion(reader.db()) == kSchemaVersion);
  auto rows = Rows(reader.Failovers(), 2);
  CHECK(rows[0].reason == "old row");
  CHECK(rows[0].detect_ms == 30);
  CHECK(rows[1].id == 8);
  auto restarts = reader.HolderRestarts();
  REQUIRE(restarts.ok());
  CHECK(restarts->size() == 1);
}

TEST_CASE("ledger: a fenced engine is a fences row, read back whole, a row without its facts is refused",
          "[state]") {
  test::TempDir dir;
  std::string path = dir.Join("wsup.db");
  {
    auto l = MustOpen(path);
    FenceRecord f;
    f.time_ms = 5000;
    f.slot = "b";
    f.pid = 4242;
    f.slot_state = "standby";
    f.kind = "kv_pool";
    f.pool_owner = "a";
    f.reason = "its /wsup/status says it maps the node's KV pool";
    auto id = l->RecordFence(f);
    REQUIRE(id.ok());
    CHECK(*id == 1);
    f.pool_owner.clear();
    CHECK(*l->RecordFence(f) == 2);
    FenceRecord bad = f;
    bad.kind = "other";
    CHECK(l->RecordFence(bad).status().code() == Code::kInvalidArgument);
    bad = f;
    bad.reason.clear();
    CHECK(l->RecordFence(bad).status().code() == Code::kInvalidArgument);
    REQUIRE(l->Flush().ok());
  }
  LedgerReader reader = MustRead(path);
  auto rows = Rows(reader.Fences(), 2);
  CHECK(rows[0].slot == "b");
  CHECK(rows[0].pid == 4242);
  CHECK(rows[0].slot_state == "standby");
  CHECK(rows[0].pool_owner == "a");
  CHECK(rows[1].pool_owner.empty());
  CHECK(rows[0].reason.find("KV pool") != std::string::npos);
  // The report lists them.
  ReportOptions o;
  o.now_ms = 10'000;
  auto rep = BuildReport(reader, o);
  REQUIRE(rep.ok());
  CHECK(rep->fences.size() == 2);
  CHECK(RenderReportText(*rep).find("engines fenced: 2") != std::string::npos);
  CHECK(nlohmann::json::parse(RenderReportJson(*rep))["fences"][0]["pool_owner"] == "a");
}

TEST_CASE("ledger: migration 6 lets a rollout end interrupted, and keeps the rows and the index", "[state]") {
  test::TempDir dir;
  std::string path = dir.Join("wsup.db");
  {
    Db db = AtVersion(path, 5);
    REQUIRE(db.Exec("INSERT INTO rollouts (id, started_ms, ended_ms, outcome, reason, command_before, command_after, "
                     "steps_json) VALUES (4, 100, 200, 'done', '', '[\"e\"]', '[\"e\",\"-x\"]', '[]'), "
                     "(5, 300, NULL, 'running', '', '[\"e\",\"-x\"]', '[\"e\"]', '[]')")
                .ok());
    // Version 5 refuses the outcome.
    CHECK_FALSE(db.Exec("UPDATE rollouts SET outcome = 'interrupted' WHERE id = 5").ok());
  }
  {
    auto l = MustOpen(path);
    RolloutRecord r;
    r.id = 5;
    r.started_ms = 300;
    r.ended_ms = 400;
    r.outcome = "interrupted";
    r.reason = "the supervisor restarted during step watching";
    r.command_before = "[\"e\",\"-x\"]";
    r.command_after = "[\"e\"]";
    REQUIRE(l->UpdateRollout(r).ok());
    auto id = l->RecordRollout(r);
    REQUIRE(id.ok());
    CHECK(*id == 6);  // continues after the copied rows
    REQUIRE(l->Flush().ok());
    r.outcome = "lost";
    CHECK_FALSE(l->UpdateRollout(r).ok());
  }
  LedgerReader reader = MustRead(path);
  CHECK(*SchemaVersion(reader.db()) == kSchemaVersion);
  auto rows = Rows(reader.Rollouts(), 3);
  CHECK(rows[0].id == 4);
  CHECK(rows[0].outcome == "done");
  CHECK(rows[1].outcome == "interrupted");
  CHECK(rows[1].ended_ms == 400);
  CHECK(rows[2].id == 6);
  CHECK(*reader.db().QueryText("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'rollouts'") ==
        "rollouts_started_ms");
  CHECK(*reader.db().QueryText("PRAGMA integrity_check") == "ok");
}

TEST_CASE("ledger: migration 8 lets a failover's trigger be hang or rollout, and keeps the rows, ids, derived "
          "columns and the index",
          "[state]") {
  test::TempDir dir;
  std::string path = dir.Join("wsup.db");
  {
    Db db = AtVersion(path, 7);
    REQUIRE(db.Exec("INSERT INTO failovers (id, trigger, reason, drill, from_slot, to_slot, fault_ms, detected_ms, "
                    "swapped_ms, first_ok_ms, reconstructed, gone_ms, kv_full_ms) VALUES "
                    "(7, 'probe', 'the front saw it silent', 0, 'a', 'b', 1000, 1200, 1201, 1250, 0, 1300, 1310), "
                    "(8, 'drill', 'planned swap (rollout)', 1, 'b', 'a', 2000, 2000, 2003, NULL, 1, NULL, NULL)")
                .ok());
    // Version 7 refuses the new triggers.
    CHECK_FALSE(db.Exec("UPDATE failovers SET trigger = 'hang' WHERE id = 7").ok());
  }
  {
    auto l = MustOpen(path);
    for (const char* trigger : {"hang", "rollout"}) {
      FailoverRecord f = Failover(3000);
      f.trigger = trigger;
      REQUIRE(l->RecordFailover(f).ok());
    }
    REQUIRE(l->Flush().ok());
    FailoverRecord bad = Failover(4000);
    bad.trigger = "sneeze";
    auto refused = l->RecordFailover(bad);
    REQUIRE_FALSE(refused.ok());
    CHECK(refused.error().message().find("crash, probe, drill, hang, rollout") != std::string::npos);
  }
  LedgerReader reader = MustRead(path);
  CHECK(*SchemaVersion(reader.db()) == kSchemaVersion);
  auto rows = Rows(reader.Failovers(), 4);
  CHECK(rows[0].id == 7);
  CHECK(rows[0].detect_ms == 200);
  CHECK(rows[0].outage_ms == 250);
  CHECK(rows[0].kv_back_ms == 310);
  CHECK(rows[0].gone_ms == 1300);
  CHECK(rows[1].id == 8);
  CHECK(rows[1].reconstructed);
  CHECK_FALSE(rows[1].first_ok_ms.has_value());
  CHECK(rows[2].trigger == "hang");
  CHECK(rows[2].id == 9);  // continues after the copied rows
  CHECK(rows[3].trigger == "rollout");
  CHECK(*reader.db().QueryText("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'failovers'") ==
        "failovers_fault_ms");
  CHECK(*reader.db().QueryText("PRAGMA integrity_check") == "ok");
}

TEST_CASE("ledger: migrating twice is a no-op, a newer schema is refused", "[state]") {
  test::TempDir dir;
  std::string path = dir.Join("wsup.db");
  { auto l = MustOpen(path); }
  { auto l = MustOpen(path); }
  {
    Db db = Connect(path);
    REQUIRE(db.Exec("PRAGMA user_version = 99").ok());
  }
  auto l = Ledger::Open(path);
  REQUIRE_FALSE(l.ok());
  CHECK(l.error().code() == Code::kRefused);
  CHECK(l.error().message().find("99") != std::string::npos);
  CHECK(l.error().message().find(path) != std::string::npos);
  auto r = LedgerReader::Open(path);
  REQUIRE_FALSE(r.ok());
  CHECK(r.error().code() == Code::kRefused);
}

TEST_CASE("ledger: every kind of row round-trips", "[state]") {
  test::TempDir dir;
  std::string path = dir.Join("wsup.db");
  auto l = MustOpen(path);
  FailoverRecord f = Failover(1'700'000'000'000);
  f.trigger = "probe";
  f.reason = "3 probe failures: timeout after 800 ms";
  auto fid = l->RecordFailover(f);
  REQUIRE(fid.ok());
  CHECK(*fid == 1);
  REQUIRE(l->SetFailoverFirstOk(*fid, f.fault_ms + 40).ok());
  REQUIRE(l->SetFailoverGone(*fid, f.fault_ms + 90).ok());
  REQUIRE(l->SetFailoverKvFull(*fid, f.fault_ms + 95).ok());

  CacheEventRecord hit{0, f.fault_ms + 10, "b", 0, "hit", "daemon", "", "", 3, std::nullopt};
  CacheEventRecord miss{0, f.fault_ms + 11, "a", 1, "miss", "client", "fingerprint",
                        R"([{"field":"tp_rank","ours":"1","theirs":"0"}])", std::nullopt, 5400};
  REQUIRE(*l->RecordCacheEvent(hit) == 1);
  REQUIRE(*l->RecordCacheEvent(miss) == 2);

  RecoveryRecord rec;
  rec.failover_id = *fid;
  rec.slot = "a";
  rec.cause = "probe";
  rec.fault_ms = f.fault_ms;
  rec.ready_ms = f.fault_ms + 5500;
  rec.cache_result = "miss";
  rec.cache_reason = "fingerprint";
  rec.phases_json = R"({"attach_ms":0,"load_ms":5400,"graphs_ms":90})";
  REQUIRE(*l->RecordRecovery(rec) == 1);
  RecoveryRecord bare = rec;
  bare.failover_id.reset();
  bare.cause = "cold start";
  bare.cache_result = "off";
  bare.cache_reason = "";
  bare.phases_json = "";
  REQUIRE(*l->RecordRecovery(bare) == 2);
  REQUIRE(*l->RecordHolderRestart({0, f.fault_ms, 2, "killed by signal 9", true, 7}) == 1);
  REQUIRE(*l->RecordProbeTransition({0, f.fault_ms + 1, "a", "healthy", "unhealthy", "3 failures"}) == 1);
  REQUIRE(l->Flush().ok());
  auto stats = l->stats();
  CHECK(stats.queued == 10);
  CHECK(stats.committed == 10);
  CHECK(stats.failed == 0);
  CHECK(stats.waiting == 0);

  LedgerReader reader = MustRead(path);
  auto fo = Rows(reader.Failovers(), 1);
  const auto& g = fo[0];
  CHECK(g.id == 1);
  CHECK(g.trigger == "probe");
  CHECK(g.reason == f.reason);
  CHECK_FALSE(g.drill);
  CHECK(g.from_slot == "a");
  CHECK(g.to_slot == "b");
  CHECK(g.fault_ms == f.fault_ms);
  CHECK(g.detected_ms == f.detected_ms);
  CHECK(g.swapped_ms == f.swapped_ms);
  CHECK(g.first_ok_ms == f.fault_ms + 40);
  CHECK(g.detect_ms == 2);
  CHECK(g.swap_ms == 3);
  CHECK(g.failover_ms == 5);
  CHECK(g.outage_ms == 40);
  CHECK(g.kv_full_ms == f.fault_ms + 95);
  CHECK(g.kv_back_ms == 95);
  CHECK(g.gone_ms == f.fault_ms + 90);

  auto ce = Rows(reader.CacheEvents(), 2);
  CHECK(ce[0].result == "hit");
  CHECK(ce[0].rank == 0);
  CHECK(ce[0].attach_ms == 3);
  CHECK_FALSE(ce[0].load_ms.has_value());
  CHECK(ce[0].miss_reason.empty());
  CHECK(ce[1].miss_reason == "fingerprint");
  CHECK(ce[1].diff_json == miss.diff_json);
  CHECK(ce[1].mode == "client");
  CHECK(ce[1].load_ms == 5400);

  auto rc = Rows(reader.Recoveries(), 2);
  CHECK(rc[0].failover_id == 1);
  CHECK(rc[0].recovery_ms == 5500);
  CHECK(rc[0].cache_reason == "fingerprint");
  CHECK(rc[0].phases_json == rec.phases_json);
  CHECK_FALSE(rc[1].failover_id.has_value());
  CHECK(rc[1].phases_json == "{}");
  CHECK(rc[1].cache_result == "off");

  auto hr = Rows(reader.HolderRestarts(), 1);
  CHECK(hr[0].rank == 2);
  CHECK(hr[0].from_fds);
  CHECK(hr[0].restart_ms == 7);
  auto pt = Rows(reader.ProbeTransitions(), 1);
  CHECK(pt[0].to_state == "unhealthy");
  CHECK(pt[0].cause == "3 failures");

  // Ids keep counting after a reopen.
  l->Close();
  auto again = MustOpen(path);
  CHECK(*again->RecordFailover(Failover(5)) == 2);
  CHECK(*again->RecordRecovery(bare) == 3);
}

TEST_CASE("ledger: rows outside the allowed values are refused at once", "[state]") {
  test::TempDir dir;
  auto l = MustOpen(dir.Join("wsup.db"));
  auto bad = l->RecordFailover(Failover(1, "panic"));
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().code() == Code::kInvalidArgument);
  CHECK(bad.error().message().find("crash, probe, drill") != std::string::npos);
  CacheEventRecord ce{0, 1, "a", std::nullopt, "maybe", "daemon", "", "", std::nullopt, std::nullopt};
  CHECK_FALSE(l->RecordCacheEvent(ce).ok());
  ce.result = "miss";  // a miss needs its reason
  CHECK_FALSE(l->RecordCacheEvent(ce).ok());
  ce.miss_reason = "cold";
  ce.diff_json = "{not json";
  CHECK_FALSE(l->RecordCacheEvent(ce).ok());
  RecoveryRecord r;
  r.slot = "a";
  r.cause = "crash";
  r.cache_result = "hit";
  r.phases_json = "[1, 2]";  // not an object
  CHECK_FALSE(l->RecordRecovery(r).ok());
  CHECK_FALSE(l->RecordProbeTransition({0, 1, "a", "healthy", "sick", "x"}).ok());
  CHECK_FALSE(l->SetFailoverFirstOk(42, 5).ok());
  CHECK(l->Flush().ok());
  CHECK(l->stats().queued == 0);
  l->Close();
  auto after = l->RecordFailover(Failover(1));
  REQUIRE_FALSE(after.ok());
  CHECK(after.error().code() == Code::kUnavailable);
}

TEST_CASE("ledger: a bad path gives a clear error", "[state]") {
  test::TempDir dir;
  auto missing_dir = Ledger::Open(dir.Join("no/such/folder/wsup.db"));
  REQUIRE_FALSE(missing_dir.ok());
  CHECK(missing_dir.error().code() == Code::kNotFound);
  CHECK(missing_dir.error().message().find("state_dir") != std::string::npos);

  auto is_dir = Ledger::Open(dir.path());
  REQUIRE_FALSE(is_dir.ok());
  CHECK(is_dir.error().message().find(dir.path()) == 0);

  std::string garbage = dir.Join("garbage.db");
  REQUIRE(WriteFileAtomic(garbage, std::string(4096, 'x')).ok());
  auto corrupt = Ledger::Open(garbage);
  REQUIRE_FALSE(corrupt.ok());
  CHECK(corrupt.error().code() == Code::kCorrupt);
  CHECK(corrupt.error().message().find("move it aside") != std::string::npos);

  auto no_reader = LedgerReader::Open(dir.Join("absent.db"));
  REQUIRE_FALSE(no_reader.ok());
  CHECK(no_reader.error().code() == Code::kNotFound);
  CHECK(no_reader.error().message().find("absent.db") != std::string::npos);

  if (::geteuid() != 0) {  // root ignores permissions
    std::string ro = dir.Join("ro");
    REQUIRE(::mkdir(ro.c_str(), 0500) == 0);
    auto denied = Ledger::Open(ro + "/wsup.db");
    REQUIRE_FALSE(denied.ok());
    CHECK(denied.error().message().find("state_dir") != std::string::npos);
  }
}

TEST_CASE("ledger: writes wait out another connection's lock - a full queue drops and counts", "[state]") {
  test::TempDir dir;
  std::string path = dir.Join("wsup.db");
  const LedgerOptions opts{.max_queue = 2, .busy_timeout_ms = 20'000};
  auto l = MustOpen(path, opts);
  Db other = Connect(path, "BEGIN IMMEDIATE");  // the writer must wait
  int accepted = 0, refused = 0;
  for (int i = 0; i < 10; ++i) {
    auto id = l->RecordFailover(Failover(i));
    if (id.ok()) {
      ++accepted;
    } else {
      ++refused;
      CHECK(id.error().code() == Code::kUnavailable);
      CHECK(id.error().message().find("queue full") != std::string::npos);
    }
  }
  // Whatever the writer thread took before it blocked on the lock is at most
  // one batch (no more than a full queue), plus a full queue behind it: the
  // bound holds however the thread is scheduled.
  CHECK(accepted + refused == 10);
  CHECK(accepted <= 2 * static_cast<int>(opts.max_queue));
  CHECK(refused >= 10 - 2 * static_cast<int>(opts.max_queue));
  REQUIRE(other.Exec("COMMIT").ok());
  REQUIRE(l->Flush().ok());
  auto s = l->stats();
  CHECK(s.committed == static_cast<uint64_t>(accepted));
  CHECK(s.dropped == static_cast<uint64_t>(refused));
}

TEST_CASE("ledger: a failover row that could not be written - its first_ok_ms names that cause", "[state]") {
  test::TempDir dir;
  std::string path = dir.Join("wsup.db");
  const LedgerOptions opts{.busy_timeout_ms = 50, .retry_ms = 100};
  auto l = MustOpen(path, opts);
  Db other = Connect(path, "BEGIN EXCLUSIVE");
  auto id = l->RecordFailover(Failover(1000));
  REQUIRE(id.ok());
  Status lost = l->Flush();
  REQUIRE_FALSE(lost.ok());
  CHECK(lost.error().message().find("locked") != std::string::npos);
  REQUIRE(other.Exec("ROLLBACK").ok());
  // The lock is gone, but the row it kept out is gone too: the follow-up
  // write fails and says why, instead of a bare "no failover with id".
  REQUIRE(l->SetFailoverFirstOk(*id, 1040).ok());
  Status follow = l->Flush();
  REQUIRE_FALSE(follow.ok());
  INFO(follow.error().message());
  CHECK(follow.error().message().find("lost with the failover's own row") != std::string::npos);
  CHECK(follow.error().message().find("locked") != std::string::npos);
  auto s = l->stats();
  CHECK(s.failed == 2);
  CHECK(s.last_error.find("locked") != std::string::npos);
  // Rows after it are written again.
  REQUIRE(l->RecordFailover(Failover(2000)).ok());
  CHECK(l->Flush().ok());
}

TEST_CASE("ledger: its files are private - made 0600, and a looser ledger is tightened", "[state]") {
  test::TempDir dir;
  std::string path = dir.Join("wsup.db");
  const mode_t umask_before = ::umask(022);  // SQLite alone would make them 0644
  {
    auto l = MustOpen(path);
    REQUIRE(l->RecordFailover(Failover(1000)).ok());
    REQUIRE(l->Flush().ok());
    for (const char* suffix : {"", "-wal", "-shm", "-lost"}) {
      INFO(path + suffix);
      CHECK(Mode(path + suffix) == 0600);
    }
  }
  // A ledger left readable by everyone (an older wsup made it 0644), with
  // its -wal and -shm open in another connection.
  REQUIRE(::chmod(path.c_str(), 0644) == 0);
  Db other = Connect(path);
  REQUIRE(other.QueryInt("SELECT COUNT(*) FROM failovers").ok());
  REQUIRE(Mode(path + "-wal") == 0644);
  {
    auto l = MustOpen(path);
    for (const char* suffix : {"", "-wal", "-shm"}) {
      INFO(path + suffix);
      CHECK(Mode(path + suffix) == 0600);
    }
  }
  ::umask(umask_before);
}

TEST_CASE("ledger: a lock held past the busy timeout is waited out - the retries write the row", "[state]") {
  test::TempDir dir;
  std::string path = dir.Join("wsup.db");
  const LedgerOptions opts{.busy_timeout_ms = 50, .retry_ms = 60'000};
  auto l = MustOpen(path, opts);
  Db other = Connect(path, "BEGIN EXCLUSIVE");
  uint64_t seq = 0;
  REQUIRE(l->RecordFailover(Failover(1000), &seq).ok());
  // Held past several busy timeouts: the row is still waiting, not lost.
  REQUIRE(test::WaitFor([&] { return l->stats().retries >= 3; }, std::chrono::seconds(30)));
  auto during = l->stats();
  CHECK(during.retrying);
  CHECK(during.retry_error.find("locked") != std::string::npos);
  CHECK(during.failed == 0);
  CHECK(l->HandledSeq() < seq);
  REQUIRE(other.Exec("ROLLBACK").ok());
  REQUIRE(l->Flush().ok());
  CHECK_FALSE(l->LostRow(seq).has_value());
  auto after = l->stats();
  CHECK(after.committed == 1);
  CHECK(after.failed == 0);
  CHECK(after.losses.rows == 0);
  CHECK_FALSE(after.retrying);
  CHECK(FaultTimes(path) == std::vector<int64_t>{1000});
}

TEST_CASE("ledger: rows lost after the retries are counted by table, kept across a restart and reported", "[state]") {
  test::TempDir dir;
  std::string path = dir.Join("wsup.db");
  const LedgerOptions opts{.busy_timeout_ms = 20, .retry_ms = 200};
  const int64_t before = NowMs();
  {
    auto l = MustOpen(path, opts);
    REQUIRE(l->RecordFailover(Failover(500)).ok());
    REQUIRE(l->Flush().ok());
    Db other = Connect(path, "BEGIN EXCLUSIVE");
    uint64_t failover_seq = 0, first_ok_seq = 0;
    auto id = l->RecordFailover(Failover(1000), &failover_seq);
    REQUIRE(id.ok());
    REQUIRE(l->SetFailoverFirstOk(*id, 1040, &first_ok_seq).ok());
    REQUIRE(l->RecordProbeTransition({0, 1001, "a", "healthy", "unhealthy", "3 failures"}).ok());
    Status lost = l->Flush();
    REQUIRE_FALSE(lost.ok());
    CHECK(lost.error().message().find("locked") != std::string::npos);
    auto why = l->LostRow(failover_seq);
    REQUIRE(why.has_value());
    CHECK(why->find("locked") != std::string::npos);
    CHECK(why->find("retries") != std::string::npos);
    CHECK(l->LostRow(first_ok_seq).has_value());
    // A row refused for its values is lost as well.
    CHECK_FALSE(l->RecordFailover(Failover(2000, "meteor")).ok());
    REQUIRE(other.Exec("ROLLBACK").ok());
    auto s = l->stats();
    CHECK(s.failed == 3);
    CHECK(s.refused == 1);
    CHECK(s.losses.rows == 4);
    CHECK(s.losses.by_table == std::map<std::string, int64_t>{
                                   {"failovers", 2}, {"failover_times", 1}, {"probe_transitions", 1}});
    CHECK(s.losses.first_ms >= before);
    CHECK(s.losses.last_ms >= s.losses.first_ms);
  }
  CHECK(Mode(LossFilePath(path)) == 0600);
  struct stat st {};
  REQUIRE(::stat(LossFilePath(path).c_str(), &st) == 0);
  CHECK(st.st_size == static_cast<off_t>(kLossFileBytes));
  {
    // A restart: the count is still there, and this run lost nothing yet.
    auto l = MustOpen(path, opts);
    auto s = l->stats();
    CHECK(s.losses.rows == 4);
    CHECK(s.failed == 0);
  }
  LedgerReader reader = MustRead(path);
  ReportOptions o;
  o.now_ms = NowMs();
  auto rep = BuildReport(reader, o);
  REQUIRE(rep.ok());
  REQUIRE(rep->lost.has_value());
  std::string text = RenderReportText(*rep);
  INFO(text);
  CHECK(text.find("ledger: 4 row(s) NOT recorded (1 failover_times, 2 failovers, 1 probe_transitions)") !=
        std::string::npos);
  CHECK(text.find("failovers: 1 (crash 1, probe 0, hang 0, rollout 0, drills 0), and 2 more NOT recorded") != std::string::npos);
  auto j = nlohmann::json::parse(RenderReportJson(*rep));
  CHECK(j["lost"]["rows"] == 4);
  CHECK(j["lost"]["by_table"]["failovers"] == 2);
  // A window after the last loss does not show it.
  o.now_ms += 3'600'000;
  o.since_ms = 60'000;
  auto later = BuildReport(reader, o);
  REQUIRE(later.ok());
  CHECK_FALSE(later->lost.has_value());
  CHECK(nlohmann::json::parse(RenderReportJson(*later))["lost"].is_null());
}

TEST_CASE("ledger: a record of lost rows that cannot be read is said, and counting starts again", "[state]") {
  test::TempDir dir;
  std::string path = dir.Join("wsup.db");
  REQUIRE(WriteFileAtomic(LossFilePath(path), "{\"rows\": \"many\"}", 0600).ok());
  auto bad = ReadLosses(path);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().message().find(LossFilePath(path)) == 0);
  CHECK(bad.error().message().find("move it aside") != std::string::npos);
  {
    auto l = MustOpen(path);
    CHECK(l->stats().loss_file_error.find(LossFilePath(path)) != std::string::npos);
    CHECK(l->stats().losses.rows == 0);
  }
  // Written again, whole.
  auto again = ReadLosses(path);
  REQUIRE(again.ok());
  CHECK(again->rows == 0);
}

TEST_CASE("ledger: deleted under a running ledger, the file is made again with the rows it held", "[state]") {
  for (bool with_wal : {false, true}) {
    INFO((with_wal ? "wsup.db, -wal and -shm deleted" : "wsup.db deleted"));
    test::TempDir dir;
    std::string path = dir.Join("wsup.db");
    auto l = MustOpen(path);
    REQUIRE(l->RecordFailover(Failover(1000)).ok());
    REQUIRE(l->Flush().ok());
    REQUIRE(::unlink(path.c_str()) == 0);
    if (with_wal) {
      // (Gone already when the writer's idle check came between.)
      ::unlink((path + "-wal").c_str());
      ::unlink((path + "-shm").c_str());
    }
    REQUIRE(l->RecordFailover(Failover(2000)).ok());
    REQUIRE(l->Flush().ok());
    auto s = l->stats();
    CHECK(s.reopens == 1);
    CHECK(s.reopened.find("was deleted") != std::string::npos);
    REQUIRE(l->RecordFailover(Failover(3000)).ok());
    REQUIRE(l->Flush().ok());
    CHECK(l->stats().reopens == 1);
    CHECK(l->stats().losses.rows == 0);
    l.reset();
    // What a restart finds: every row, in a private file.
    CHECK(FaultTimes(path) == std::vector<int64_t>{1000, 2000, 3000});
    CHECK(Mode(path) == 0600);
  }
}

TEST_CASE("ledger: replaced under a running ledger, the new file is used and its ids are not taken again",
          "[state]") {
  test::TempDir dir;
  std::string path = dir.Join("wsup.db");
  std::string other = dir.Join("other.db");
  auto l = MustOpen(path);
  REQUIRE(l->RecordFailover(Failover(1000)).ok());
  REQUIRE(l->Flush().ok());
  {
    auto o = MustOpen(other);
    for (int i = 0; i < 5; ++i) REQUIRE(o->RecordFailover(Failover(100 + i)).ok());
  }
  REQUIRE(::rename(other.c_str(), path.c_str()) == 0);
  // An id handed out before the writer saw the new file (2) is taken there:
  // that row is lost, and counted (unless the writer's idle check saw the
  // new file first). The next ones get new ids.
  auto taken = l->RecordFailover(Failover(9000));
  REQUIRE(taken.ok());
  const bool collided = *taken == 2;
  CHECK(l->Flush().ok() == !collided);
  auto s = l->stats();
  CHECK(s.reopens == 1);
  CHECK(s.reopened.find("was replaced") != std::string::npos);
  CHECK(s.losses.rows == (collided ? 1 : 0));
  auto next = l->RecordFailover(Failover(9001));
  REQUIRE(next.ok());
  CHECK(*next == (collided ? 6 : 7));
  REQUIRE(l->Flush().ok());
  l.reset();
  CHECK(FaultTimes(path) == (collided ? std::vector<int64_t>{100, 101, 102, 103, 104, 9001}
                                      : std::vector<int64_t>{100, 101, 102, 103, 104, 9000, 9001}));
}

TEST_CASE("ledger: kv_full_ms of a failover never recorded is refused - a failover without it reads as none", "[state]") {
  test::TempDir dir;
  std::string path = dir.Join("wsup.db");
  auto l = MustOpen(path);
  auto bad = l->SetFailoverKvFull(7, 5);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.error().message().find("RecordFailover") != std::string::npos);
  auto fid = l->RecordFailover(Failover(1'700'000'000'000));
  REQUIRE(fid.ok());
  REQUIRE(l->Flush().ok());
  LedgerReader reader = MustRead(path);
  auto fo = Rows(reader.Failovers(), 1);
  CHECK_FALSE(fo[0].kv_full_ms.has_value());
  CHECK_FALSE(fo[0].kv_back_ms.has_value());
}

}  // namespace
}  // namespace wsup
