// Adopter: a restarted supervisor takes over the engines its predecessor
// recorded in state.json, and records what it can prove happened to those
// that died while no supervisor ran.
//
// Adopt(prev), in this order:
//   1. the KV pool's owner is known before any engine takes a role, so the
//      active engine is never granted a pool another engine may still write;
//   2. each recorded engine, the one that was active first, is adopted when
//      it still runs as recorded (EngineSet::Adopt); an adopted active engine
//      keeps the traffic (Hooks::keep_active: not a promotion, the front
//      already sends it there), however slowly it answers now, and its
//      probes judge it from then on. Meanwhile no engine is promoted
//      (Hooks::adopting);
//   3. the pool's owner from the engines' own word, then the roles settle
//      (Hooks::settle: a promotion if none was active);
//   4. the engines that died are dated and their failovers recorded
//      (reconstruct.h), once the front has answered with its log, or
//      without it if it does not answer or its answer cannot be read;
//   5. a rollout the predecessor ran is ended (Rollout::Resume).
//
// Adoption never judges an engine by how fast it answers.
//
// The engines, the pool, the front and the ledger are reached through
// Hooks, so every rule is tested on fakes
// (tests/supervisor_core/adopter_test.cc).
//
// Threads: the loop thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/clock.h"
#include "state/records.h"
#include "supervisor/runtime_state.h"

namespace wsup {

class Adopter {
 public:
  // What became of a recorded engine (EngineSet::Adoption).
  enum class Fate { kAdopted, kReplaced, kGone };
  struct Hooks {
    std::function<void(const std::string& owner)> kv_held;
    std::function<Fate(const RuntimeState::Engine&)> adopt;
    // The adopted engine `slot` was active: it stays active.
    std::function<void(const std::string& slot)> keep_active;
    // An engine that ran as recorded served before this start.
    std::function<void()> proven;
    std::function<void(bool adopting)> adopting;
    std::function<void(const RuntimeState&)> kv_owner;
    std::function<void()> settle;
    // Whether this node has the slot named (a config may have changed).
    std::function<bool(const std::string& slot)> has_slot;
    // The slot's restart is a recovery of `cause` from fault_ms, with its
    // failover row when it has one.
    std::function<void(const std::string& slot, const std::string& cause, int64_t fault_ms, std::optional<int64_t> id)>
        date;
    // Asks the front's status; null when it does not answer.
    std::function<void(std::function<void(const nlohmann::json* reply)>)> ask_front;
    // Every slot of the node with its engine's address now, and the active one ("" when none).
    std::function<std::vector<std::pair<std::string, std::string>>()> slots;
    std::function<std::string()> active;
    // HOST:PORT of an engine on this node's engine host.
    std::function<std::string(int port)> address;
    // Records a reconstructed failover: its row id, none when the write failed.
    std::function<std::optional<int64_t>(const FailoverRecord&)> record;
    std::function<void(const RuntimeState::Rollout&)> resume_rollout;
  };

  Adopter(const Clock& clock, Hooks hooks);

  void Adopt(RuntimeState prev);

 private:
  void Reconcile(const RuntimeState& prev, const std::vector<RuntimeState::Engine>& dead);

  const Clock& clock_;
  Hooks hooks_;
};

}  // namespace wsup
