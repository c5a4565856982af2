// NodeHealth (node_health.h): the node's own state and systemd's view of it.
#include "supervisor/node_health.h"

#include "common/log.h"

namespace wsup {

std::string NodeHealth::State() const { return StateOf(hooks_.facts()); }

std::string NodeHealth::StateOf(const Facts& f) const {
  if (f.stopping) return "stopping";
  if (degraded_) return "degraded";
  if (!f.active.empty()) return "serving";
  // Served before and has no active engine now: degraded until one is proven.
  return served_ ? "degraded" : "starting";
}

std::string NodeHealth::StatusLine() const {
  const Facts f = hooks_.facts();
  std::string line = StateOf(f);
  line += f.active.empty() ? ": no active engine" : ": active " + f.active;
  for (const auto& [slot, state] : f.slots) line += ", " + slot + " " + state;
  if (f.front_crash_looping) line += ", front crash-looping";
  if (degraded_) line += " (" + degraded_reason_ + ")";
  return line;
}

void NodeHealth::Update() { hooks_.status(StatusLine()); }

void NodeHealth::SetDegraded(const std::string& why) {
  degraded_ = true;
  degraded_reason_ = why;
  spdlog::error("{}", why);
  Update();
}

void NodeHealth::Serving(const std::string& how) {
  if (served_) return;
  served_ = true;
  spdlog::info("{}", how);
  hooks_.ready(how);
}

}  // namespace wsup
