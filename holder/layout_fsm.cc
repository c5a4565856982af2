#include "holder/layout_fsm.h"

namespace wsup {
namespace {

using S = LayoutState;
using E = LayoutEvent;
using A = LayoutAction;

// The names, in the order of each enum's values (the logs' and tests' words).
constexpr EnumNames<S::kReleased> kStateNames{"writing", "committed", "released"};
constexpr EnumNames<E::kWriterLost> kEventNames{"commit", "commit_refused", "abort", "writer_lost"};
constexpr EnumNames<A::kRelease> kActionNames{"none", "seal_and_serve", "refuse", "release"};

// One row per transition; each (from, event) appears at most once (checked
// by a test).
constexpr LayoutTransition kTable[] = {
    {S::kWriting, E::kCommit, S::kCommitted, A::kSealAndServe},
    {S::kWriting, E::kCommitRefused, S::kWriting, A::kRefuse},
    {S::kWriting, E::kAbort, S::kReleased, A::kRelease},
    {S::kWriting, E::kWriterLost, S::kReleased, A::kRelease},
    // The writer's connection may close any time after its commit.
    {S::kCommitted, E::kWriterLost, S::kCommitted, A::kNone},
};

}  // namespace

const char* LayoutStateName(LayoutState s) { return kStateNames(s); }
const char* LayoutEventName(LayoutEvent e) { return kEventNames(e); }
const char* LayoutActionName(LayoutAction a) { return kActionNames(a); }

std::optional<LayoutTransition> NextLayoutTransition(LayoutState state, LayoutEvent event) {
  return FindRow(kTable, state, event);
}

const LayoutTransition* LayoutTable(size_t* count) { return AllRows(kTable, count); }

}  // namespace wsup
