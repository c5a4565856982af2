// The ledger's schema and its forward migrations.
//
// The schema version lives in `PRAGMA user_version`. Each migration moves the
// database from version N-1 to N inside one transaction that also sets
// user_version, so a crash leaves either the old or the new schema, never a
// mix. Migrations only ever go forward; a database written by a newer wsup
// (a version above kSchemaVersion) is refused rather than guessed at.
// docs/state.md documents every table and column.
//
// Thread-safety: operate on a Db owned by the calling thread.
#pragma once

#include "common/status.h"
#include "state/sqlite.h"

namespace wsup {

// Version 1: failovers, cache_events, recoveries.
// Version 2: holder_restarts, probe_transitions, and time indexes.
// Version 3: failovers.reconstructed (recorded by a restarted supervisor).
// Version 4: failovers.gone_ms, kv_full_ms (and the derived kv_back_ms).
// Version 5: rollouts.
// Version 6: rollouts.outcome may be 'interrupted'.
// Version 7: fences.
inline constexpr int kSchemaVersion = 8;

// The database's user_version.
Result<int> SchemaVersion(Db& db);

// Applies every migration above the current version up to `target`.
// Errors name the file, the version and the fix.
Status Migrate(Db& db, int target = kSchemaVersion);

// Sets the pragmas every ledger connection uses: WAL, synchronous=FULL,
// busy timeout. See docs/state.md for why.
Status ConfigureConnection(Db& db, int busy_timeout_ms);

}  // namespace wsup
