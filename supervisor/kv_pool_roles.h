// KvPoolRoles: the node's KV pool ([kv] pool_mib > 0) as one owner. It
// alone holds the pool's table (kv_handover.h: who may map the pool, who
// wants it), the role requests that carry the table's actions out (POST
// /wsup/role, engine/kv_pool_link.h) and the watch on a pool owner that a
// restarted supervisor could not adopt.
//
// Its events come from the engine table's moves (OnSlotMoved) and from an
// engine's exit (OnExit): a slot that becomes active is wanted; one that
// fails is fenced; one that drains is asked to let the pool go; only an
// answer that it did, or its exit, frees the pool for the next. The
// lifeline's EOF fails a slot (it is dying), but never frees the pool: a
// dying GPU process may still be running kernels.
//
// What an engine says of its KV (a role answer, its status) is judged
// here (OnEngineKv): an engine that maps the pool though the table does
// not make it the owner is fenced at once (killed, recorded), since two
// writers of one pool serve wrong tokens.
//
// What it cannot do itself (send a request to an engine, move a slot by
// its table, record a fence, run something later, save the node's state)
// it does through Hooks given once at construction, so tests drive it on
// fake slots, fake answers and fake timers (tests/supervisor_core/
// kv_pool_roles_test.cc).
//
// Threads: the loop thread only.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/clock.h"
#include "common/status.h"
#include "http/client.h"
#include "state/records.h"
#include "supervisor/config.h"
#include "supervisor/engine_slot.h"
#include "supervisor/kv_handover.h"
#include "supervisor/metrics.h"
#include "supervisor/process.h"
#include "supervisor/runtime_state.h"

namespace wsup {

class KvPoolRoles {
 public:
  // How long an engine may take to map the pool or to let it go. Mapping is
  // milliseconds; letting go waits for the sequences on the pool, which a
  // drain has ended already, so a release past this is a stuck engine.
  static constexpr int64_t kGrantTimeoutMs = 30'000;
  static constexpr int64_t kReleaseTimeoutMs = 30'000;
  // The longest work waits for a pool grant in flight (AfterGrant).
  static constexpr int64_t kHoldForGrantMs = 100;
  // A want the table could not grant yet (the pool was not free) is tried
  // again after this.
  static constexpr int64_t kGrantRetryMs = 1000;

  using Answer = std::function<void(Result<http::HttpResponse>)>;
  struct Hooks {
    // The slot of that name ("a" or "b"); null for any other name.
    std::function<EngineSlot*(const std::string& name)> slot;
    // Moves a slot by the engine table (kKvStuck, kKvTrespass).
    std::function<void(EngineSlot&, SlotEvent, const std::string& cause)> fire;
    // Sends a request to the slot's engine (its host and port); `done`
    // runs on the loop with the answer or the error.
    std::function<void(EngineSlot&, http::ClientRequest, Answer done)> send;
    // Asks the slot's engine for its status again (an answer that crossed a
    // move of the table is not judged; a fresh one is).
    std::function<void(EngineSlot&)> refresh_status;
    // The ledger's `fences` row of an engine killed for what it did.
    std::function<void(const FenceRecord&)> record_fence;
    // The engine of that slot maps the pool: its failover's KV is back.
    std::function<void(const std::string& slot)> kv_full;
    // Runs `work` once after `ms` on the loop.
    std::function<void(int64_t ms, std::function<void()> work)> after;
    // state.json again: a restarted supervisor must know who may write the pool.
    std::function<void()> save_state;
    // Watches a process not started by this supervisor (its exit runs `done`).
    std::function<Result<ProcessWatch*>(pid_t, std::function<void(const ExitInfo&)> done)> watch_exit;
    // The recorded process still runs as recorded.
    std::function<bool(const ProcessRef&)> still_runs;
  };

  KvPoolRoles(const Config& cfg, const Clock& clock, Metrics& metrics, Hooks hooks);
  ~KvPoolRoles();
  KvPoolRoles(const KvPoolRoles&) = delete;
  KvPoolRoles& operator=(const KvPoolRoles&) = delete;

  bool Enabled() const { return pool_mib_ > 0; }

  // The pool's events that follow from a move of the engine table.
  void OnSlotMoved(EngineSlot& s, SlotState from, SlotState to, const std::string& cause);
  // The slot's process has exited: only that frees a pool it held.
  void OnExit(EngineSlot& s, const std::string& why);
  // What an engine said of its KV (`kv` of its status or role answer), in
  // an answer to a request sent when the table was at `seq_at_send`
  // (seq()). An answer that crossed a move of the table is not judged: it
  // may describe the engine before a release or a grant that the table has
  // seen since; the engine is asked again instead.
  void OnEngineKv(EngineSlot& s, const nlohmann::json& kv, uint64_t seq_at_send, const char* where);
  // Moves of the table so far.
  uint64_t seq() const { return seq_; }

  // Work held back while a grant is on its way: the grant is what the node
  // waits for after a crash (full KV), and a restart's spawn blocks the
  // loop for a millisecond or more (posix_spawn waits for the exec). Run
  // when the grant answers, or after kHoldForGrantMs at the latest.
  void AfterGrant(std::function<void()> work);

  // A restarted supervisor: the pool's owner before the restart, known
  // before any engine takes a role (AdoptHeld), then, once the engines are
  // adopted, kept (the active one), released (it is the standby now), or
  // freed once its process is gone (AdoptOwner).
  void AdoptHeld(const std::string& slot);
  void AdoptOwner(const RuntimeState& prev);

  const std::string& owner() const { return table_.owner(); }
  PoolState state() const { return table_.state(); }
  bool HeldBy(const std::string& slot) const { return owner() == slot && state() == PoolState::kHeld; }
  // `wsup status`'s kv_pool object.
  nlohmann::json StatusJson() const;

  // Stops watching an owner that was not adopted (the supervisor exits).
  void Close();

 private:
  KvHandover::Step Fire(EngineSlot& s, PoolEvent event, const std::string& why);
  void Grant(EngineSlot& s);
  void Release(EngineSlot& s);
  // POST /wsup/role; the answer's `kv` is kept in the slot before `done`.
  void SendRole(EngineSlot& s, const std::string& role, bool pool, int64_t timeout_ms, Answer done);
  void RunHeldForGrant();

  int64_t pool_mib_;
  int64_t scratch_mib_;
  const Clock& clock_;
  Metrics& metrics_;
  Hooks hooks_;
  KvHandover table_;
  uint64_t seq_ = 0;
  bool grant_in_flight_ = false;
  std::vector<std::function<void()>> held_for_grant_;
  ProcessWatch* fence_watch_ = nullptr;  // the exit of a pool owner that was not adopted
};

}  // namespace wsup
