// The front's status from its loops' statuses: each loop's Proxy knows its
// own calls, queue, engine connections and counters; the control socket
// answers for the whole front.
//
// Values; any thread.
#pragma once

#include <nlohmann/json.hpp>
#include <vector>

namespace wsup::front {

// Merges Proxy::StatusJson() replies (null entries, from loops already gone,
// are skipped): counts (inflight, queued, counters) are summed; per engine,
// the latest of each time and the most consecutive failures are kept, and
// `down` keeps the longest remaining backoff. Routes, epoch and hedging
// settings are the first loop's (every loop has the same; the front
// overrides routes with its own view). `events` is left empty: the front
// keeps the one event log.
nlohmann::json MergeLoopStatus(const std::vector<nlohmann::json>& parts);

}  // namespace wsup::front
