// EngineSet: the node's two engine slots (engine_slot.h) and their lives,
// as one owner. It alone starts an engine (its port, nonce, control token,
// lifeline, death word and ready pipe), knows it by its identity, polls its
// status while it starts, probes it while it lives, carries out the engine
// table's actions (engine_fsm.h) on its process, sees its exit and restarts
// it within its budget.
//
// Every move of a slot goes through Fire(), which looks the row up, logs it
// with its cause and publishes it once on events() (engine_events.h). The
// node subscribes what follows a move there, in the order its effects must
// happen; the table's own action on the process (Apply) and the recovery
// row (OnMoved) are two of those subscribers, so that the order stays in
// one place (the node's SubscribeToEngines()).
//
// What it cannot decide itself (whether the node is stopping, which rows go
// to the ledger, the KV pool's say on an exit or a status, a failover, the
// front's routes and cuts, a rollout's failed version) it asks or tells
// through Hooks, given once at construction; the launcher, the timers and
// the HTTP client come in the same way, so tests drive it on fake processes
// and a fake clock (tests/supervisor_core/engine_set_test.cc).
//
// Identity, not ports: each start gets a nonce (WSUP_ENGINE_NONCE in its
// environment, {nonce} in its command). An engine that echoes it in
// /wsup/status is known by it; one that does not is known by the listening
// socket: its process group must hold the socket on its port. Whatever else
// answers on the port (another node's engine, a leftover) is never taken
// for ready and never routed.
//
// Threads: the loop thread only.
#pragma once

#include <uv.h>

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "common/clock.h"
#include "common/one_shots.h"
#include "common/timer.h"
#include "http/client.h"
#include "state/records.h"
#include "supervisor/config.h"
#include "supervisor/engine_events.h"
#include "supervisor/engine_slot.h"
#include "supervisor/launcher.h"
#include "supervisor/messages.h"
#include "supervisor/metrics.h"
#include "supervisor/promotion_check.h"
#include "supervisor/runtime_state.h"

namespace wsup {

// The engines' restart policy, from the [supervisor] section.
RestartPolicy EngineRestartPolicy(const Config& cfg);

class EngineSet {
 public:
  struct Hooks {
    // The node is stopping: nothing is started or restarted.
    std::function<bool()> stopping;
    // A config that cannot work: the node stops with this exit code.
    std::function<void(const std::string& why, int exit_code)> fatal;
    // A slot that will not be restarted (degraded, with why).
    std::function<void(const std::string& why)> degraded;
    // state.json again (a new process must be findable by a successor).
    std::function<void()> save_state;
    // An engine's exit was handled (the node may finish its stop).
    std::function<void()> exited;
    // A rollout's version for that slot could not be started.
    std::function<void(const std::string& slot, const std::string& why)> version_failed;
    // The weight holders are asked for layouts not kept yet (an engine
    // published or attached engine-made layouts).
    std::function<void()> keep_layouts;
    // Wrong answers from both slots may stop the node only while no rollout
    // runs (a new version's answers are the rollout's to judge).
    std::function<bool()> rollout_in_progress;
    // Ledger rows: a cache lookup, a probe health move, a recovery.
    std::function<void(const CacheEventRecord&)> record_cache;
    std::function<void(const ProbeTransitionRecord&)> record_probe;
    std::function<void(const RecoveryRecord&)> record_recovery;
    // The KV pool (kv_pool_roles.h): its table's moves so far, its verdict
    // on what an engine says of its KV, an exit, and work that waits for a
    // grant in flight.
    std::function<uint64_t()> kv_seq;
    std::function<void(EngineSlot&, const nlohmann::json& kv, uint64_t seq_at_send, const char* where)> kv_said;
    std::function<void(EngineSlot&, const std::string& why)> kv_exit;
    std::function<void(std::function<void()> work)> after_grant;
    // The table's failover action: the slot failed (failover.h OnFailed).
    std::function<void(const std::string& slot, bool had_process, FailoverTrigger trigger, const std::string& cause,
                       int64_t fault_ms, bool drill)>
        failed;
    // Its process is gone (failover.h OnEngineGone).
    std::function<void(const std::string& slot)> gone;
    // The front cuts what it has in flight on that engine and sends it on.
    std::function<void(const std::string& address, const std::string& why)> cut;
    // The table's route actions: the front's routes may have changed.
    std::function<void()> routes_changed;
  };

  EngineSet(uv_loop_t* loop, Launcher& launcher, TimerSource& timers, const Clock& clock, const Config& cfg,
            http::HttpClient& http, Metrics& metrics, Hooks hooks);
  ~EngineSet();
  EngineSet(const EngineSet&) = delete;
  EngineSet& operator=(const EngineSet&) = delete;

