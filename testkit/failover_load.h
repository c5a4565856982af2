// Failover under load, the measuring side: concurrent completion clients
// whose every answer is checked against the golden outputs, failover drills
// against a target (wsup's front, or HAProxy in front of the same engines),
// and the per-drill analysis. Used by wsup-bench-failover (bench/failover.cc)
// and by the CI drill test (tests/drills).
//
// LoadGenerator: `clients` logical clients on one libuv loop in a thread of
// its own (http/client.h, a new connection per request, as a simple client
// does). Client i streams when i is even (every one with all_stream). Each sends a greedy completion of
// one golden case, checks the answer when it is complete, records it and
// sends the next, until Stop(); Stop() waits for the requests in flight to
// finish (each is bounded by request_timeout_ms), so every request sent is
// accounted for.
//
// Each answer is one Outcome:
//   ok          200, complete, text equal to the golden output;
//   failed      an error answer (a status other than 200), or the proxy
//               refused the connection;
//   lost        no complete answer: the connection was cut or reset (a
//               stream without its end), or nothing came within the timeout;
//   duplicated  complete, but longer than the golden output (tokens repeated,
//               or [DONE] twice);
//   wrong       complete, but different from the golden output otherwise.
//
// Besides the clients, an open-loop prober (probe_interval_ms > 0) sends a
// short stream (probe_tokens tokens, checked against the start of the
// golden output; greedy answers are prefix-consistent) every interval,
// whatever the clients are doing. The clients are closed loops: at a kill
// all of them are usually waiting on requests in flight, so the first
// request any of them sends after it starts only when one of those ends.
// The probes are what measures how soon a new request is answered; around
// a drill (BurstProbes) they come every probe_burst_interval_ms for
// probe_burst_ms, so the measure is not bounded below by the steady
// interval.
//
// Times are wall-clock microseconds (system_clock), the clock of the
// control sockets' `at_ms` as well.
//
// Threads: LoadGenerator's public methods are for one controlling thread;
// its requests run on its own loop thread. Analyze() is a pure function.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace wsup::test {

// One golden case of a test checkpoint (golden.json): prompt and the text of
// its greedy continuation (one token per byte; token t is U+00tt).
struct GoldenCase {
  std::string prompt;
  std::vector<int> output_ids;
  std::string text;  // UTF-8, as the engines send it
};
Result<std::vector<GoldenCase>> LoadGolden(const std::string& path);
// The index of the case with the shortest prompt (the first of equals; 0
// for none): a probe that asks it disturbs the engines least.
int ShortestPromptCase(const std::vector<GoldenCase>& golden);

int64_t NowUs();

enum class Outcome { kOk, kFailed, kLost, kDuplicated, kWrong };
const char* OutcomeName(Outcome o);

struct RequestRecord {
  int client = 0;       // -1: the prober
  bool stream = false;
  int golden = 0;       // index into the golden cases
  int64_t start_us = 0;
  int64_t end_us = 0;
  // When the first correct part of the answer arrived: the first event of a
  // stream, when its text starts the golden output; the whole answer
  // otherwise. 0 when none did.
  int64_t first_correct_us = 0;
  // A correct stream's events with text, when each arrived (a stream in
  // flight at a drill shows here when its output resumed).
  std::vector<int64_t> event_us;
  Outcome outcome = Outcome::kOk;
  int status = 0;       // HTTP status, 0 when none came
  std::string detail;   // why it is not ok
};

struct LoadOptions {
  std::string host = "127.0.0.1";
  int port = 0;
  int clients = 16;
  int max_tokens = 16;             // the goldens have 16 tokens
  int64_t request_timeout_ms = 30'000;
  int64_t probe_interval_ms = 0;   // 0: no prober
  int probe_tokens = 2;
  // The golden case every probe asks (-1, or past the last case: each in
  // turn). A probe is an instrument: the case with the shortest prompt
  // disturbs the engines least.
  int probe_case = -1;
  int64_t probe_burst_interval_ms = 5;
  int64_t probe_burst_ms = 150;
  // A client's pause between its answer and its next request (0: none, a
  // closed loop that keeps the engine saturated).
  int64_t think_ms = 0;
  // Every client streams (not only the even ones).
  bool all_stream = false;
};

class LoadGenerator {
 public:
  LoadGenerator(LoadOptions options, std::vector<GoldenCase> golden);
  ~LoadGenerator();
  LoadGenerator(const LoadGenerator&) = delete;
  LoadGenerator& operator=(const LoadGenerator&) = delete;

  void Start();
  // Sends no new request, waits for those in flight, ends the thread.
  void Stop();

  // Probes every probe_burst_interval_ms from now for probe_burst_ms (no-op
  // without a prober). Any thread.
  void BurstProbes();

  // Progress, readable while running.
  uint64_t completed() const { return completed_.load(); }
  uint64_t not_ok() const { return not_ok_.load(); }
  // The end time of the latest ok answer to a request sent at or after
  // `since_us` (0 when none yet). Readable while running.
  int64_t FirstOkSince(int64_t since_us) const;

  // Every request, in completion order. After Stop().
  const std::vector<RequestRecord>& records() const { return records_; }

 private:
  class Impl;
  LoadOptions options_;
  std::vector<GoldenCase> golden_;
  std::unique_ptr<Impl> impl_;
  std::thread thread_;
  std::atomic<uint64_t> completed_{0};
  std::atomic<uint64_t> not_ok_{0};
  std::atomic<int64_t> burst_until_us_{0};
  mutable std::mutex mu_;
  std::vector<RequestRecord> records_;  // guarded by mu_ while running
  friend class Impl;
};

// One failover drill, as the driver saw it.
struct DrillRecord {
  std::string kind;            // "crash" or "planned"
  int64_t t0_us = 0;           // the kill, or the planned swap's request
  int64_t swap_us = -1;        // when the proxy stopped sending new requests to the old engine (-1: not seen)
  std::string swap_source;     // how the swap was seen
  int64_t resumed = 0;         // streams resumed by the proxy in this drill's window
  int64_t retried = 0;         // requests the proxy sent again in this window
  std::string note;            // e.g. the supervisor's own numbers
};

// Per-drill and summary numbers: each request is counted in the window of
// the latest drill whose t0 is at or before its end (earlier ones in
// "before"). Among the ok answers to requests sent at or after t0, within
// the window: kill to first correct response is the earliest
// first_correct_us (a stream's first token, or a whole answer; probes
// included), kill to first complete correct answer the earliest end of a
// client's (full-length) answer. first_output_ms: the first correct output
// of any request after t0 (+10 ms: output already on its way is not
// counted), requests in flight at t0 included (a stream's first token after
// it, resumed or hedged; else their end): with hedging, when the clients'
// outage ended.
// extra_ms_max: the largest latency of a client request in the window past
// the undisturbed median of its kind (extra_worst says which). Latencies of ok answers before the first
// drill are the undisturbed reference.
nlohmann::json Analyze(const std::vector<DrillRecord>& drills, const std::vector<RequestRecord>& records);

// Every request as a JSON array (times relative to `origin_us`), for a look
// at what happened around a drill.
nlohmann::json RecordsJson(const std::vector<RequestRecord>& records, int64_t origin_us);

// Nearest-rank percentile of `v` (p in 0..100); -1 when empty.
double Percentile(std::vector<double> v, double p);

}  // namespace wsup::test
