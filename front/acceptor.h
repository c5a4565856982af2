// Acceptor: takes client connections off one listening socket on the main
// loop and hands each accepted socket to a worker loop (front/worker.h).
//
// Why one acceptor and not every loop listening: the listening socket is
// one socket the supervisor keeps across front restarts (--listen-fd), so
// connections wait in its backlog while no front runs. Loops that each
// polled it would all wake for every connection and the first awake would
// take a whole burst (an uneven split that lasts as long as keep-alive
// connections do). One acceptor deals connections out in turn; the cost is
// one hand-off per connection, not per request.
//
// Ownership: the Acceptor owns the listening fd (closed by Close()) and its
// poll and pause-timer handles. `done` runs once both are closed.
// Threads: the main loop's thread only.
#pragma once

#include <uv.h>

#include <cstdint>
#include <functional>
#include <string>

#include "common/close_latch.h"
#include "common/status.h"

namespace wsup::front {

class Acceptor {
 public:
  using OnSocket = std::function<void(int fd)>;  // an accepted, non-blocking socket; the callee owns it

  Acceptor(uv_loop_t* loop, OnSocket on_socket);
  ~Acceptor();
  Acceptor(const Acceptor&) = delete;
  Acceptor& operator=(const Acceptor&) = delete;

  // Binds HOST:PORT (a numeric address; port 0: the kernel picks one) and listens.
  Status Listen(const std::string& host, int port, int backlog);
  // Accepts on a bound, listening socket someone else made. Takes ownership of fd.
  Status Adopt(int fd, int backlog);
  int port() const { return port_; }
  uint64_t accepted() const { return accepted_; }

  void Close(std::function<void()> done = {});

 private:
  Status Start(int backlog);
  static void OnPoll(uv_poll_t* p, int status, int events);
  void OnReadable();
  void Pause();
  uv_loop_t* loop_;
  OnSocket on_socket_;
  int fd_ = -1;
  int port_ = 0;
  uv_poll_t poll_;
  uv_timer_t pause_;
  bool started_ = false;
  int open_handles_ = 0;
  uint64_t accepted_ = 0;
  int64_t last_warning_ms_ = -1'000'000;
  // Done once both handles and the fd are closed.
  CloseLatch close_{[this] { return open_handles_ == 0 && fd_ < 0; }};
};

}  // namespace wsup::front
