// The front's call policy, in-process: every row of the failure table and
// of the hedge verdict, each with the facts that reach it, and the rules
// every answer of the table keeps (nothing is sent again once bytes reached
// the client unless it is a resumable stream; nothing is cut that could go on).
#include <catch2/catch.hpp>

#include <set>

#include "front/call_policy.h"

using namespace wsup::front;
using Stage = wsup::front::UpstreamError::Stage;
using A = FailureAction;
using S = StreamState;

namespace {

FailureFacts Facts(Stage stage, bool delivered, S stream, bool budget_left) {
  return {.stage = stage, .delivered = delivered, .stream = stream, .budget_left = budget_left};
}

constexpr Stage kStages[] = {Stage::kConnect, Stage::kAwaitingResponse, Stage::kMidResponse};
constexpr S kStreams[] = {S::kNotStream, S::kResumable, S::kUntracked, S::kNoPromptIds, S::kAllTokensOut, S::kDoneSent};

// Every combination of the facts.
template <typename F>
void ForEachFacts(F&& f) {
  for (bool hedge : {false, true}) {
    for (bool stale : {false, true}) {
      for (bool delivered : {false, true}) {
        for (Stage stage : kStages) {
          for (S stream : kStreams) {
            for (bool budget : {false, true}) {
              FailureFacts x = Facts(stage, delivered, stream, budget);
              x.hedge_pending = hedge;
              x.stale = stale;
              f(x);
            }
          }
        }
      }
    }
  }
}

}  // namespace

TEST_CASE("call policy: a failure while a hedge runs hands the call to the hedge", "[front][policy]") {
  FailureFacts f = Facts(Stage::kMidResponse, true, S::kResumable, false);
  f.hedge_pending = true;
  CHECK(DecideFailure(f) == A::kAdoptHedge);
  f.stale = true;  // adopted, and the engine is not judged for a stale connection
  CHECK(DecideFailure(f) == A::kAdoptHedge);
  CHECK_FALSE(JudgesEngine(f));
}

TEST_CASE("call policy: a stale kept-alive connection is retried fresh and says nothing of the engine", "[front][policy]") {
  FailureFacts f = Facts(Stage::kAwaitingResponse, false, S::kNotStream, false);
  f.stale = true;
  CHECK(DecideFailure(f) == A::kRetryFresh);
  CHECK_FALSE(JudgesEngine(f));
  f.stale = false;
  CHECK(JudgesEngine(f));
}

TEST_CASE("call policy: before any byte reached the client", "[front][policy]") {
  // A refused connect never reached an engine: routed again, with or without budget.
  CHECK(DecideFailure(Facts(Stage::kConnect, false, S::kNotStream, false)) == A::kRedispatch);
  CHECK(DecideFailure(Facts(Stage::kConnect, false, S::kNotStream, true)) == A::kRedispatch);
  // Sent and no complete answer: once more while the budget lasts, then 502.
  for (Stage s : {Stage::kAwaitingResponse, Stage::kMidResponse}) {
    CHECK(DecideFailure(Facts(s, false, S::kNotStream, true)) == A::kRetry);
    CHECK(DecideFailure(Facts(s, false, S::kNotStream, false)) == A::kFail502);
  }
}

TEST_CASE("call policy: a stream cut after tokens reached the client", "[front][policy]") {
  CHECK(DecideFailure(Facts(Stage::kMidResponse, true, S::kResumable, true)) == A::kResume);
  CHECK(DecideFailure(Facts(Stage::kAwaitingResponse, true, S::kResumable, true)) == A::kResume);
  // Its continuation could not connect: resumed again without counting.
  CHECK(DecideFailure(Facts(Stage::kConnect, true, S::kResumable, false)) == A::kResumeFree);
  // The budget is spent: the client's connection is closed.
  CHECK(DecideFailure(Facts(Stage::kMidResponse, true, S::kResumable, false)) == A::kAbortClient);
  // Every token out: the front ends the stream itself, budget or not.
  CHECK(DecideFailure(Facts(Stage::kMidResponse, true, S::kAllTokensOut, false)) == A::kEndStream);
  CHECK(DecideFailure(Facts(Stage::kConnect, true, S::kAllTokensOut, true)) == A::kEndStream);
  // [DONE] is out: only the final chunk was lost.
  CHECK(DecideFailure(Facts(Stage::kMidResponse, true, S::kDoneSent, false)) == A::kCloseStream);
  // A stream the front cannot continue is cut.
  CHECK(DecideFailure(Facts(Stage::kMidResponse, true, S::kUntracked, true)) == A::kAbortClient);
  CHECK(DecideFailure(Facts(Stage::kConnect, true, S::kUntracked, true)) == A::kAbortClient);
  // The prompt's ids were never reported: an error event ends it, budget or not.
  CHECK(DecideFailure(Facts(Stage::kMidResponse, true, S::kNoPromptIds, true)) == A::kEndNoResume);
  CHECK(DecideFailure(Facts(Stage::kConnect, true, S::kNoPromptIds, false)) == A::kEndNoResume);
}

TEST_CASE("call policy: a plain answer cut after bytes reached the client closes the client's connection", "[front][policy]") {
  for (Stage s : kStages) {
    for (bool budget : {false, true}) CHECK(DecideFailure(Facts(s, true, S::kNotStream, budget)) == A::kAbortClient);
  }
}

