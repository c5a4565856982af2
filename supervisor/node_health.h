// NodeHealth: the node's own state as an operator sees it: "starting",
// "serving", "degraded" or "stopping" (`wsup status`, systemd's status line),
// why it is degraded, and systemd's READY=1, sent once, when an active
// engine is first proven through the front (or found serving by a restarted
// supervisor).
//
// A node that served once and has no active engine now is degraded until
// one is proven again; one that never served is starting. A degraded cause
// (a holder or the front given up on, a failure the node cannot mend) stays
// until the node restarts: the operator must see it.
//
// The engines and the front are read through Hooks::facts, and systemd is
// told through the other hooks, so every rule is tested on fakes
// (tests/supervisor_core/node_health_test.cc).
//
// Threads: the loop thread only.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace wsup {

class NodeHealth {
 public:
  struct Facts {
    bool stopping = false;
    std::string active;  // the active engine's slot, "" when none
    // Each slot and its table state, in order.
    std::vector<std::pair<std::string, std::string>> slots;
    bool front_crash_looping = false;
  };
  struct Hooks {
    std::function<Facts()> facts;
    // systemd's STATUS= line.
    std::function<void(const std::string& line)> status;
    // systemd's READY=1, with its status line.
    std::function<void(const std::string& line)> ready;
  };

  explicit NodeHealth(Hooks hooks) : hooks_(std::move(hooks)) {}

  std::string State() const;
  // "serving: active a, a active, b standby" and the like.
  std::string StatusLine() const;
  // Tells systemd the status line now.
  void Update();

  // Degraded for good (until the node restarts), logged and shown at once.
  void SetDegraded(const std::string& why);
  bool degraded() const { return degraded_; }
  const std::string& degraded_reason() const { return degraded_reason_; }

  // An active engine is proven: READY=1 with `how`, the first time only.
  void Serving(const std::string& how);
  bool served() const { return served_; }

 private:
  std::string StateOf(const Facts& f) const;

  Hooks hooks_;
  bool served_ = false;
  bool degraded_ = false;
  std::string degraded_reason_;
};

}  // namespace wsup
