#include "holder/layout_fsm.h"

namespace wsup {
namespace {

using S = LayoutState;
using E = LayoutEvent;
using A = LayoutAction;

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

const char* LayoutStateName(LayoutState s) {
  switch (s) {
    case S::kWriting: return "writing";
    case S::kCommitted: return "committed";
    case S::kReleased: return "released";
  }
  return "?";
}

const char* LayoutEventName(LayoutEvent e) {
  switch (e) {
    case E::kCommit: return "commit";
    case E::kCommitRefused: return "commit_refused";
    case E::kAbort: return "abort";
    case E::kWriterLost: return "writer_lost";
  }
  return "?";
}

const char* LayoutActionName(LayoutAction a) {
  switch (a) {
    case A::kNone: return "none";
    case A::kSealAndServe: return "seal_and_serve";
    case A::kRefuse: return "refuse";
    case A::kRelease: return "release";
  }
  return "?";
}

std::optional<LayoutTransition> NextLayoutTransition(LayoutState state, LayoutEvent event) {
  for (const auto& t : kTable) {
    if (t.from == state && t.event == event) return t;
  }
  return std::nullopt;
}

const LayoutTransition* LayoutTable(size_t* count) {
  *count = sizeof(kTable) / sizeof(kTable[0]);
  return kTable;
}

}  // namespace wsup
