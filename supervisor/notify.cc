#include "supervisor/notify.h"

#include <cstdlib>
#include <ctime>

#ifdef WSUP_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

namespace wsup {

Notifier::Notifier() {
#ifdef WSUP_HAVE_SYSTEMD
  const char* sock = std::getenv("NOTIFY_SOCKET");
  enabled_ = sock && *sock;
  uint64_t usec = 0;
  if (enabled_ && sd_watchdog_enabled(0, &usec) > 0) watchdog_ms_ = static_cast<int64_t>(usec / 1000);
#endif
}

void Notifier::Ready(const std::string& status) {
#ifdef WSUP_HAVE_SYSTEMD
  if (enabled_) sd_notifyf(0, "READY=1\nSTATUS=%s", status.c_str());
#endif
}

void Notifier::Reloading(const std::string& status) {
#ifdef WSUP_HAVE_SYSTEMD
  if (enabled_) {
    timespec ts{};
    ::clock_gettime(CLOCK_MONOTONIC, &ts);
    const unsigned long long usec =
        static_cast<unsigned long long>(ts.tv_sec) * 1000000ull + static_cast<unsigned long long>(ts.tv_nsec) / 1000ull;
    sd_notifyf(0, "RELOADING=1\nMONOTONIC_USEC=%llu\nSTATUS=%s", usec, status.c_str());
  }
#endif
}

void Notifier::Status(const std::string& status) {
#ifdef WSUP_HAVE_SYSTEMD
  if (enabled_) sd_notifyf(0, "STATUS=%s", status.c_str());
#endif
}

void Notifier::Watchdog() {
#ifdef WSUP_HAVE_SYSTEMD
  if (enabled_) sd_notify(0, "WATCHDOG=1");
#endif
}

void Notifier::Stopping() {
#ifdef WSUP_HAVE_SYSTEMD
  if (enabled_) sd_notify(0, "STOPPING=1");
#endif
}

wsup::Status Notifier::StoreFds(const std::string& name, const std::vector<int>& fds) {
#ifdef WSUP_HAVE_SYSTEMD
  if (!enabled_ || fds.empty()) return wsup::Status::Ok();
  std::string msg = "FDSTORE=1\nFDNAME=" + name;
  int rc = sd_pid_notify_with_fds(0, 0, msg.c_str(), fds.data(), static_cast<unsigned>(fds.size()));
  if (rc < 0) return ErrnoError("sd_notify FDSTORE for " + name + " (raise FileDescriptorStoreMax in the unit)", -rc);
#endif
  return wsup::Status::Ok();
}

std::vector<std::pair<std::string, int>> Notifier::ReceivedFds() {
  std::vector<std::pair<std::string, int>> out;
#ifdef WSUP_HAVE_SYSTEMD
  char** names = nullptr;
  int n = sd_listen_fds_with_names(1, &names);
  for (int i = 0; i < n; ++i) {
    out.emplace_back(names && names[i] ? names[i] : "", SD_LISTEN_FDS_START + i);
    if (names) free(names[i]);
  }
  free(names);
#endif
  return out;
}

}  // namespace wsup
