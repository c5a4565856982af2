#include "supervisor/launcher.h"

namespace wsup {
namespace {

class Real final : public Launcher {
 public:
  Result<pid_t> Spawn(const ChildSpec& spec) override { return SpawnChild(spec); }
  Result<ProcessWatch*> WatchExit(uv_loop_t* loop, pid_t pid, std::function<void(const ExitInfo&)> cb) override {
    auto w = ExitWatch::Start(loop, pid, std::move(cb));
    if (!w.ok()) return w.error();
    return static_cast<ProcessWatch*>(*w);
  }
  Status Signal(pid_t pgid, int sig) override { return SignalGroup(pgid, sig); }
  bool Alive(pid_t pid) override { return ProcessAlive(pid); }
  Result<uint64_t> StartTime(pid_t pid) override { return ProcessStartTime(pid); }
  Result<char> RunState(pid_t pid) override { return ProcessRunState(pid); }
  Result<bool> ListensOn(pid_t pgid, int port) override { return GroupListensOn(pgid, port); }
};

}  // namespace

Launcher& RealLauncher() {
  static Real real;
  return real;
}

}  // namespace wsup
