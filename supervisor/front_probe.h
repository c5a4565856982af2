// FrontProbe: the semantic probe sent through the front, as a client sends a
// request. It proves what no probe of an engine alone can: that the route the
// front holds now reaches an engine that answers correctly. The node asks it
// after a promotion (before it tells systemd it serves) and after a failover
// (the swap's "first correct answer").
//
// A front just told new routes, or an engine just promoted, may refuse for a
// moment, so a failed attempt is made again 10 ms later until one passes,
// the attempts are spent, or the node stops. The probe's settings are read
// at each run (a `wsup reload` may have changed them).
//
// It owns its retry timers; its answers are dropped once it is destroyed.
// The front's address, the HTTP client and the settings are reached through
// Hooks, so it is tested on fakes (tests/supervisor_core/front_probe_test.cc).
//
// Threads: the loop thread only.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "common/clock.h"
#include "common/one_shots.h"
#include "common/timer.h"
#include "http/client.h"
#include "probes/probe.h"

namespace wsup {

class FrontProbe {
 public:
  struct Hooks {
    std::function<bool()> stopping;
    // The probe's settings now.
    std::function<SemanticProbeSpec()> spec;
    // How long the front may queue a request when no engine is routed.
    std::function<int64_t()> queue_ms;
    // Sends req to the front's listener.
    std::function<void(http::ClientRequest req, http::ResponseCallback done)> send;
  };
  // ok, and the wall-clock time of the passing answer (0 when !ok).
  using Done = std::function<void(bool ok, int64_t at_ms)>;

  // The pause between two attempts.
  static constexpr int64_t kRetryMs = 10;
  // A probe timeout below this is raised to it: the path through the front
  // adds a hop and a queue.
  static constexpr int64_t kMinTimeoutMs = 1000;

  FrontProbe(TimerSource& timers, const Clock& clock, Hooks hooks)
      : later_(timers), clock_(clock), hooks_(std::move(hooks)) {}
  FrontProbe(const FrontProbe&) = delete;
  FrontProbe& operator=(const FrontProbe&) = delete;

  // Probes until one attempt passes or `attempts` have failed; done runs
  // once, either way.
  void Run(Done done, int attempts);

 private:
  void Attempt(const std::shared_ptr<Done>& done, int attempts_left);

  OneShots later_;
  const Clock& clock_;
  Hooks hooks_;
  // Answers that arrive after this owner is gone find it expired.
  std::shared_ptr<int> alive_ = std::make_shared<int>(0);
};

}  // namespace wsup
