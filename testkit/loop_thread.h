// LoopThread: a libuv loop on a thread of its own, for in-process tests of
// servers that live on a loop (the control socket, the admin listener)
// while the test talks to them through blocking clients. Do() runs a
// function on the loop's thread and waits for it: handles are made, used
// and closed there only (one owner per handle).
#pragma once

#include <uv.h>

#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace wsup::test {

class LoopThread {
 public:
  LoopThread();
  // Closes its wake-up handle and joins the thread once the loop has no
  // handle left: close what was made on it (with Do()) first.
  ~LoopThread();
  LoopThread(const LoopThread&) = delete;
  LoopThread& operator=(const LoopThread&) = delete;

  uv_loop_t* loop() { return &loop_; }
  // Runs fn on the loop's thread and returns once it has run.
  void Do(std::function<void()> fn);

 private:
  void Drain();

  uv_loop_t loop_{};
  uv_async_t async_{};
  std::mutex mu_;
  std::deque<std::function<void()>> tasks_;
  std::thread thread_;
};

}  // namespace wsup::test
