// Failover: the node's failovers as one owner. It alone holds the failover
// in progress (from which slot to which, its times, its ledger rows, the
// `wsup failover` callers waiting for its end), the budget of its proof,
// and the latest failover whose later times (the old engine gone, the new
// one's full KV) are still to be written.
//
// A failover begins when the active slot fails (OnFailed: the standby, or
// an engine still draining, is promoted), with a planned swap (PlannedSwap:
// `wsup failover` or a rollout's step; the old engine drains until the
// front has nothing in flight on it) or with a drill's kill (Drill, before
// the exit drives OnFailed). It
// ends with the first correct answer through the front, from the front's
// `first_ok` or from the probe it sends (OnFirstOk), or unproven once its
// budget runs out: until then drills and rollouts are refused, and
// PendingText() says why. What it needs of the engines (their states, the
// promotion, the restart of the failed slot), the front (routes, the
// probe), the ledger and the callers goes through Hooks, given once at
// construction, so tests drive it on fakes and a fake clock
// (tests/supervisor_core/failover_test.cc).
//
// Threads: the loop thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/clock.h"
#include "common/status.h"
#include "common/timer.h"
#include "state/records.h"
#include "supervisor/engine_fsm.h"
#include "supervisor/promotion_check.h"
#include "wire/json_socket.h"

namespace wsup {

class Failover {
 public:
  using Waiters = std::vector<std::shared_ptr<JsonConn>>;
  // What a promotion did: promoted, or why not (unfit); note is the caveat
  // of one promoted on an old probe answer.
  struct Promotion {
    bool promoted = false;
    std::string unfit, note;
  };

  struct Hooks {
    // The slot's table state; none for a name that is no slot.
    std::function<std::optional<SlotState>(const std::string& slot)> state;
    // The other engine slot of the node.
    std::function<std::string(const std::string& slot)> other;
    // Checks the slot and promotes it (supervisor/promotion_check.h).
    std::function<Promotion(const std::string& slot, const std::string& cause)> promote;
    // Gives the front the routes the engines' states call for.
    std::function<void()> push_routes;
    // The ledger's failovers row: written (its id; *seq its place in the
    // ledger's queue), and its later times.
    std::function<Result<int64_t>(const FailoverRecord& rec, uint64_t* seq)> record_row;
    std::function<Status(int64_t id, int64_t ms)> set_gone;
    std::function<Status(int64_t id, int64_t ms)> set_kv_full;
    std::function<Status(int64_t id, int64_t ms, uint64_t* seq)> set_first_ok;
    // A ledger write that failed (logged and counted by the node).
    std::function<void(const Status& st, const char* what)> ledger_error;
    // Why the latest row was refused before it was queued.
    std::function<std::string()> ledger_last_error;
    // A failover of this trigger (the failovers metric), and each of its
    // phases as it ends, in seconds from the one before (docs/metrics.md,
    // wsup_failover_phase_seconds): "detect" (fault to detection), "swap"
    // (detection to the front's new routes), "first_answer" (fault to the
    // first correct answer through the front), "kv_full" (fault to the
    // promoted engine's full KV).
    std::function<void(const std::string& trigger)> counted;
    std::function<void(const char* phase, double seconds)> phase;
    // The node has a KV pool; the slot maps it now.
    std::function<bool()> pool_enabled;
    std::function<bool(const std::string& slot)> pool_held_by;
    // The failed slot is to recover from this failover (its row, when
    // written): its recovery bookkeeping, and its restart when its process
    // is already gone.
    std::function<void(const std::string& slot, const std::string& trigger, int64_t fault_ms,
                       std::optional<int64_t> id)>
        rearm;
    // The slot's own probes wait while the proof probes it.
    std::function<void(const std::string& slot)> postpone_probe;
    // A probe through the front; done(ok, wall ms of the answer).
    std::function<void(std::function<void(bool ok, int64_t at_ms)> done)> probe;
    // Sends reply to the waiters now.
    std::function<void(const Waiters& waiters, const nlohmann::json& reply)> send;
    // Sends reply to the waiters once the ledger has handled what is queued
    // now, saying whether rows (or unrecorded) are on disk.
    std::function<void(Waiters waiters, nlohmann::json reply, std::vector<uint64_t> rows, std::string unrecorded)>
        answer;
    std::function<void()> status_line;
    // A failover ended, proven or not (a rollout step may wait for it).
    std::function<void()> ended;

    // ---- planned swaps and drills
    // The active slot ("" when none).
    std::function<std::string()> active;
    // The promotion check of promotion_check.h on the slot, now.
    std::function<PromotionCheck(const std::string& slot)> check;
    // The step of the rollout in progress ("" when none): drills wait.
    std::function<std::string()> rollout_step;
    // A drill: SIGKILL the slot's engine, its fault dated fault_ms; its exit
    // drives the failover as a crash's would.
    std::function<void(const std::string& slot, int64_t fault_ms)> kill;
    // Moves the slot by the engine table: demote (no new traffic), and
    // drained (it is the standby again).
    std::function<void(const std::string& slot, const std::string& why)> demote;
    std::function<void(const std::string& slot, const std::string& why)> drained;
    // How many requests the front still has on the slot's engine; done(0)
    // when the front cannot say (no front, an unreadable answer).
    std::function<void(const std::string& slot, std::function<void(int64_t inflight)> done)> inflight;
  };

  // How long a planned swap's old engine may drain, and how often the
  // front is asked what it still has in flight there.
  static constexpr int64_t kDrainBudgetMs = 30'000;
  static constexpr int64_t kDrainPollMs = 20;

