// A call's lifecycle table (front/call_state.h), row by row, and the moves it
// must refuse.
#include <catch2/catch.hpp>

#include <set>
#include <string>
#include <utility>

#include "front/call_state.h"

using namespace wsup::front;
using S = CallState;
using E = CallEvent;

namespace {

struct Row {
  S from;
  E event;
  S to;
};

// The table as docs/front.md words it, written out again so that a changed
// row fails here.
const Row kExpected[] = {
    {S::kNew, E::kSend, S::kSent},
    {S::kNew, E::kQueue, S::kQueued},
    {S::kNew, E::kFinish, S::kDone},
    {S::kQueued, E::kSend, S::kSent},
    {S::kQueued, E::kFinish, S::kDone},
    {S::kSent, E::kHead, S::kRelaying},
    {S::kSent, E::kRetry, S::kNew},
    {S::kSent, E::kAdopt, S::kSent},
    {S::kSent, E::kFinish, S::kDone},
    {S::kRelaying, E::kRetry, S::kNew},
    {S::kRelaying, E::kResume, S::kResumeNew},
    {S::kRelaying, E::kAdopt, S::kSent},
    {S::kRelaying, E::kAdoptResume, S::kResumeSent},
    {S::kRelaying, E::kFinish, S::kDone},
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

constexpr S kStates[] = {S::kNew,       S::kQueued,       S::kSent,       S::kRelaying, S::kResumeNew,
                         S::kResumeQueued, S::kResumeSent, S::kResuming, S::kDone};
constexpr E kEvents[] = {E::kQueue, E::kSend, E::kHead, E::kRetry, E::kResume, E::kAdopt, E::kAdoptResume, E::kFinish};

}  // namespace

TEST_CASE("front call state: each row of the table", "[front][call_state]") {
  for (const Row& r : kExpected) {
    INFO(CallStateName(r.from) << " + " << CallEventName(r.event));
    auto next = NextCallState(r.from, r.event);
    REQUIRE(next.has_value());
    CHECK(*next == r.to);
  }
  CHECK(CallTransitions().size() == std::size(kExpected));
}

TEST_CASE("front call state: every other move is refused", "[front][call_state]") {
  std::set<std::pair<S, E>> allowed;
  for (const Row& r : kExpected) allowed.insert({r.from, r.event});
  int refused = 0;
  for (S s : kStates) {
    for (E e : kEvents) {
      if (allowed.count({s, e})) continue;
      INFO(CallStateName(s) << " + " << CallEventName(e));
      CHECK_FALSE(NextCallState(s, e).has_value());
      ++refused;
    }
  }
  CHECK(refused == 9 * 8 - static_cast<int>(std::size(kExpected)));
}

TEST_CASE("front call state: done is final, every state can finish", "[front][call_state]") {
  for (E e : kEvents) CHECK_FALSE(NextCallState(S::kDone, e).has_value());
  for (S s : kStates) {
    if (s != S::kDone) CHECK(NextCallState(s, E::kFinish) == S::kDone);
  }
}

TEST_CASE("front call state: a stream once resumed stays resumed, the queue is one state each side", "[front][call_state]") {
  for (const Row& r : kExpected) {
    if (IsResuming(r.from) && r.to != S::kDone) CHECK(IsResuming(r.to));
  }
  CHECK(IsQueued(S::kQueued));
  CHECK(IsQueued(S::kResumeQueued));
  CHECK_FALSE(IsQueued(S::kSent));
  CHECK_FALSE(IsResuming(S::kRelaying));
  std::set<std::string> names;
  for (S s : kStates) names.insert(CallStateName(s));
  CHECK(names.size() == std::size(kStates));
}
