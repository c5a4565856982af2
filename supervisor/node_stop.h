// NodeStop: the node's stop, from its first cause to the loop's end.
//
//   Begin(why, code)  the first cause wins: its exit code is the node's, and
//                     the children are told to stop once (Hooks::stop_children)
//   ChildExited()     a child is gone; when none is left (Hooks::any_process)
//                     the stop finishes
//   finish            state.json is removed (a clean stop leaves nothing to
//                     adopt), the `wsup stop` callers are answered, and, a
//                     moment later (their replies flushed), every handle is
//                     closed (Hooks::close) so that the loop ends
//
// A finish happens once, however many children report their exit after the
// last one is gone. A caller that asks to be told after the finish is told
// at once.
//
// The children, the state file and the handles are reached through Hooks,
// so every rule is tested on fakes (tests/supervisor_core/node_stop_test.cc).
//
// Threads: the loop thread only.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "common/one_shots.h"
#include "common/timer.h"

namespace wsup {

class NodeStop {
 public:
  struct Hooks {
    // Stop the rollout, the engines, the front and the holders; tell systemd.
    std::function<void(const std::string& why)> stop_children;
    // Whether any child process of the node still runs.
    std::function<bool()> any_process;
    // Remove state.json.
    std::function<void()> remove_state;
    // Close every handle the node holds: the loop ends after it.
    std::function<void()> close;
  };

  // The pause between the callers' answers and the handles' close, for
  // their replies to leave the socket.
  static constexpr int64_t kFlushMs = 20;

  NodeStop(TimerSource& timers, Hooks hooks);

  void Begin(const std::string& why, int exit_code);
  // A child process of the node has exited.
  void ChildExited();
  // Runs `answer` once the stop has finished (at once when it has).
  void OnStopped(std::function<void()> answer);

  bool stopping() const { return stopping_; }
  // Every child gone and the close begun.
  bool finishing() const { return finishing_; }
  // The handles are closed: the loop has nothing left.
  bool finished() const { return finished_; }
  int exit_code() const { return exit_code_; }

 private:
  void MaybeFinish();

  Hooks hooks_;
  OneShots later_;
  bool stopping_ = false;
  bool finishing_ = false;
  bool finished_ = false;
  int exit_code_ = 0;
  std::vector<std::function<void()>> waiters_;
};

}  // namespace wsup
