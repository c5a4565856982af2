#include "supervisor/kv_handover.h"

namespace wsup {
namespace {

using S = PoolState;
using E = PoolEvent;
using A = PoolAction;

// One row per transition; each (from, event) pair at most once (tested).
constexpr PoolTransition kTable[] = {
    {S::kFree, E::kWant, S::kGranting, A::kGrant},

    {S::kGranting, E::kGranted, S::kHeld, A::kNone},
    // It answered that it does not map it: nobody does.
    {S::kGranting, E::kGrantFailed, S::kFree, A::kRetryLater},
    // A drain that ends before the grant's answer: the engine takes its
    // role requests in order, so the release follows the map.
    {S::kGranting, E::kDrained, S::kReleasing, A::kRelease},
    {S::kGranting, E::kFailed, S::kFenced, A::kNone},
    {S::kGranting, E::kGone, S::kFree, A::kGrantIfWanted},

    {S::kHeld, E::kDrained, S::kReleasing, A::kRelease},
    {S::kHeld, E::kFailed, S::kFenced, A::kNone},
    {S::kHeld, E::kGone, S::kFree, A::kGrantIfWanted},

    {S::kReleasing, E::kReleased, S::kFree, A::kGrantIfWanted},
    // It holds the pool and will not give it back: its exit will.
    {S::kReleasing, E::kReleaseFailed, S::kFenced, A::kKillOwner},
    {S::kReleasing, E::kFailed, S::kFenced, A::kNone},
    {S::kReleasing, E::kGone, S::kFree, A::kGrantIfWanted},

    // Nothing but the exit frees a failed owner's pool.
    {S::kFenced, E::kGone, S::kFree, A::kGrantIfWanted},
};

}  // namespace

const char* PoolStateName(PoolState s) {
  switch (s) {
    case S::kFree: return "free";
    case S::kGranting: return "granting";
    case S::kHeld: return "held";
    case S::kReleasing: return "releasing";
    case S::kFenced: return "fenced";
  }
  return "?";
}

const char* PoolEventName(PoolEvent e) {
  switch (e) {
    case E::kWant: return "want";
    case E::kUnwant: return "unwant";
    case E::kGranted: return "granted";
    case E::kGrantFailed: return "grant_failed";
    case E::kDrained: return "drained";
    case E::kReleased: return "released";
    case E::kReleaseFailed: return "release_failed";
    case E::kFailed: return "failed";
    case E::kGone: return "gone";
  }
  return "?";
}

const char* PoolActionName(PoolAction a) {
  switch (a) {
    case A::kNone: return "none";
    case A::kGrant: return "grant";
    case A::kRelease: return "release";
    case A::kKillOwner: return "kill_owner";
    case A::kGrantIfWanted: return "grant_if_wanted";
    case A::kRetryLater: return "retry_later";
  }
  return "?";
}

std::optional<PoolTransition> NextPoolTransition(PoolState state, PoolEvent event) {
  for (const auto& t : kTable) {
    if (t.from == state && t.event == event) return t;
  }
  return std::nullopt;
}

const PoolTransition* PoolTable(size_t* count) {
  *count = sizeof(kTable) / sizeof(kTable[0]);
  return kTable;
}

void KvHandover::AdoptHeld(const std::string& slot) {
  state_ = PoolState::kHeld;
  owner_ = slot;
}

KvHandover::Step KvHandover::Fire(PoolEvent event, const std::string& slot) {
  Step step;
  if (event == PoolEvent::kWant) wanted_ = slot;
  if (event == PoolEvent::kUnwant) {
    if (wanted_ == slot) wanted_.clear();
    return step;
  }
  // Rows are about the owner; a free pool has none, and `want` may name anyone.
  const bool about_owner = state_ == PoolState::kFree ? event == PoolEvent::kWant : slot == owner_;
  if (!about_owner) return step;
  auto t = NextPoolTransition(state_, event);
  if (!t) return step;
  step.applied = true;
  step.row = *t;
  state_ = t->to;
  step.action = t->action;
  switch (t->action) {
    case A::kGrant:
      owner_ = slot;
      step.slot = slot;
      break;
    case A::kRelease:
    case A::kKillOwner:
      step.slot = owner_;
      break;
    case A::kRetryLater:
      step.slot = owner_;
      owner_.clear();
      break;
    case A::kGrantIfWanted:
      owner_.clear();
      if (!wanted_.empty()) {
        // free --want--> granting, for the slot that waited.
        state_ = PoolState::kGranting;
        owner_ = wanted_;
        step.action = A::kGrant;
        step.slot = wanted_;
      } else {
        step.action = A::kNone;
      }
      break;
    case A::kNone:
      if (state_ == PoolState::kFree) owner_.clear();
      break;
  }
  return step;
}

}  // namespace wsup
