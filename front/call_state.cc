#include "front/call_state.h"

#include <iterator>

#include "common/enum_names.h"
#include "common/state_table.h"

namespace wsup::front {

namespace {

using S = CallState;
using E = CallEvent;

constexpr CallTransition kRows[] = {
    // A new request: routed at once, queued, or refused (400, 503, a client gone).
    {S::kNew, E::kSend, S::kSent},
    {S::kNew, E::kQueue, S::kQueued},
    {S::kNew, E::kFinish, S::kDone},
    {S::kQueued, E::kSend, S::kSent},
    {S::kQueued, E::kFinish, S::kDone},
    // Out on an engine, nothing relayed yet.
    {S::kSent, E::kHead, S::kRelaying},
    {S::kSent, E::kRetry, S::kNew},
    {S::kSent, E::kAdopt, S::kSent},
    {S::kSent, E::kFinish, S::kDone},
    // Relaying. A buffered answer cut before the client saw a byte is sent
    // again; a stream cut after tokens reached the client is continued.
    {S::kRelaying, E::kRetry, S::kNew},
    {S::kRelaying, E::kResume, S::kResumeNew},
    {S::kRelaying, E::kAdopt, S::kSent},
    {S::kRelaying, E::kAdoptResume, S::kResumeSent},
    {S::kRelaying, E::kFinish, S::kDone},
    // Continuing a cut stream.
    {S::kResumeNew, E::kSend, S::kResumeSent},
    {S::kResumeNew, E::kQueue, S::kResumeQueued},
    {S::kResumeNew, E::kFinish, S::kDone},
    {S::kResumeQueued, E::kSend, S::kResumeSent},
    {S::kResumeQueued, E::kFinish, S::kDone},
    {S::kResumeSent, E::kHead, S::kResuming},
    {S::kResumeSent, E::kResume, S::kResumeNew},
    {S::kResumeSent, E::kAdoptResume, S::kResumeSent},
    {S::kResumeSent, E::kFinish, S::kDone},
    {S::kResuming, E::kResume, S::kResumeNew},
    {S::kResuming, E::kAdoptResume, S::kResumeSent},
    {S::kResuming, E::kFinish, S::kDone},
};

}  // namespace

std::span<const CallTransition> CallTransitions() { return kRows; }

std::optional<CallState> NextCallState(CallState s, CallEvent e) {
  auto row = FindRow(kRows, s, e);
  if (!row) return std::nullopt;
  return row->to;
}

bool IsResuming(CallState s) {
  return s == S::kResumeNew || s == S::kResumeQueued || s == S::kResumeSent || s == S::kResuming;
}

bool IsQueued(CallState s) { return s == S::kQueued || s == S::kResumeQueued; }

const char* CallStateName(CallState s) {
  static constexpr EnumNames<S::kDone> kNames{
      "new", "queued", "sent", "relaying", "resume_new", "resume_queued", "resume_sent", "resuming", "done"};
  return kNames(s);
}

const char* CallEventName(CallEvent e) {
  static constexpr EnumNames<E::kFinish> kNames{"queue",  "send",  "head",         "retry",
                                                "resume", "adopt", "adopt_resume", "finish"};
  return kNames(e);
}

}  // namespace wsup::front
