// Signals: a process's signal watchers on its libuv loop, with one owner.
//
// Each wsup program stops on SIGTERM and SIGINT, and the supervisor also
// reloads on SIGHUP and ignores SIGPIPE through the loop. Each handler runs
// on the loop thread, where the program's state lives, never in signal
// context. Close() closes every watcher's handle; the handles free
// themselves in their close callbacks, so the owner may be destroyed right
// after Close() (its destructor closes what is still open).
//
//   Signals signals(loop);
//   signals.On(SIGTERM, [&](int) { server.Stop(...); });
//   ...
//   signals.Close();   // before the loop's last run
//
// Stop() only stops watching: a signal then takes its default action again
// (a second SIGTERM during a slow shutdown ends the process at once).
//
// Threads: the loop thread only.
#pragma once

#include <uv.h>

#include <functional>
#include <vector>

namespace wsup {

class Signals {
 public:
  using Handler = std::function<void(int signum)>;

  explicit Signals(uv_loop_t* loop) : loop_(loop) {}
  ~Signals() { Close(); }
  Signals(const Signals&) = delete;
  Signals& operator=(const Signals&) = delete;

  // Watches signum from now on. A signal watched twice runs both handlers.
  void On(int signum, Handler handler);
  // Stops watching every signal; the handles stay until Close().
  void Stop();
  // Stops and closes every watcher; `done` runs on the loop once all are
  // closed (at once when none is open).
  void Close(std::function<void()> done = nullptr);
  // Signals watched and not closed.
  size_t open() const { return watches_.size(); }

 private:
  struct Watch;
  uv_loop_t* loop_;
  std::vector<Watch*> watches_;  // each freed in its own close callback
};

}  // namespace wsup
