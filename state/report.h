// Reports over the ledger: cache hit rate, recovery time percentiles, the
// failover timeline, and the failure tail (the slowest recoveries after a
// cache miss), for `wsup report [--since DURATION] [--miss-tail N] [--json]`.
//
// LedgerReader opens its own connection, so reports can run in another
// process while the supervisor writes (WAL lets readers and the writer
// proceed together). Report structs hold numbers; the renderers turn them
// into text for people or JSON for scripts.
//
// Percentiles use the nearest-rank method on the integer millisecond values:
// pN is the smallest value with at least N% of the values at or below it, so
// every percentile is a value that was actually measured.
//
// Thread-safety: a LedgerReader belongs to one thread; the rest are pure.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "state/losses.h"
#include "state/records.h"
#include "state/sqlite.h"

namespace wsup {

// "90s", "10m", "2h", "7d", "500ms", "1w" -> milliseconds. A bare number is
// refused (its unit would be a guess).
Result<int64_t> ParseDuration(std::string_view text);

class LedgerReader {
 public:
  // Opens an existing ledger (migrating an older schema forward).
  static Result<LedgerReader> Open(const std::string& path);

  // Rows whose time (fault_ms, time_ms) is >= since_ms, oldest first.
  Result<std::vector<FailoverRecord>> Failovers(int64_t since_ms = 0);
  Result<std::vector<CacheEventRecord>> CacheEvents(int64_t since_ms = 0);
  Result<std::vector<RecoveryRecord>> Recoveries(int64_t since_ms = 0);
  Result<std::vector<HolderRestartRecord>> HolderRestarts(int64_t since_ms = 0);
  Result<std::vector<ProbeTransitionRecord>> ProbeTransitions(int64_t since_ms = 0);
  Result<std::vector<RolloutRecord>> Rollouts(int64_t since_ms = 0);  // by started_ms
  Result<std::vector<FenceRecord>> Fences(int64_t since_ms = 0);
  // The rows the ledger could not write (its side file, state/losses.h).
  Result<LedgerLosses> Losses();

  Db& db() { return db_; }

 private:
  Db db_;
};

struct Distribution {
  int64_t count = 0;
  int64_t p50 = 0, p95 = 0, p99 = 0, max = 0;  // meaningless when count == 0
};

// Nearest-rank percentiles of `values` (any order).
Distribution Percentiles(std::vector<int64_t> values);

struct ReportOptions {
  int64_t now_ms = 0;                 // wall time the window ends at
  std::optional<int64_t> since_ms;    // window length; none: everything
  int miss_tail = 5;                  // how many of the slowest recoveries after a miss to list
};

struct Report {
  int64_t now_ms = 0;
  int64_t from_ms = 0;                // start of the window (0: the beginning)
  std::optional<int64_t> window_ms;

  struct Cache {
    int64_t lookups = 0, hits = 0, misses = 0;
    std::optional<double> hit_rate;   // none without lookups
    std::vector<std::pair<std::string, int64_t>> miss_reasons;  // most frequent first
  } cache;

  struct Failovers {
    int64_t count = 0, drills = 0, crash = 0, probe = 0, hang = 0, rollout = 0;
    Distribution detect, swap, failover, outage;  // outage: only rows with first_ok_ms
    Distribution kv_back;  // fault -> the promoted engine's full KV (node KV pool); rows with kv_full_ms
    // The failed engine's exit -> the promoted engine's full KV: the
    // handover's own cost; rows with both gone_ms and kv_full_ms.
    Distribution kv_after_gone;
  } failovers;

  Distribution recovery;       // all recoveries
  Distribution recovery_hit;   // after a cache hit
  Distribution recovery_miss;  // after a cache miss
  std::vector<RecoveryRecord> miss_tail;  // slowest first

  int64_t holder_restarts = 0, holder_restarts_from_fds = 0;
  std::vector<RolloutRecord> rollouts;  // oldest first
  std::vector<FenceRecord> fences;      // oldest first
  // The rows themselves, for a timeline (RenderReportHtml): every failover
  // and every cache miss of the window, oldest first.
  std::vector<FailoverRecord> failover_rows;
  std::vector<CacheEventRecord> cache_miss_rows;

  // Rows the ledger could not write, when the latest loss falls in the
  // window: the counts above do not include them.
  std::optional<LedgerLosses> lost;
  std::string lost_error;  // the record of lost rows could not be read
};

Result<Report> BuildReport(LedgerReader& reader, const ReportOptions& options);

std::string RenderReportText(const Report& report);
std::string RenderReportJson(const Report& report);  // one JSON object, pretty-printed
// A distribution as the JSON report writes it: count, p50_ms, p95_ms,
// p99_ms, max_ms (count alone when it is 0).
nlohmann::json DistJson(const Distribution& d);

}  // namespace wsup
