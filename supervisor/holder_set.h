// HolderSet: the node's weight holders (daemon mode, one per rank) as one
// owner. It alone holds each holder's process (pid, exit watch, readiness
// pipe, restart timer and throttle) and what the supervisor keeps of it:
// the arena's manifest and fds, the committed engine-made layouts, the KV
// pool. Everything else in the supervisor goes through the methods below.
//
// A holder is spawned, proven up by its readiness line ("ready <socket>"
// on its --ready-fd; anything else is refused and the holder killed), kept
// (the supervisor takes the arena's manifest and fds off the loop, maps
// nothing), and restarted from those fds when it dies, so no byte of the
// checkpoint is read again.
//
// A holder of engine-made layouts (weight_cache.layout = "engine") has no
// arena of its own; its committed layouts are kept instead, one by one,
// whole or not at all (client/client.h KeepLayouts). A keep round asks the
// holder which layouts it has committed and takes the record and fds of
// each one not kept yet. Rounds run when the holder is up (that round makes
// it ready) and whenever an engine reports weights from the holders
// (KeepLayoutsEverywhere); one runs at a time per holder, and a trigger
// during a round asks for one more after it. A new holder is given every
// kept layout (--adopt-layouts, <runtime_dir>/holder-RANK.layouts.json);
// its first round drops, and logs, a kept layout it does not list. A holder
// that refuses the whole record (a permanent exit) is started once more
// without kept layouts. Kept layouts are released at `wsup stop`.
//
// The node's KV pool ([kv] pool_mib > 0): once a holder is ready its pool
// (description and fds, nothing mapped) is fetched off the loop and kept;
// a new holder is given it (--adopt-kv-pool, <runtime_dir>/holder-RANK.
// kvpool.json, wire/kv_pool_record.h) and serves the same pool under the
// same id; the fetch after it is ready checks that.
//
// Its life is the holder rows of the child table (child_fsm.h): every event
// goes through Fire(), which looks the row up, logs it with its cause and
// carries out its action. What it cannot decide itself (whether the node
// is stopping, what follows once every holder is ready, where a restart's
// ledger row goes) it asks or tells through Hooks, given once at
// construction; the launcher, the timers and the keeper's exchanges come in
// the same way, so tests drive it on fake processes and a fake clock
// (tests/supervisor_core/holder_set_test.cc).
//
// Threads: the loop thread only, except the keeper's exchanges (Keeper),
// which run on libuv's thread pool and come back through their after-work
// callbacks on the loop.
#pragma once

#include <uv.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "client/client.h"
#include "client/kv_pool.h"
#include "common/clock.h"
#include "common/status.h"
#include "common/timer.h"
#include "common/unique_fd.h"
#include "state/records.h"
#include "supervisor/child_fsm.h"
#include "supervisor/config.h"
#include "supervisor/launcher.h"
#include "supervisor/restart_throttle.h"
#include "supervisor/runtime_state.h"

namespace wsup {

// OK when `line`, what a holder wrote on its --ready-fd, says it serves on
// `socket` ("ready <socket>", or a bare "ready"); otherwise InvalidArgument
// saying what was wrong and how to fix the holder's command.
Status CheckHolderReadyLine(const std::string& line, const std::string& socket);

class HolderSet {
 public:
  // The short blocking exchanges with a holder, run on the thread pool (so
  // each must be safe to call from any thread). Real() is client/client.h
  // and client/kv_pool.h; tests answer without a holder.
  struct Keeper {
    std::function<Result<KeptArena>(const std::string& socket)> attach;
    std::function<Result<LayoutKeepRound>(const std::string& socket, const std::vector<CommittedLayout>& have,
                                          uint64_t max_fds)>
        keep_layouts;
    std::function<Result<KvPoolFds>(const std::string& socket)> fetch_kv_pool;
    static Keeper Real();
  };

  struct Hooks {
    // The node is stopping: nothing is started or restarted.
    std::function<bool()> stopping;
    // A holder cannot be started at all (its command, a pipe, the spawn):
    // the node stops with this exit code.
    std::function<void(const std::string& why, int exit_code)> fatal;
    // A process changed, or what is kept of it: state.json is written again.
    std::function<void()> save_state;
    // Every holder is ready: the engines may start.
    std::function<void()> all_ready;
    // A restart is complete (the new holder is ready): its ledger row.
    std::function<void(const HolderRestartRecord&)> restarted;
    // A holder is given up on: the node is degraded for this reason.
    std::function<void(const std::string& why)> down;
    // Hands kept fds to the service manager's fd store under `name`.
    std::function<void(const std::string& name, const std::vector<int>& fds)> store_fds;
    // A holder's process exited and the table has moved.
    std::function<void()> exited;
  };

