// What a proxied call does when an attempt fails: one table, read top down,
// the first row that matches wins. The facts are what the front knows at
// that moment (how far the exchange with the engine got, whether bytes
// already reached the client, whether the answer is a stream the front can
// resume, whether a hedge runs beside it, what is left of the retry
// budget); the action is the call's next state. ProxyCall carries the
// action out; the table itself touches nothing, so each row is tested
// in-process (tests/front/call_policy_test.cc).
//
// The same holds for a hedge's progress (HedgeVerdict): whether what the
// standby sent so far wins the call, fails the hedge, or needs more bytes.
// docs/front.md lists the rows in words.
#pragma once

#include <cstdint>
#include <optional>
#include <span>

#include "front/upstream.h"

namespace wsup::front {

// What the client's event stream allows after a cut.
enum class StreamState {
  kNotStream,     // a plain answer (relayed whole or as it came)
  kResumable,     // an event stream whose tokens are tracked: another engine can go on after them
  kUntracked,     // an event stream the front cannot continue (untracked tokens, or an error event seen)
  kNoPromptIds,   // tokens tracked, but the prompt's ids unknown: the engine reported no prompt_token_ids
  kAllTokensOut,  // every token reached the client; only the end of the stream was lost
  kDoneSent,      // [DONE] reached the client; only the final chunk was lost
};

// The state of a stream relay (front/sse_relay.h) reduced to the above.
// `remaining`: tokens still owed (max_tokens - delivered); prompt_known:
// the prompt's token ids are known (given as ids, or reported by the
// engine), without which a continuation would be a guess.
StreamState StreamStateOf(bool done, bool finished, bool trackable, bool error_seen, int64_t remaining,
                          bool prompt_known);

struct FailureFacts {
  UpstreamError::Stage stage = UpstreamError::Stage::kConnect;
  bool stale = false;          // a kept-alive connection the engine had closed, not yet tried fresh
  bool hedge_pending = false;  // the request runs on the standby as well
  bool delivered = false;      // bytes of the answer reached the client
  StreamState stream = StreamState::kNotStream;
  bool budget_left = false;    // re-sends (or resumes) left under max_retries
};

enum class FailureAction {
  kAdoptHedge,   // the hedge on the standby carries on alone
  kRetryFresh,   // once more on a fresh connection: not a failure of the engine, not counted
  kRedispatch,   // it never reached an engine: routed again, not counted (bounded by the queue timeout)
  kRetry,        // sent again, counted, marked cut (X-Wsup-Resume: cut); the queue deadline starts again
  kFail502,      // no budget left: 502 naming the engine and the fix
  kResumeFree,   // a stream's continuation failed to connect: resumed again, not counted
  kResume,       // the stream goes on elsewhere after the delivered tokens, counted, marked cut
  kEndStream,    // every token is out: the front writes the stream's end itself
  kCloseStream,  // [DONE] is out: the chunked answer is ended
  kEndNoResume,  // the rest could be had only from the prompt's ids, which the engine never reported: an error event ends the stream
  kAbortClient,  // part of the answer is out and the rest cannot be had: the client's connection is closed
};

const char* FailureActionName(FailureAction a);

// One row: each fact that is set must match; an unset one matches anything.
struct FailureRow {
  std::optional<bool> hedge_pending;
  std::optional<bool> stale;
  std::optional<bool> delivered;
  std::optional<UpstreamError::Stage> stage;
  std::optional<StreamState> stream;
  std::optional<bool> budget_left;
  FailureAction action;
};

std::span<const FailureRow> FailureTable();
// The index of the first row of FailureTable() that matches `f` (the last
// row matches everything).
size_t FailureRowFor(const FailureFacts& f);
FailureAction DecideFailure(const FailureFacts& f);
// Whether the failure counts against the engine (its backoff, and a switch
// to the standby when it is the active one): everything but a stale
// kept-alive connection, which says nothing about the engine.
inline bool JudgesEngine(const FailureFacts& f) { return !f.stale; }

// A hedge's progress: what the standby sent so far.
struct HedgeFacts {
  bool has_head = false;
  int status = 0;
  bool event_stream = false;  // its head says text/event-stream
  bool resume = false;        // it continues a stream after the tokens the client has
  bool call_relays_stream = false;  // the call relays (and tracks) an event stream
  bool got_body = false;      // body bytes came
  bool done = false;          // its answer is complete
};

enum class HedgeVerdict {
  kWait,    // nothing decides yet: the active engine may still answer first
  kFailed,  // not an answer the client should get instead of the active engine's
  kWins,    // the call adopts the hedge; the active engine's attempt is closed
};

const char* HedgeVerdictName(HedgeVerdict v);
HedgeVerdict JudgeHedge(const HedgeFacts& h);

// Whether a call may be hedged now. `delivered`: bytes reached the client;
// then only a resumable stream with tokens still owed can go on elsewhere.
bool CanHedge(bool hedge_pending, size_t hedges_sent, size_t max_hedges, bool delivered, StreamState stream);

}  // namespace wsup::front
