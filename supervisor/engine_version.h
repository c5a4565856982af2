// EngineVersion: what an engine process was started with, engine.command
// (the template, before its placeholders are filled) and engine.env. Two
// engines run the same version when both are equal, word for word and value
// for value; a rollout moves the node's slots from one version to another
// (supervisor/rollout_fsm.h), and `wsup reload` compares what each slot runs
// with the config read again (supervisor/reload_plan.h).
//
// The env values may be secrets: a version is compared and saved whole
// (state.json, mode 0600), but shown, logged and recorded only through
// EngineVersionText() (reload_plan.h).
//
// Thread-safety: a plain value.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace wsup {

struct EngineVersion {
  std::vector<std::string> command;
  std::vector<std::pair<std::string, std::string>> env;  // sorted by name, as Config::Engine::env
  bool operator==(const EngineVersion&) const = default;
};

}  // namespace wsup
