// Mailbox: hands work to a libuv loop from any thread. Post() queues a
// function and wakes the loop (uv_async); the loop runs the queued
// functions in the order they were posted.
//
// The front's loops talk to each other only through mailboxes: the main
// loop posts route changes, limits, status requests and accepted sockets to
// its worker loops, and the workers post their events and answers back. The
// engine's scheduler and startup threads post their results to its loop.
//
// Ownership: the Mailbox owns its uv_async handle on `loop`. Close() (on the
// loop's thread) stops it; Post() after that returns false and drops the
// function, so the caller can undo what it meant to hand over (an accepted
// socket is closed). Destroy it only after `done` has run.
// Threads: Post() from any thread; everything else on the loop's thread
// (or before the loop runs).
#pragma once

#include <uv.h>

#include <functional>
#include <mutex>
#include <vector>

namespace wsup::http {

class Mailbox {
 public:
  explicit Mailbox(uv_loop_t* loop);
  ~Mailbox();
  Mailbox(const Mailbox&) = delete;
  Mailbox& operator=(const Mailbox&) = delete;

  // Queues fn for the loop; false (fn dropped) once the mailbox is closed.
  bool Post(std::function<void()> fn);
  // Stops taking work. Work posted before runs first, then `done` once the
  // handle is closed.
  void Close(std::function<void()> done = {});

 private:
  void Drain();

  uv_async_t async_;
  std::mutex mu_;
  std::vector<std::function<void()>> inbox_;  // guarded by mu_
  bool closed_ = false;                       // guarded by mu_
  bool handle_closed_ = false;
  std::function<void()> done_;
};

}  // namespace wsup::http