TEST_CASE("call policy: every row of the failure table is reached", "[front][policy]") {
  std::set<size_t> hit;
  ForEachFacts([&](const FailureFacts& f) { hit.insert(FailureRowFor(f)); });
  CHECK(hit.size() == FailureTable().size());
}

TEST_CASE("call policy: rules every answer keeps", "[front][policy]") {
  ForEachFacts([](const FailureFacts& f) {
    INFO("hedge " << f.hedge_pending << " stale " << f.stale << " delivered " << f.delivered << " stage "
                  << static_cast<int>(f.stage) << " stream " << static_cast<int>(f.stream) << " budget "
                  << f.budget_left);
    A a = DecideFailure(f);
    INFO("action " << FailureActionName(a));
    if (f.hedge_pending) {
      CHECK(a == A::kAdoptHedge);
      return;
    }
    // A request is sent again whole only while nothing reached the client.
    if (a == A::kRetry || a == A::kRedispatch || a == A::kFail502) CHECK_FALSE(f.delivered);
    // A counted re-send or resume needs budget.
    if (a == A::kRetry || a == A::kResume) CHECK(f.budget_left);
    // Only a resumable stream goes on elsewhere.
    if (a == A::kResume || a == A::kResumeFree) CHECK((f.delivered && f.stream == S::kResumable));
    // A stream whose prompt ids are unknown is never continued.
    if (f.stream == S::kNoPromptIds && f.delivered && !f.stale) CHECK(a == A::kEndNoResume);
    // The client's connection is cut only when bytes are out and nothing else can be done.
    if (a == A::kAbortClient) {
      CHECK(f.delivered);
      CHECK(f.stream != S::kAllTokensOut);
      CHECK(f.stream != S::kDoneSent);
    }
  });
}

TEST_CASE("call policy: the stream relay's state reduces to what a cut allows", "[front][policy]") {
  // done, finished, trackable, error_seen, remaining, prompt_known
  CHECK(StreamStateOf(true, true, true, false, 5, true) == S::kDoneSent);
  CHECK(StreamStateOf(false, true, false, false, 5, true) == S::kAllTokensOut);
  CHECK(StreamStateOf(false, false, true, false, 0, true) == S::kAllTokensOut);
  CHECK(StreamStateOf(false, false, true, false, 0, false) == S::kAllTokensOut);  // nothing left to resume
  CHECK(StreamStateOf(false, false, false, false, 0, true) == S::kUntracked);  // untracked: the count proves nothing
  CHECK(StreamStateOf(false, false, true, false, 3, true) == S::kResumable);
  CHECK(StreamStateOf(false, false, true, false, 3, false) == S::kNoPromptIds);
  CHECK(StreamStateOf(false, false, true, true, 3, true) == S::kUntracked);
  CHECK(StreamStateOf(false, false, true, true, 3, false) == S::kUntracked);
}

TEST_CASE("hedge verdict: each row", "[front][policy][hedge]") {
  HedgeFacts h;
  CHECK(JudgeHedge(h) == HedgeVerdict::kWait);  // no head yet
  h.has_head = true;
  h.status = 503;
  CHECK(JudgeHedge(h) == HedgeVerdict::kFailed);
  h.status = 200;
  CHECK(JudgeHedge(h) == HedgeVerdict::kWins);  // a plain answer wins with its head
  h.status = 404;
  CHECK(JudgeHedge(h) == HedgeVerdict::kWins);  // a client error is the engine's answer too
  h.status = 200;
  h.event_stream = true;
  h.call_relays_stream = true;
  CHECK(JudgeHedge(h) == HedgeVerdict::kWait);  // a stream wins with its first event bytes
  h.got_body = true;
  CHECK(JudgeHedge(h) == HedgeVerdict::kWins);
  h.got_body = false;
  h.done = true;
  CHECK(JudgeHedge(h) == HedgeVerdict::kWins);  // an empty stream that ended
  // A continuation must be a stream.
  HedgeFacts r;
  r.has_head = true;
  r.resume = true;
  r.status = 200;
  CHECK(JudgeHedge(r) == HedgeVerdict::kFailed);
  r.event_stream = true;
  r.call_relays_stream = true;
  CHECK(JudgeHedge(r) == HedgeVerdict::kWait);
  r.got_body = true;
  CHECK(JudgeHedge(r) == HedgeVerdict::kWins);
}

TEST_CASE("hedge policy: which calls may be hedged", "[front][policy][hedge]") {
  CHECK(CanHedge(false, 0, 1, false, S::kNotStream));   // nothing out: the whole request
  CHECK_FALSE(CanHedge(true, 0, 1, false, S::kNotStream));  // one at a time
  CHECK_FALSE(CanHedge(false, 1, 1, false, S::kNotStream));  // one in the call's life
  CHECK(CanHedge(false, 0, 1, true, S::kResumable));     // a stream, after its tokens
  for (S s : {S::kNotStream, S::kUntracked, S::kNoPromptIds, S::kAllTokensOut, S::kDoneSent}) {
    CHECK_FALSE(CanHedge(false, 0, 1, true, s));
  }
}