  // How long after the swap a failover may wait for its first correct
  // answer through the front. It normally comes in milliseconds; one that
  // has not come by then (the front down, no answer right) is ended
  // unproven, so that drills and rollouts are not refused for ever.
  static constexpr int64_t kProofBudgetMs = 120'000;

  // timers and clock must outlive this.
  Failover(TimerSource& timers, const Clock& clock, Hooks hooks);
  Failover(const Failover&) = delete;
  Failover& operator=(const Failover&) = delete;

  // The active slot `from` failed (its process still exiting: from_alive).
  // The other slot takes the traffic if it can; the row is written; the
  // failed slot is re-armed; a promoted engine's proof begins.
  void OnFailed(const std::string& from, bool from_alive, FailoverTrigger trigger, const std::string& reason,
                int64_t fault_ms, bool drill);
  // Why the traffic of the active slot `from` cannot move to `to` now (""
  // when it can): no active engine, a failover in progress, or a standby
  // that is not proven ready and recently.
  std::string SwapRefusal(const std::string& from, const std::string& to) const;
  // `wsup failover`: a planned swap, or (kill) a kill drill. Refused, and c
  // told why, while a swap cannot happen (SwapRefusal) or a rollout runs.
  void Drill(const std::shared_ptr<JsonConn>& c, bool kill);
  // A planned swap: `to` takes new traffic at once, `from` drains and
  // becomes the standby; `why` is its cause ("planned drill", a rollout's).
  // c (may be null) gets its answer. False when `to` was not promoted.
  bool PlannedSwap(const std::string& from, const std::string& to, const std::string& why,
                   const std::shared_ptr<JsonConn>& c);
  // With no active engine, `slot` was promoted: a failover that had no
  // engine to take over has one now, and its proof begins.
  void OnPromoted(const std::string& slot);
  // A correct answer through the front's active route, at wall at_ms.
  void OnFirstOk(int64_t at_ms);
  // The front acknowledged its routes: the swap is done.
  void OnRoutesAcked();
  // The slot's process exited; the KV pool was mapped by the slot.
  void OnEngineGone(const std::string& slot);
  void OnKvFull(const std::string& slot);

  bool InProgress() const { return pending_.has_value(); }
  // "a failover is in progress (engine a to b, 2 s ago; ...)"; "" when none.
  std::string PendingText() const;
  // Why another failover cannot begin now ("" when it can): the one in
  // progress, and when to try again.
  std::string Refusal() const;
  // A `wsup failover` caller is told that its failover will not happen.
  void Refuse(const std::shared_ptr<JsonConn>& c, const std::string& why);
  // `failover` of `wsup status`.
  nlohmann::json StatusJson() const;

 private:
  // A failover waiting for its first good answer through the front.
  struct Pending {
    int64_t id = 0;
    std::string from, to;
    int64_t fault_ms = 0, detected_ms = 0, swapped_ms = 0;
    Waiters waiters;  // `wsup failover` callers
    bool drill = false;
    // Its ledger rows (sequence numbers, Ledger::LostRow), and why one
    // was refused before it was even queued: `wsup failover` says whether
    // the ledger has them.
    std::vector<uint64_t> rows;
    std::string unrecorded;
  };
  // The latest failover whose later times are still to be recorded: the
  // failed engine's exit and the promoted engine's full KV.
  struct Times {
    int64_t id = 0;
    std::string from, to;
    int64_t fault_ms = 0;
    bool await_gone = false, await_kv = false;
  };
  // The old engine of a failover: its exit still to come (gone_ms then),
  // already seen (gone_ms now), or none (a planned swap: no gone_ms).
  enum class FromEngine { kExiting, kExited, kLivesOn };

  // The row written; its id, or none when it was not (*seq then unset).
  std::optional<int64_t> RecordRow(const FailoverRecord& rec, uint64_t* seq, const char* what);
  // The pending failover from now on; its rows, or why it has none.
  void SetPending(Pending p, std::optional<int64_t> id, uint64_t seq);
  void Track(std::optional<int64_t> id, const std::string& from, FromEngine old, const std::string& to,
             int64_t fault_ms);
  // Starts the budget of the pending failover (it has an engine to prove),
  // and the probe through the front that proves it.
  void ArmProof();
  void Complete(int64_t first_ok_ms);
  // Ends the pending failover unproven: logged, and its callers told.
  void Abandon(const std::string& why);
  // A planned swap moved the traffic from `from` (which lives on) to
  // `standby`, or did not (not promoted: unfit says why).
  void OnSwapped(const std::string& from, const std::string& standby, bool promoted, const std::string& why,
                 const std::string& unfit, int64_t fault_ms, int64_t swapped_ms, const std::shared_ptr<JsonConn>& c);
  // A drill kills `from` now: c is answered by the failover its exit drives.
  void ExpectKill(const std::string& from, int64_t fault_ms, const std::shared_ptr<JsonConn>& c);
  // The planned swap's old engine: drained once the front has nothing in
  // flight on it, or after kDrainBudgetMs.
  void FinishDrain(const std::string& old, int64_t started_mono);
  void LedgerError(const Status& st, const char* what) {
    if (!st.ok() && hooks_.ledger_error) hooks_.ledger_error(st, what);
  }

  TimerSource& timers_;
  const Clock& clock_;
  Hooks hooks_;
  std::optional<Pending> pending_;
  std::unique_ptr<Timer> proof_budget_;
  std::optional<Times> tail_;
  // The next question to the front about a draining engine, by slot.
  std::map<std::string, std::unique_ptr<Timer>> drain_polls_;
};

}  // namespace wsup
