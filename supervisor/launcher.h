// Launcher: everything the supervisor does to processes (start them, watch
// them exit, signal them, ask the kernel about them), behind one interface,
// so that the supervisor's logic (restart throttling, promotions, drains,
// adoption decisions) runs in tests against simulated processes on a fake
// clock, in milliseconds, beside the real-process node tests.
//
// RealLauncher() is process.h over the kernel. Loop thread only.
#pragma once

#include <sys/types.h>
#include <uv.h>

#include <functional>

#include "common/status.h"
#include "supervisor/process.h"

namespace wsup {

class Launcher {
 public:
  virtual ~Launcher() = default;
  // SpawnChild().
  virtual Result<pid_t> Spawn(const ChildSpec& spec) = 0;
  // ExitWatch::Start(): cb runs once on the loop thread when pid exits.
  virtual Result<ProcessWatch*> WatchExit(uv_loop_t* loop, pid_t pid, std::function<void(const ExitInfo&)> cb) = 0;
  // SignalGroup().
  virtual Status Signal(pid_t pgid, int sig) = 0;
  // ProcessAlive(), ProcessStartTime(), ProcessRunState(), GroupListensOn().
  virtual bool Alive(pid_t pid) = 0;
  virtual Result<uint64_t> StartTime(pid_t pid) = 0;
  virtual Result<char> RunState(pid_t pid) = 0;
  virtual Result<bool> ListensOn(pid_t pgid, int port) = 0;
};

// The kernel's processes. One shared, stateless instance.
Launcher& RealLauncher();

}  // namespace wsup