  // cfg is read at each use (a reload changes it in place) and must outlive
  // this, as must loop, launcher and clock.
  HolderSet(uv_loop_t* loop, Launcher& launcher, TimerSource& timers, const Clock& clock, const Config& cfg,
            std::string bin_dir, Hooks hooks, Keeper keeper = Keeper::Real());
  // Stops watching the processes; they run on. Keeper answers still on the
  // thread pool are dropped when they come back.
  ~HolderSet();
  HolderSet(const HolderSet&) = delete;
  HolderSet& operator=(const HolderSet&) = delete;

  // One holder per rank (parallel.tp): those `prev` recorded that still run
  // are adopted (kept again, no spawn), the others spawned. Stops early
  // once the node is stopping.
  void Start(const std::vector<RuntimeState::Holder>& prev);
  // The node is stopping: no restart; every process is asked to stop.
  void Stop(const std::string& why);
  // Forgets the processes without stopping them (the supervisor goes away).
  void Detach();
  // Closes the kept arenas and layouts (the holders have stopped).
  void ReleaseKept();
  // After an engine reports weights from the holders: a commit may be new.
  void KeepLayoutsEverywhere();
  // A reload's policy for what comes next; restarts seen so far still count.
  void SetRestartPolicy(const RestartPolicy& policy);

  // True when every holder is ready (and when there are none).
  bool AllReady() const;
  bool AnyProcess() const;
  size_t size() const { return holders_.size(); }
  // Per rank; a rank not held reads as idle, no process, nothing said.
  ChildState state(int rank) const;
  pid_t pid(int rank) const;
  uint64_t restarts(int rank) const;
  // Why it was given up on ("" while it is not).
  std::string failure(int rank) const;
  // The last thing it did wrong while alive (a refused readiness line, a
  // failed keep); "" when none.
  std::string last_error(int rank) const;
  // Their entries in state.json: those with a process.
  std::vector<RuntimeState::Holder> Records() const;
  // `holders` of `wsup status`.
  nlohmann::json StatusJson() const;

 private:
  struct Holder;

  void Spawn(Holder& h);
  void Adopt(Holder& h, const RuntimeState::Holder& prev);
  void Fire(Holder& h, ChildEvent event, const std::string& cause, int exit_code = -1);
  void WatchExit(Holder& h);
  void WatchReadyLine(Holder& h, UniqueFd read_end);
  void OnReadyLine(Holder& h, const std::string& line);
  void AttachKeeperAsync(Holder& h);
  void OnKept(Holder& h, Result<KeptArena> kept);
  // `first`: the round that makes a holder ready (keeping --kept-->).
  void KeepLayoutsAsync(Holder& h, bool first);
  void OnLayoutsKept(Holder& h, Result<LayoutKeepRound> round, bool first);
  void KeepKvPoolAsync(Holder& h);
  void OnKvPoolFetched(Holder& h, Result<KvPoolFds> fetched);
  // The restart now complete, if one was (its restart_reason set).
  void RecordRestart(Holder& h, int64_t now);
  void OnExit(Holder& h, const ExitInfo& info);
  void ScheduleRestart(Holder& h, int exit_code, const std::string& how);
  // The fds kept for every holder, and how many this process may keep (a
  // holder restart passes each one twice at once: process.h).
  uint64_t KeptFds() const;
  static uint64_t FdBudget();
  const Holder* Find(int rank) const;
  bool Stopping() const { return hooks_.stopping && hooks_.stopping(); }
  void SaveState() {
    if (hooks_.save_state) hooks_.save_state();
  }
  std::string LogPath(int rank) const;

  uv_loop_t* loop_;
  Launcher& launcher_;
  TimerSource& timers_;
  const Clock& clock_;
  const Config& cfg_;
  std::string bin_dir_;
  Hooks hooks_;
  Keeper keeper_;
  std::vector<std::unique_ptr<Holder>> holders_;
  // Shared with the keeper's work in flight: false once this is destroyed,
  // so that an answer coming back after that touches nothing.
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

// The holders' restart policy, from the one [supervisor] section.
RestartPolicy HolderRestartPolicy(const Config& cfg);

}  // namespace wsup
