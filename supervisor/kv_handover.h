// KvHandover: which engine maps the node's KV pool, as a state table.
//
// The pool (wire/kv_pool.h, one per rank, made by the holders) is written
// by at most one engine at any time: the active one, and only once the
// engine that had it before can no longer write to it. That engine either
// said so (it was demoted by a planned drill, drained, and answered that it
// let the pool go), or its process is gone (its pidfd reported the exit:
// only then has its GPU work surely stopped; a closed lifeline or a failed
// probe is not enough). A promoted engine serves from its own scratch
// until then.
//
//   free --want--> granting [grant]                  the active engine maps it
//   granting --granted--> held
//   granting --grant_failed--> free [retry_later]    it could not (holder down, ...)
//   held --drained--> releasing [release]            planned: its traffic is gone
//   releasing --released--> free [grant_if_wanted]
//   releasing --release_failed--> fenced [kill_owner]
//   granting | held | releasing --failed--> fenced   crash, probe trip, unfit
//   granting | held | releasing | fenced --gone--> free [grant_if_wanted]
//
// Every event names an engine slot; a row applies when that slot is the
// owner (the one granted, holding, releasing or fenced) or, for `want`, any
// slot. `want` also records the slot that should hold the pool next, and
// `unwant` forgets it (the slot stopped being active); reaching free grants
// the pool to the wanted slot at once (grant_if_wanted). An event that
// matches no row changes nothing (a late answer of an engine that is no
// longer the owner, say) and is logged by the caller.
//
// Pure: no processes, sockets or time; the supervisor carries the actions
// out (supervisor/kv_pool_roles.cc) and feeds their answers back. Loop thread
// only.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

#include "common/state_table.h"

namespace wsup {

enum class PoolState {
  kFree,       // no engine maps the pool
  kGranting,   // the owner was asked to map it; no answer yet
  kHeld,       // the owner maps it
  kReleasing,  // the owner was asked to let it go; no answer yet
  kFenced,     // the owner failed; it may still write until its process is gone
};

enum class PoolEvent {
  kWant,           // the slot became the active engine
  kUnwant,         // the slot is no longer the active engine
  kGranted,        // the owner answered that it mapped the pool
  kGrantFailed,    // the owner answered that it did not (and does not) map it
  kDrained,        // the owner has no traffic of its own (a planned drain ended, or it is a standby)
  kReleased,       // the owner answered that it let the pool go
  kReleaseFailed,  // the owner did not let it go within the budget, or said it could not
  kFailed,         // the owner's slot failed; its process may live on for a while
  kGone,           // the owner's process exited (pidfd)
};

enum class PoolAction {
  kNone,
  kGrant,          // ask the owner to map the pool (POST /wsup/role active, kv pool)
  kRelease,        // ask the owner to let it go (POST /wsup/role standby)
  kKillOwner,      // SIGKILL the owner; its exit (gone) frees the pool
  kGrantIfWanted,  // free now: grant it to the wanted slot, if any
  kRetryLater,     // free after a failed grant: want the slot again after a pause
};

const char* PoolStateName(PoolState s);
const char* PoolEventName(PoolEvent e);
const char* PoolActionName(PoolAction a);
inline constexpr TableNames<PoolState, PoolEvent, PoolAction> kPoolNames{PoolStateName, PoolEventName,
                                                                         PoolActionName};

using PoolTransition = TableRow<PoolState, PoolEvent, PoolAction>;
// The row for (state, event) about the owner, or nullopt. `want` and
// `unwant` rows apply whoever the slot is.
std::optional<PoolTransition> NextPoolTransition(PoolState state, PoolEvent event);
const PoolTransition* PoolTable(size_t* count);

// The table with its owner and wanted slot.
class KvHandover {
 public:
  struct Step {
    bool applied = false;  // a row matched
    PoolTransition row{};
    // What to do, and to which slot ("" with kNone). kGrantIfWanted is
    // resolved here: it becomes kGrant to the wanted slot (the state is then
    // granting), or kNone when no slot is wanted.
    PoolAction action = PoolAction::kNone;
    std::string slot;
  };
  // Applies the event about `slot`.
  Step Fire(PoolEvent event, const std::string& slot);

  PoolState state() const { return state_; }
  const std::string& owner() const { return owner_; }  // "" when free
  const std::string& wanted() const { return wanted_; }
  // A restarted supervisor found `slot` mapping the pool already.
  void AdoptHeld(const std::string& slot);

 private:
  PoolState state_ = PoolState::kFree;
  std::string owner_;
  std::string wanted_;
};

}  // namespace wsup
