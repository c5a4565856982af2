// LayoutFsm: the life of one engine-made layout in a holder started with
// --layout engine (wire/layout_protocol.h), as a state x event table like
// the supervisor's (supervisor/child_fsm.h), so every change is one row
// that is logged with its cause and tested.
//
//   (lease granted) writing --commit--> committed [seal_and_serve]
//   (adopted from kept fds: --adopt-layouts) committed
//   writing --commit_refused--> writing [refuse]   (the lease is kept)
//   writing --abort--> released [release]
//   writing --writer_lost--> released [release]     (its connection closed)
//   committed --writer_lost--> committed            (the writer left after
//                                                    its commit: nothing)
//
// "released" is final: the layout's memory is freed, and the holder gives a
// new lease for the same fingerprint to the client that waited longest. A
// committed layout lives as long as the holder, and, kept by the
// supervisor, in the holder that replaces it after a crash (adopted, it
// enters this table at committed). Readers only ever attach a committed one.
//
// Pure: no sockets, memory or time. Loop thread only.
#pragma once

#include <cstddef>
#include <optional>

#include "common/state_table.h"

namespace wsup {

enum class LayoutState {
  kWriting,    // a writer holds the lease: allocates, writes, commits
  kCommitted,  // checked and sealed; served to every reader
  kReleased,   // aborted or its writer lost before a commit; memory freed
};

enum class LayoutEvent {
  kCommit,         // the writer's manifest passed every check and is sealed
  kCommitRefused,  // the writer's manifest failed a check
  kAbort,          // the writer gave up (an `abort` message)
  kWriterLost,     // the writer's connection closed
};

enum class LayoutAction {
  kNone,
  kSealAndServe,  // answer the writer and every waiter with the layout
  kRefuse,        // tell the writer why; it may commit again or abort
  kRelease,       // free the memory; the longest waiter gets a new lease
};

const char* LayoutStateName(LayoutState s);  // "writing", "committed", "released"
const char* LayoutEventName(LayoutEvent e);
const char* LayoutActionName(LayoutAction a);
inline constexpr TableNames<LayoutState, LayoutEvent, LayoutAction> kLayoutNames{
    LayoutStateName, LayoutEventName, LayoutActionName};

using LayoutTransition = TableRow<LayoutState, LayoutEvent, LayoutAction>;

// nullopt: the event means nothing in that state (a bug in the caller).
std::optional<LayoutTransition> NextLayoutTransition(LayoutState state, LayoutEvent event);

// The whole table, for tests.
const LayoutTransition* LayoutTable(size_t* count);

}  // namespace wsup
