// The proxy's settings and counters (front/proxy.h), apart so that a call
// (front/proxy_call.h) reads them without knowing the proxy.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/status.h"
#include "front/serving_stats.h"
#include "front/upstream.h"

namespace wsup::front {

struct ProxyOptions {
  int64_t queue_timeout_ms = 5'000;
  size_t max_queued = 1024;
  size_t buffer_limit_bytes = size_t{256} * 1024;
  int max_retries = 1;               // re-sends of a request (or resumes of a stream) after a failure
  int64_t default_max_tokens = 16;   // the engines' default, made explicit in streamed requests
  int64_t down_backoff_ms = 100;     // a failed backend is not tried for this long, doubling per failure
  int64_t down_backoff_max_ms = 2'000;
  size_t client_buffer_high = 4 << 20;  // unsent client bytes that pause reading from the engine
  size_t client_buffer_low = 1 << 20;   // ... and resume it
  int64_t hedge_after_ms = 0;        // silence from the active before the standby is asked too; 0: no hedging
  int hedge_percent = 10;            // hedges earned per 100 client requests ...
  int hedge_burst = 16;              // ... and the most that can be saved up (also the starting balance)
  bool log_routes = true;            // log route changes (one loop of several does)
  UpstreamOptions upstream;
};

// The hedging settings as a reload changes them; Check() says what is wrong.
struct HedgeLimits {
  int64_t after_ms = 0;
  int percent = 10;
  int burst = 16;
  Status Check() const;
};

struct ProxyCounters {
  uint64_t requests = 0;       // client requests handed to the proxy
  uint64_t ok = 0;             // engine answers relayed completely (any status)
  uint64_t failed = 0;         // answered 502 by the front, or cut off after an engine failure
  uint64_t retried = 0;        // requests sent again after an engine failure
  uint64_t resumed = 0;        // streams continued on another attempt
  uint64_t resumed_chat = 0;   // ... of them chat streams (the rest are text completions)
  uint64_t resume_refused = 0; // cut streams ended with an error: the engine never reported the prompt's ids
  uint64_t switched_self = 0;  // times the front made the standby active by itself
  uint64_t rejected_503 = 0;   // no engine within the queue timeout, or the queue was full
  uint64_t client_closed = 0;  // clients that went away before their answer was complete
  uint64_t rejected_400 = 0;   // completion bodies past the shared JSON limits, refused by the front
  uint64_t not_forwarded = 0;  // paths outside /v1/ and /health, answered 404 by the front (front/routes.h)
  uint64_t hedged = 0;         // requests also sent to the standby after hedge_after_ms of silence
  uint64_t hedge_won = 0;      // ... where the standby answered first (or the active failed meanwhile)
  uint64_t hedge_lost = 0;     // ... where the active answered first
  uint64_t hedge_failed = 0;   // ... where the standby's attempt failed (the active's went on)
  uint64_t hedge_refused = 0;  // silent requests not hedged because the hedge budget was spent
  uint64_t silent_reports = 0; // `silent` events: the active engine sent nothing while requests waited
  uint64_t silent_to_standby = 0;  // new requests sent to the standby while the active was silent
  // What the clients saw: answers by route and status, latency histograms
  // (front/serving_stats.h); in the status's counters beside the above.
  ServingStats serving;
};

}  // namespace wsup::front
