// The ledger's record of the rows it could not write: `<ledger>-lost`
// beside the ledger (`<state_dir>/wsup.db-lost`).
//
// A row the ledger loses (a full disk, a lock held past the retries, a full
// queue) cannot be counted in the ledger itself: the database is what just
// failed. The count goes to this small side file instead, so that `wsup
// report` and `wsup status` still show the loss after a restart. The file
// has a fixed size (kLossFileBytes), reserved when it is created and then
// rewritten in place: rewriting blocks a file already has needs no free
// space, so the count is kept on the very disk that is full.
//
// Contents: one JSON object padded with spaces to kLossFileBytes:
//   {"rows": 5, "by_table": {"failovers": 2, ...}, "first_ms": ..., "last_ms": ..., "last_error": "..."}
// docs/state.md documents it.
//
// Thread-safety: LossFile belongs to one thread at a time (the ledger's
// writer); the functions are pure or read only.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <sys/types.h>

#include "common/status.h"
#include "common/unique_fd.h"

namespace wsup {

inline constexpr size_t kLossFileBytes = 4096;

struct LedgerLosses {
  int64_t rows = 0;                          // rows not recorded, since the ledger was created
  std::map<std::string, int64_t> by_table;   // "failovers", "failover_times", "recoveries", ...
  int64_t first_ms = 0, last_ms = 0;         // wall time of the first and the latest loss; 0 when none
  std::string last_error;                    // why the latest one was lost

  // Counts one lost row of `table` at wall time now_ms.
  void Add(const std::string& table, int64_t now_ms, const std::string& why);
};

// "<ledger>-lost".
std::string LossFilePath(const std::string& ledger_path);

// The file's text for `losses` (kLossFileBytes long), and back. Parse
// refuses anything else with an error naming the file and the fix.
std::string RenderLosses(const LedgerLosses& losses);
Result<LedgerLosses> ParseLosses(const std::string& path, const std::string& text);

// The losses recorded beside `ledger_path`; none when there is no file.
Result<LedgerLosses> ReadLosses(const std::string& ledger_path);

class LossFile {
 public:
  // Creates the file (mode 0600, kLossFileBytes reserved) or opens the one
  // there; `losses` is written to a new one.
  static Result<LossFile> Open(const std::string& ledger_path, const LedgerLosses& losses);

  // Rewrites the record in place and syncs it. A file deleted or replaced
  // under it is made again at its path.
  Status Save(const LedgerLosses& losses);
  const std::string& path() const { return path_; }

 private:
  std::string ledger_path_, path_;
  UniqueFd fd_;
  dev_t dev_ = 0;
  ino_t ino_ = 0;
};

}  // namespace wsup
