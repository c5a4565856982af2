#include "supervisor/kv_handover.h"

namespace wsup {
namespace {

using S = PoolState;
using E = PoolEvent;
using A = PoolAction;

// The names, in the order of each enum's values (the logs' and tests' words).
constexpr EnumNames<S::kFenced> kStateNames{"free", "granting", "held", "releasing", "fenced"};
constexpr EnumNames<E::kGone> kEventNames{"want",     "unwant",         "granted", "grant_failed", "drained",
                                          "released", "release_failed", "failed",  "gone"};
constexpr EnumNames<A::kRetryLater> kActionNames{"none",       "grant",           "release",
                                                 "kill_owner", "grant_if_wanted", "retry_later"};

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

const char* PoolStateName(PoolState s) { return kStateNames(s); }
const char* PoolEventName(PoolEvent e) { return kEventNames(e); }
const char* PoolActionName(PoolAction a) { return kActionNames(a); }

std::optional<PoolTransition> NextPoolTransition(PoolState state, PoolEvent event) {
  return FindRow(kTable, state, event);
}

const PoolTransition* PoolTable(size_t* count) { return AllRows(kTable, count); }

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
