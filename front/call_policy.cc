#include "front/call_policy.h"

#include "common/enum_names.h"

namespace wsup::front {

namespace {

using Stage = UpstreamError::Stage;
using A = FailureAction;
using S = StreamState;
constexpr std::nullopt_t any = std::nullopt;

// hedge_pending, stale, delivered, stage, stream, budget_left -> action
constexpr FailureRow kRows[] = {
    // The request runs on the standby too: that attempt carries on alone.
    {true, any, any, any, any, any, A::kAdoptHedge},
    // A kept-alive connection the engine had closed: once more on a fresh one.
    {false, true, any, any, any, any, A::kRetryFresh},
    // Nothing reached the client: the request can be sent again.
    {false, false, false, Stage::kConnect, any, any, A::kRedispatch},
    {false, false, false, any, any, true, A::kRetry},
    {false, false, false, any, any, false, A::kFail502},
    // Part of the answer is out.
    {false, false, true, any, S::kDoneSent, any, A::kCloseStream},
    {false, false, true, any, S::kAllTokensOut, any, A::kEndStream},
    {false, false, true, Stage::kConnect, S::kResumable, any, A::kResumeFree},
    {false, false, true, any, S::kResumable, true, A::kResume},
    // Resumable but for the prompt's ids: never continued from a guess.
    {false, false, true, any, S::kNoPromptIds, any, A::kEndNoResume},
    // The rest of the answer cannot be had: never presented as complete.
    {any, any, any, any, any, any, A::kAbortClient},
};

template <typename T>
bool Matches(const std::optional<T>& want, const T& have) {
  return !want || *want == have;
}

}  // namespace

StreamState StreamStateOf(bool done, bool finished, bool trackable, bool error_seen, int64_t remaining,
                          bool prompt_known) {
  if (done) return S::kDoneSent;
  if (finished || (remaining <= 0 && trackable)) return S::kAllTokensOut;
  if (trackable && !error_seen) return prompt_known ? S::kResumable : S::kNoPromptIds;
  return S::kUntracked;
}

std::span<const FailureRow> FailureTable() { return kRows; }

size_t FailureRowFor(const FailureFacts& f) {
  for (size_t i = 0; i < std::size(kRows); ++i) {
    const FailureRow& r = kRows[i];
    if (Matches(r.hedge_pending, f.hedge_pending) && Matches(r.stale, f.stale) &&
        Matches(r.delivered, f.delivered) && Matches(r.stage, f.stage) && Matches(r.stream, f.stream) &&
        Matches(r.budget_left, f.budget_left)) {
      return i;
    }
  }
  return std::size(kRows) - 1;  // unreachable: the last row matches everything
}

FailureAction DecideFailure(const FailureFacts& f) { return kRows[FailureRowFor(f)].action; }

const char* FailureActionName(FailureAction a) {
  static constexpr EnumNames<A::kAbortClient> kNames{
      "adopt_hedge", "retry_fresh", "redispatch", "retry",        "fail_502",
      "resume_free", "resume",      "end_stream", "close_stream", "end_no_resume", "abort_client"};
  return kNames(a);
}

HedgeVerdict JudgeHedge(const HedgeFacts& h) {
  if (!h.has_head) return HedgeVerdict::kWait;
  const bool stream_head = h.status / 100 == 2 && h.event_stream;
  // A server error, or a continuation that is not a stream: the client
  // should rather wait for the active engine.
  if (h.status >= 500 || (h.resume && !stream_head)) return HedgeVerdict::kFailed;
  if (h.done) return HedgeVerdict::kWins;
  // A stream wins with its first event bytes (its head comes before any
  // token); anything else with its head.
  if (stream_head && h.call_relays_stream && !h.got_body) return HedgeVerdict::kWait;
  return HedgeVerdict::kWins;
}

const char* HedgeVerdictName(HedgeVerdict v) {
  static constexpr EnumNames<HedgeVerdict::kWins> kNames{"wait", "failed", "wins"};
  return kNames(v);
}

bool CanHedge(bool hedge_pending, size_t hedges_sent, size_t max_hedges, bool delivered, StreamState stream) {
  if (hedge_pending || hedges_sent >= max_hedges) return false;
  if (!delivered) return true;  // the whole request can be sent again
  return stream == S::kResumable;
}

}  // namespace wsup::front
