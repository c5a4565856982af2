#include "state/schema.h"

#include <string>

namespace wsup {
namespace {

struct Migration {
  int version;
  const char* sql;
};

// Never edit a migration that has shipped: add a new one.
constexpr Migration kMigrations[] = {
    {1, R"sql(
CREATE TABLE failovers (
  id           INTEGER PRIMARY KEY,
  trigger      TEXT    NOT NULL CHECK (trigger IN ('crash', 'probe', 'drill')),
  reason       TEXT    NOT NULL,
  drill        INTEGER NOT NULL CHECK (drill IN (0, 1)),
  from_slot    TEXT    NOT NULL,
  to_slot      TEXT    NOT NULL,
  fault_ms     INTEGER NOT NULL,
  detected_ms  INTEGER NOT NULL,
  swapped_ms   INTEGER NOT NULL,
  first_ok_ms  INTEGER,
  detect_ms    INTEGER GENERATED ALWAYS AS (detected_ms - fault_ms) VIRTUAL,
  swap_ms      INTEGER GENERATED ALWAYS AS (swapped_ms - detected_ms) VIRTUAL,
  failover_ms  INTEGER GENERATED ALWAYS AS (swapped_ms - fault_ms) VIRTUAL,
  outage_ms    INTEGER GENERATED ALWAYS AS (first_ok_ms - fault_ms) VIRTUAL
);
CREATE TABLE cache_events (
  id           INTEGER PRIMARY KEY,
  time_ms      INTEGER NOT NULL,
  slot         TEXT    NOT NULL,
  rank         INTEGER,
  result       TEXT    NOT NULL CHECK (result IN ('hit', 'miss')),
  mode         TEXT    NOT NULL,
  miss_reason  TEXT,
  diff_json    TEXT,
  attach_ms    INTEGER,
  load_ms      INTEGER
);
CREATE TABLE recoveries (
  id           INTEGER PRIMARY KEY,
  failover_id  INTEGER,
  slot         TEXT    NOT NULL,
  cause        TEXT    NOT NULL,
  fault_ms     INTEGER NOT NULL,
  ready_ms     INTEGER NOT NULL,
  recovery_ms  INTEGER GENERATED ALWAYS AS (ready_ms - fault_ms) VIRTUAL,
  cache_result TEXT    NOT NULL CHECK (cache_result IN ('hit', 'miss', 'off')),
  cache_reason TEXT,
  phases_json  TEXT    NOT NULL DEFAULT '{}'
);
)sql"},
    {2, R"sql(
CREATE TABLE holder_restarts (
  id           INTEGER PRIMARY KEY,
  time_ms      INTEGER NOT NULL,
  rank         INTEGER NOT NULL,
  reason       TEXT    NOT NULL,
  from_fds     INTEGER NOT NULL CHECK (from_fds IN (0, 1)),
  restart_ms   INTEGER NOT NULL
);
CREATE TABLE probe_transitions (
  id           INTEGER PRIMARY KEY,
  time_ms      INTEGER NOT NULL,
  slot         TEXT    NOT NULL,
  from_state   TEXT    NOT NULL,
  to_state     TEXT    NOT NULL,
  cause        TEXT    NOT NULL
);
CREATE INDEX failovers_fault_ms ON failovers (fault_ms);
CREATE INDEX cache_events_time_ms ON cache_events (time_ms);
CREATE INDEX recoveries_fault_ms ON recoveries (fault_ms);
)sql"},
    {3, R"sql(
ALTER TABLE failovers ADD COLUMN reconstructed INTEGER NOT NULL DEFAULT 0 CHECK (reconstructed IN (0, 1));
)sql"},
    {4, R"sql(
ALTER TABLE failovers ADD COLUMN gone_ms INTEGER;
ALTER TABLE failovers ADD COLUMN kv_full_ms INTEGER;
ALTER TABLE failovers ADD COLUMN kv_back_ms INTEGER GENERATED ALWAYS AS (kv_full_ms - fault_ms) VIRTUAL;
)sql"},
    {5, R"sql(
CREATE TABLE rollouts (
  id             INTEGER PRIMARY KEY,
  started_ms     INTEGER NOT NULL,
  ended_ms       INTEGER,
  outcome        TEXT    NOT NULL CHECK (outcome IN ('running', 'done', 'rolled_back', 'refused', 'failed')),
  reason         TEXT    NOT NULL DEFAULT '',
  command_before TEXT    NOT NULL,
  command_after  TEXT    NOT NULL,
  steps_json     TEXT    NOT NULL DEFAULT '[]'
);
CREATE INDEX rollouts_started_ms ON rollouts (started_ms);
)sql"},
    // 'interrupted': a roll cut by the supervisor's restart or the node's
    // stop. SQLite cannot change a CHECK in place: the table is made again
    // and its rows copied, ids kept.
    {6, R"sql(
CREATE TABLE rollouts_v6 (
  id             INTEGER PRIMARY KEY,
  started_ms     INTEGER NOT NULL,
  ended_ms       INTEGER,
  outcome        TEXT    NOT NULL CHECK (outcome IN ('running', 'done', 'rolled_back', 'refused', 'failed', 'interrupted')),
  reason         TEXT    NOT NULL DEFAULT '',
  command_before TEXT    NOT NULL,
  command_after  TEXT    NOT NULL,
  steps_json     TEXT    NOT NULL DEFAULT '[]'
);
INSERT INTO rollouts_v6 (id, started_ms, ended_ms, outcome, reason, command_before, command_after, steps_json)
  SELECT id, started_ms, ended_ms, outcome, reason, command_before, command_after, steps_json FROM rollouts;
DROP TABLE rollouts;
ALTER TABLE rollouts_v6 RENAME TO rollouts;
CREATE INDEX rollouts_started_ms ON rollouts (started_ms);
)sql"},
    // An engine killed for mapping the KV pool unasked (supervisor/kv_pool.cc).
    {7, R"sql(
CREATE TABLE fences (
  id           INTEGER PRIMARY KEY,
  time_ms      INTEGER NOT NULL,
  slot         TEXT    NOT NULL,
  pid          INTEGER NOT NULL,
  slot_state   TEXT    NOT NULL,
  kind         TEXT    NOT NULL CHECK (kind IN ('kv_pool')),
  pool_owner   TEXT,
  reason       TEXT    NOT NULL
);
CREATE INDEX fences_time_ms ON fences (time_ms);
)sql"},
    // Triggers 'hang' (an engine that stopped answering) and 'rollout' (a
    // rolling upgrade's planned swap). The table is made again, as in
    // version 6, its columns in their order, its rows copied with their ids.
    {8, R"sql(
CREATE TABLE failovers_v8 (
  id INTEGER PRIMARY KEY,
  trigger TEXT NOT NULL CHECK (trigger IN ('crash', 'probe', 'drill', 'hang', 'rollout')),
  reason TEXT NOT NULL, drill INTEGER NOT NULL CHECK (drill IN (0, 1)),
  from_slot TEXT NOT NULL, to_slot TEXT NOT NULL,
  fault_ms INTEGER NOT NULL, detected_ms INTEGER NOT NULL, swapped_ms INTEGER NOT NULL, first_ok_ms INTEGER,
  detect_ms INTEGER GENERATED ALWAYS AS (detected_ms - fault_ms) VIRTUAL,
  swap_ms INTEGER GENERATED ALWAYS AS (swapped_ms - detected_ms) VIRTUAL,
  failover_ms INTEGER GENERATED ALWAYS AS (swapped_ms - fault_ms) VIRTUAL,
  outage_ms INTEGER GENERATED ALWAYS AS (first_ok_ms - fault_ms) VIRTUAL,
  reconstructed INTEGER NOT NULL DEFAULT 0 CHECK (reconstructed IN (0, 1)),
  gone_ms INTEGER, kv_full_ms INTEGER,
  kv_back_ms INTEGER GENERATED ALWAYS AS (kv_full_ms - fault_ms) VIRTUAL
);
INSERT INTO failovers_v8 (id, trigger, reason, drill, from_slot, to_slot, fault_ms, detected_ms, swapped_ms,
                          first_ok_ms, reconstructed, gone_ms, kv_full_ms)
  SELECT id, trigger, reason, drill, from_slot, to_slot, fault_ms, detected_ms, swapped_ms,
         first_ok_ms, reconstructed, gone_ms, kv_full_ms FROM failovers;
DROP TABLE failovers;
ALTER TABLE failovers_v8 RENAME TO failovers;
CREATE INDEX failovers_fault_ms ON failovers (fault_ms);
)sql"},
};

static_assert(sizeof(kMigrations) / sizeof(kMigrations[0]) == kSchemaVersion,
              "one migration per schema version");

}  // namespace

Result<int> SchemaVersion(Db& db) {
  WSUP_ASSIGN_OR_RETURN(int64_t v, db.QueryInt("PRAGMA user_version"));
  return static_cast<int>(v);
}

Status ConfigureConnection(Db& db, int busy_timeout_ms) {
  // busy_timeout first, so that switching to WAL waits for another opener.
  WSUP_RETURN_IF_ERROR(db.Exec("PRAGMA busy_timeout = " + std::to_string(busy_timeout_ms)));
  WSUP_ASSIGN_OR_RETURN(std::string mode, db.QueryText("PRAGMA journal_mode = WAL"));
  if (mode != "wal")
    return IoError(db.path() + ": cannot switch to WAL journal mode (still \"" + mode +
                   "\"); the ledger must be on a local file system that supports shared memory (not NFS)");
  // FULL: every commit fsyncs the WAL, so a committed row survives a process
  // kill AND a power loss (node loss is one of the faults wsup records).
  return db.Exec("PRAGMA synchronous = FULL");
}

Status Migrate(Db& db, int target) {
  if (target < 0 || target > kSchemaVersion)
    return Internal("schema target version " + std::to_string(target) + " is outside 0.." +
                    std::to_string(kSchemaVersion));
  // The common case, an up-to-date ledger, takes no write lock.
  WSUP_ASSIGN_OR_RETURN(int before, SchemaVersion(db));
  if (before >= target && before <= kSchemaVersion) return Status::Ok();
  for (const Migration& m : kMigrations) {
    if (m.version > target) break;
    // Read the version inside the write transaction: a second process that
    // opened the same file at the same moment cannot apply a step twice.
    WSUP_RETURN_IF_ERROR(db.Exec("BEGIN IMMEDIATE"));
    auto current = SchemaVersion(db);
    if (!current.ok()) {
      (void)db.Exec("ROLLBACK");
      return current.error();
    }
    if (*current > kSchemaVersion) {
      (void)db.Exec("ROLLBACK");
      return Refused(db.path() + ": the ledger has schema version " + std::to_string(*current) +
                     " but this wsup knows versions up to " + std::to_string(kSchemaVersion) +
                     "; it was written by a newer wsup: run that version, or point node.state_dir at another folder");
    }
    if (*current >= m.version) {
      WSUP_RETURN_IF_ERROR(db.Exec("COMMIT"));
      continue;
    }
    Status st = db.Exec(m.sql);
    if (st.ok()) st = db.Exec("PRAGMA user_version = " + std::to_string(m.version));
    if (!st.ok()) {
      (void)db.Exec("ROLLBACK");
      return st.error().With("migrating the ledger to schema version " + std::to_string(m.version));
    }
    WSUP_RETURN_IF_ERROR(db.Exec("COMMIT"));
  }
  return Status::Ok();
}

}  // namespace wsup
