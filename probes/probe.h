// Probes: the checks that tell whether an engine serves correctly.
//
//   semantic  POST /v1/completions with a known prompt, greedy (temperature
//             0), max_tokens, return_token_ids; passes iff the answer equals
//             the expected text or token ids, within the timeout. An engine
//             that maps memory cleanly can still serve garbage; this catches it.
//   comm      GET /wsup/status; passes iff comm.warm is true and
//             comm.last_keepalive_ms (ms since the epoch of the engine's last
//             collective keepalive) is at most max_age_ms old: a hung
//             communicator fails it even while the HTTP server answers.
//   port      a TCP connect within the timeout; proves only that something
//             listens (no default config uses it).
//
// Failure reasons are short and exact, for logs, the ledger and metrics:
//   "wrong answer: got [92, 16] expected [92, 17]"
//   "wrong answer: got \"Lyon\" expected \"Paris\""
//   "timeout after 800 ms", "connection refused", "HTTP 503: model is loading"
//
// The Evaluate*() functions judge a response without any I/O, so the rules
// are tested directly; the Probe objects add the request on a libuv loop.
//
// The supervisor maps its [probe] config onto these specs
// (supervisor/probe_config.h); nothing here knows the config.
//
// Ownership and threads: a Probe runs on the loop of the HttpClient (or the
// loop) it was made with, and must be destroyed (or Cancel()ed) on it. The
// client must outlive its probes. At most one check per Probe is in flight.
#pragma once

#include <uv.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "http/client.h"
#include "probes/hysteresis.h"

namespace wsup {

struct ProbeTarget {
  std::string host = "127.0.0.1";
  int port = 0;
  // The engine's control token (http/control_auth.h), sent by probes that
  // read its control routes (comm: /wsup/status); empty: none.
  std::string control_token;
  std::string ToString() const;
};

struct SemanticProbeSpec {
  std::string prompt;
  std::optional<std::string> expect;                     // exactly one of these
  std::optional<std::vector<int64_t>> expect_token_ids;
  int max_tokens = 16;
  int64_t timeout_ms = 1000;
  std::string model;  // the request's "model" field; "" leaves it out
};

struct CommProbeSpec {
  int64_t timeout_ms = 1000;
  int64_t max_age_ms = 10'000;
};

// The JSON body of the semantic probe's request.
std::string SemanticRequestBody(const SemanticProbeSpec& spec);

// Judges a /v1/completions answer (or the client's error).
ProbeOutcome EvaluateCompletion(const SemanticProbeSpec& spec, const Result<http::HttpResponse>& response,
                                int64_t latency_ms);
// Judges a /wsup/status answer: comm.warm must be true and
// comm.last_keepalive_ms, the age of the engine's last successful keepalive
// (milliseconds ago, by the engine's own clock, so no two clocks need to
// agree), at most max_age_ms.
ProbeOutcome EvaluateStatus(const CommProbeSpec& spec, const Result<http::HttpResponse>& response,
                            int64_t latency_ms);
// The reason for a failed exchange: "timeout after N ms", "connection refused", ...
std::string FailureReason(const Error& error, int64_t timeout_ms);

class Probe {
 public:
  using Callback = std::function<void(ProbeOutcome)>;
  virtual ~Probe() = default;
  virtual const char* kind() const = 0;
  // Starts one check; `done` runs once on the loop, never inside Run().
  virtual void Run(Callback done) = 0;
  // Ends the check in flight, if any, without running its callback.
  virtual void Cancel() = 0;
};

std::unique_ptr<Probe> MakeSemanticProbe(http::HttpClient& client, ProbeTarget target, SemanticProbeSpec spec,
                                         const Clock& clock = RealClock());
std::unique_ptr<Probe> MakeCommProbe(http::HttpClient& client, ProbeTarget target, CommProbeSpec spec,
                                     const Clock& clock = RealClock());
std::unique_ptr<Probe> MakePortProbe(uv_loop_t* loop, ProbeTarget target, int64_t timeout_ms,
                                     const Clock& clock = RealClock());
// Runs each probe in turn and fails with the first failure; later reasons
// are prefixed by their kind ("comm: not warm").
std::unique_ptr<Probe> MakeAllOfProbe(std::vector<std::unique_ptr<Probe>> probes);

}  // namespace wsup