  // ---- the slots
  std::array<EngineSlot*, 2> slots() { return {&a_, &b_}; }
  std::array<const EngineSlot*, 2> slots() const { return {&a_, &b_}; }
  EngineSlot* ByName(const std::string& name);
  EngineSlot* Other(const EngineSlot* s) { return s == &a_ ? &b_ : &a_; }
  EngineSlot* Active();
  bool HasActive() const { return a_.state == SlotState::kActive || b_.state == SlotState::kActive; }
  // The slot that is not the active one, when it is a proven standby.
  EngineSlot* Standby();
  // Every move of a slot's table, published by Fire().
  EngineEventList& events() { return events_; }

  // ---- lives
  // Starts every idle slot (once, when the holders are ready).
  void Start();
  bool started() const { return started_; }
  // Starts a process in the slot, with its rollout version if it has one.
  void Spawn(EngineSlot& s);
  // A start of the slot as a recovery of `cause` (a rollout's new version),
  // dated now: run off the current call (which may be an exit's own
  // handling), and only once engines may start at all (a restarted
  // supervisor waits for its holders; Start() starts an idle slot then)
  // and while the slot is stopped or idle.
  void SpawnAsRecovery(EngineSlot& s, const std::string& cause);
  // Moves the slot by its table and publishes the move.
  void Fire(EngineSlot& s, SlotEvent event, const std::string& cause);
  // The table's action on the slot's process (a subscriber of events()).
  void Apply(EngineSlot& s, const SlotTransition& t, const std::string& cause);
  // After a move: a slot proven ready again gets its recovery row, dated
  // now (a subscriber of events(), before the action).
  void OnMoved(EngineSlot& s, const SlotTransition& t);
  // A failed slot is restarted within its budget (exit_code -1: unknown).
  void ScheduleRestart(EngineSlot& s, int exit_code);
  // What `wsup reload` changed at once (the config this set reads): the
  // restart budget, and, when the probe's settings changed, probes of the
  // new shape (a monitor starts over; the engine's role does not change).
  void Reconfigured(bool probe_changed);
  // GET /wsup/status of a serving engine: its KV (judged by the pool),
  // resume counts, communicator and memory.
  void RefreshStatus(EngineSlot& s);

  // ---- promotion
  // The check of promotion_check.h on this slot.
  PromotionCheck CheckStandby(const EngineSlot& s) const;
  // Checks the slot first; an unfit one is failed and replaced. *unfit
  // gets why it was not promoted, *note the caveat of a promotion on an
  // old probe answer. True when the slot is active now.
  bool Promote(EngineSlot& s, const std::string& cause, std::string* unfit, std::string* note = nullptr);

  // ---- a restarted supervisor
  enum class Adoption { kAdopted, kReplaced, kGone };
  // The engine recorded in the previous state.json: adopted when it still
  // runs as recorded and listens on its port (it takes the recorded role's
  // first step, `adopt`), killed when it runs but is not fit to adopt, or
  // gone. `version_text` is its recorded version as the node shows it.
  Adoption Adopt(const RuntimeState::Engine& pe, const std::string& version_text);
  // The recorded process still runs as recorded (pid and start time), as
  // the launcher sees it.
  bool StillRuns(const ProcessRef& p) const;

  // An engine passed a probe, or was adopted, since this supervisor
  // started: a wrong answer is then an engine's fault, never the config's.
  bool ever_proven() const { return ever_proven_; }
  void MarkProven() { ever_proven_ = true; }

  // `wsup status`'s engines array (pool_enabled: an engine that keeps a
  // private cache says so).
  nlohmann::json StatusJson(bool pool_enabled) const;

  // A process runs in a slot.
  bool AnyProcess() const { return a_.pid > 0 || b_.pid > 0; }
  // Stops every probe and status refresh (the node has stopped).
  void StopProbing();
  // Stops watching and probing every process (they keep running).
  void Close();

 private:
  void PollStatus(EngineSlot& s);
  bool CheckIdentity(EngineSlot& s, const nlohmann::json* status);
  void OnEngineStatus(EngineSlot& s, const nlohmann::json& status, const EngineStatus& view);
  void RecordCache(EngineSlot& s, const EngineStatus::Weights& weights);
  void StartProbing(EngineSlot& s);
  // Stops the node (exit 78) when both engines' wrong answers show that the
  // model does not produce the probe's expected answer (expectation_check.h).
  void CheckExpectation(EngineSlot& s);
  void OnExit(EngineSlot& s, const ExitInfo& info);
  void OnDying(EngineSlot& s, pid_t pid, const std::string& how);
  void RestartNow(EngineSlot& s);
  // A best-effort signal whose failure must be seen.
  void Signal(pid_t pid, int sig, const char* what);

  uv_loop_t* loop_;
  Launcher& launcher_;
  const Clock& clock_;
  const Config& cfg_;
  http::HttpClient& http_;
  Metrics& metrics_;
  Hooks hooks_;
  // Work moved off the current call.
  OneShots later_;
  EngineSlot a_, b_;
  EngineEventList events_;
  bool started_ = false;
  bool ever_proven_ = false;
};

}  // namespace wsup
