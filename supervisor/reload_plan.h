// ReloadPlan: what a config file read again (`wsup reload`, SIGHUP) would
// change on a running node, key by key, and how each change can be made:
//
//   roll     engine.command, engine.env: a new engine version, rolled
//            through the standby first (supervisor/rollout_fsm.h);
//   at once  [probe], the restart policy, rollout watch window and log
//            level of [supervisor],
//            engine.ready_timeout_ms and stop_timeout_ms, and the front's
//            queue_timeout_ms and max_queued: nothing is restarted;
//   cold     everything else (the model, the parallel layout, the weight
//            cache, the KV pool, ports, sockets, directories): it takes a
//            cold start, so a reload that changes one is refused whole,
//            with one "FILE:LINE:COL: KEY: ..." error per such key, and the
//            node keeps running as it is.
//
// The version is compared with what each engine slot really runs, not only
// with the running config: a slot adopted after a restart, or left by a
// roll the supervisor did not see end, may run another version, and a
// reload then rolls even though the file did not change.
//
// Pure functions over two Configs; tests call them directly.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "supervisor/config.h"
#include "supervisor/engine_version.h"

namespace wsup {

enum class ReloadEffect { kRoll, kAtOnce, kCold };
const char* ReloadEffectName(ReloadEffect e);  // "roll" | "at_once" | "cold"

// How a change of `key` ("section.key") is applied.
ReloadEffect EffectOf(const std::string& key);

struct ReloadChange {
  std::string key;
  ReloadEffect effect = ReloadEffect::kCold;
  std::string before, after;  // the values as text (for logs and the ledger; engine.env hashed)
  std::string where;          // FILE:LINE:COL in the new file
  std::string note;           // why it changes when the config did not ("engine b runs another version")
};

struct ReloadPlan {
  std::vector<ReloadChange> changes;  // in schema order
  // One per cold change: "FILE:LINE:COL: KEY: ...; the fix".
  std::vector<Error> refused;
  bool roll() const;
  bool at_once() const;
};

// What an engine slot runs now (a live process's version).
struct SlotVersion {
  std::string slot;
  EngineVersion version;
};

// `slots`: what the live slots run; one that runs another version than
// next's rolls even when `running` and `next` agree on it.
ReloadPlan PlanReload(const Config& running, const Config& next, const std::vector<SlotVersion>& slots = {});

// Every key's value as text, in schema order (what PlanReload compares).
std::vector<std::pair<std::string, std::string>> ConfigValues(const Config& c);

// An engine command and environment, as one line for the ledger, status
// and logs: `["prog", "--flag", ...] env {"NAME":"sha256:0123456789abcdef"}`.
// engine.env's values are secrets (tokens, passwords): only their names and
// a hash of each value are shown, enough to tell whether one changed.
std::string EngineVersionText(const Config& c);

// "sha256:" and the first 16 hex digits of the value's SHA-256.
std::string EnvValueHash(const std::string& value);

// c.engine's command and env.
EngineVersion VersionOf(const Config& c);
// c with engine.command and engine.env set to v.
Config WithVersion(Config c, const EngineVersion& v);

// `wsup reload --set`: the overrides a node was started with, then these,
// one per key (a later one replaces an earlier one of the same key).
std::vector<std::string> MergeOverrides(const std::vector<std::string>& base, const std::vector<std::string>& more);

}  // namespace wsup
