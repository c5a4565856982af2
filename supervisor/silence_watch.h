// SilenceWatch: what the node does with the front's `silent` report, an
// engine with requests waiting on it that has sent no byte for a while
// (front/proxy.h). The rules are silence_check.h's JudgeSilence; this owner
// carries them out: it reads the active engine's process state, trips a
// stopped one at once, and asks a running one one probe now, tripping it
// only if that probe fails. At most one such probe runs at a time for one
// engine process, and a probe's answer is acted on only if the engine it
// asked is still the same process and still active.
//
// It owns that one probe. The engines, the front's routes, /proc and the
// counters are reached through Hooks, so every path is tested on fakes
// (tests/supervisor_core/silence_watch_test.cc).
//
// Threads: the loop thread only.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "common/one_shots.h"
#include "common/status.h"
#include "common/timer.h"
#include "probes/probe.h"
#include "supervisor/messages.h"

namespace wsup {

class SilenceWatch {
 public:
  // The active engine as the watch sees it.
  struct Engine {
    std::string slot;
    pid_t pid = 0;
    // Its address as the front names it in its reports ("host:port").
    std::string backend;
  };
  struct Hooks {
    std::function<bool()> stopping;
    // The active engine, if one serves.
    std::function<std::optional<Engine>()> active;
    // The backend the front routes the traffic to now ("" for none).
    std::function<std::string()> routed;
    // A proven standby could take the traffic.
    std::function<bool()> standby_ready;
    // /proc's state letter of pid (launcher.h's RunState).
    std::function<Result<char>(pid_t pid)> run_state;
    // The front saw slot's last byte at ms (wall clock).
    std::function<void(const std::string& slot, int64_t ms)> last_byte;
    // One probe of the active engine, made now.
    std::function<std::unique_ptr<Probe>(const Engine& e)> make_probe;
    // Fail slot now (its table's probe trip).
    std::function<void(const std::string& slot, const std::string& why)> trip;
    // What was done with a report: "ignored", "dismissed" or "tripped".
    std::function<void(const char* outcome)> counted;
  };

  SilenceWatch(TimerSource& timers, Hooks hooks) : later_(timers), hooks_(std::move(hooks)) {}
  SilenceWatch(const SilenceWatch&) = delete;
  SilenceWatch& operator=(const SilenceWatch&) = delete;

  // The front's `silent` report.
  void OnSilent(const FrontMessage& m);
  // A probe is in flight for this process.
  bool probing() const { return probe_ != nullptr; }

 private:
  void Trip(const std::string& slot, const std::string& why);

  // Frees a finished probe off its own callback.
  OneShots later_;
  Hooks hooks_;
  std::unique_ptr<Probe> probe_;
  pid_t probe_pid_ = 0;
};

}  // namespace wsup
