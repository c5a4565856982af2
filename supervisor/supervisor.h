// Supervisor: `wsup start`. One libuv loop that owns the node: the weight
// holders (one per rank, daemon mode) and a copy of their arena fds, the
// front (the data plane), and two engine slots, "a" and "b", each driven by
// the EngineFsm table. It proves engines ready with semantic probes, fails
// over when the active one exits or trips its probes, re-arms a new standby,
// restarts holders from the fds it keeps, and records all of it in the
// ledger.
//
// Flows (docs/architecture.md, "Flows"): cold start, attach, crash of the
// active engine, hang of the active engine, crash of a holder, crash of the
// supervisor (adoption from <runtime_dir>/state.json), crash of the front
// (restarted on the listening socket the supervisor keeps).
//
// Blocking work stays off the loop: ledger writes go to the ledger's writer
// thread; the keeper's attach to a holder runs on libuv's thread pool.
//
// Ownership: the Supervisor owns the loop and every handle on it; Run()
// returns after everything is closed. Threads: Run() on the caller's thread,
// which becomes the loop thread; nothing else may call in.
#pragma once

#include <memory>
#include <string>

#include "common/clock.h"
#include "common/exit_codes.h"
#include "common/status.h"
#include "supervisor/config.h"

namespace wsup {

class Launcher;
class Node;
class TimerSource;

struct SupervisorOptions {
  std::string bin_dir;  // where wsup-holder and wsup-front are (beside the wsup binary)
  const Clock* clock = &RealClock();
  // Tests run the supervisor's logic against simulated processes and on
  // timers driven by their fake clock; null: the kernel's, the loop's.
  Launcher* launcher = nullptr;
  TimerSource* timers = nullptr;
};

class Supervisor {
 public:
  static Result<std::unique_ptr<Supervisor>> Create(Config config, SupervisorOptions options);
  ~Supervisor();
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  // Runs until stopped (SIGTERM, SIGINT, `wsup stop`); returns the exit code.
  int Run();

  // For tests that drive the loop themselves: runs what is ready now without
  // blocking; false once the supervisor has finished (then ExitCode()).
  bool Step();
  int ExitCode() const;
  // What `wsup status --json` shows. Loop thread only.
  std::string StatusJson() const;


 private:
  // The node's owners and their wiring (supervisor/node.h).
  explicit Supervisor(std::unique_ptr<Node> node);
  std::unique_ptr<Node> node_;
};

}  // namespace wsup
