// Notifier: the supervisor's messages to its service manager (sd_notify):
// READY=1 once the active engine has passed a semantic probe through the
// front, STATUS= lines, WATCHDOG=1 from the loop (so a stuck loop is
// restarted by systemd), STOPPING=1, and arena fds into the fd store
// (FDSTORE=1) so that they outlive a supervisor restart.
//
// Without a service manager (NOTIFY_SOCKET unset) every call is a no-op, and
// without libsystemd at build time too; Enabled() says which.
//
// Thread-safety: loop thread only.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace wsup {

class Notifier {
 public:
  Notifier();
  bool Enabled() const { return enabled_; }
  // Watchdog interval the manager asked for (WATCHDOG_USEC), 0 when none.
  int64_t WatchdogIntervalMs() const { return watchdog_ms_; }

  void Ready(const std::string& status);
  // RELOADING=1 with MONOTONIC_USEC (systemd's reload protocol); Ready()
  // ends the reload.
  void Reloading(const std::string& status);
  void Status(const std::string& status);
  void Watchdog();
  void Stopping();
  // Stores fds under a name (FDNAME=); the manager hands them back at start.
  wsup::Status StoreFds(const std::string& name, const std::vector<int>& fds);
  // Fds handed back by the manager at start (LISTEN_FDS), with their names.
  static std::vector<std::pair<std::string, int>> ReceivedFds();

 private:
  bool enabled_ = false;
  int64_t watchdog_ms_ = 0;
};

}  // namespace wsup
