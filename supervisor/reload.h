// Reloader: `wsup reload` and SIGHUP. It reads the config file again (with
// the node's overrides and the caller's `--set`s), plans what changes
// (reload_plan.h), refuses what cannot change on a running node, applies
// at once what can, and hands a new engine version to the rollout, which
// rolls it through the standby first. Every refusal names its cause and
// what to do, and is logged: a SIGHUP's has no one else to be told to.
//
// It owns nothing but the config it was given, which it changes in place
// when a reload is applied (the node's other owners hold the same Config
// by reference and read it at their next use). The engines, the rollout,
// the failover and the ledger are reached through Hooks.
//
// Threads: the loop thread only.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "state/records.h"
#include "supervisor/config.h"
#include "supervisor/engine_fsm.h"
#include "supervisor/engine_version.h"
#include "supervisor/reload_plan.h"
#include "wire/json_socket.h"

namespace wsup {

class Reloader {
 public:
  // The engine slots as a reload sees them.
  struct Pair {
    std::string active;   // "" when no engine serves
    std::string standby;  // the other slot ("" with no active engine)
    SlotState standby_state = SlotState::kIdle;
  };
  struct Hooks {
    std::function<bool()> stopping;
    // Why a rollout now is impossible because one runs ("" when none).
    std::function<std::string()> rollout_busy;
    // Why a swap now is impossible because a failover runs ("" when none).
    std::function<std::string()> failover_busy;
    std::function<Pair()> pair;
    // What each live slot runs now (a slot may run another version than
    // the config names: a restarted supervisor keeps its engines' version).
    std::function<std::vector<SlotVersion>()> running;
    // A refused reload's rollouts row.
    std::function<void(const RolloutRecord&)> record_refused;
    // Changes were applied to the config at once: the owners take them up.
    std::function<void(bool probe_changed)> applied;
    // Rolls standby then active to version; c (may be null) is answered
    // when the rollout ends.
    std::function<void(const std::string& standby, const std::string& active, const EngineVersion& version,
                       const std::string& why, const std::shared_ptr<JsonConn>& c)>
        roll;
    // The answer to the caller (null c for a SIGHUP).
    std::function<void(const std::shared_ptr<JsonConn>& c, const nlohmann::json& reply)> reply;
  };

  // cfg is the node's running config, changed in place by an applied
  // reload; it and the hooks' targets must outlive this.
  Reloader(Config& cfg, const Clock& clock, Hooks hooks) : cfg_(cfg), clock_(clock), hooks_(std::move(hooks)) {}
  Reloader(const Reloader&) = delete;
  Reloader& operator=(const Reloader&) = delete;

  // `wsup reload` (c) or SIGHUP (null c), with `sets` (`wsup reload
  // --set`) after the node's own overrides.
  void Reload(const std::shared_ptr<JsonConn>& c, const std::string& why, const std::vector<std::string>& sets = {});

 private:
  void ApplyAtOnce(const Config& next, const ReloadPlan& plan);

  Config& cfg_;
  const Clock& clock_;
  Hooks hooks_;
};

}  // namespace wsup
