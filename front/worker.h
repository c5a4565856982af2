// Worker: one of the front's data-plane loops, on its own thread. It serves
// the client connections the acceptor hands it (front/acceptor.h) with its
// own HttpServer and Proxy (and so its own engine connections), and takes
// everything else (routes, limits, status questions, stop) as functions
// posted to its mailbox by the main loop.
//
// Why threads with private state rather than one shared proxy: a request
// touches its call, its client connection and its engine connection many
// times; kept on one loop, none of that needs a lock. What the loops must
// agree on (an engine's silence, the hedge budget) is in FrontShared.
//
// Lifecycle (the main loop drives it):
//   created (on the main thread: the loop, mailbox, server and proxy exist;
//     initial routes may be set) -> Start(): the thread runs the loop ->
//   Stop(): on its loop, lets calls finish for up to the drain time, closes
//     server and proxy, then posts `stopped` to the main loop ->
//   Exit() (main thread, after `stopped`): the mailbox closes, the loop ends,
//     the thread is joined.
// Ownership: the Worker owns its thread, loop and every handle on it.
// Threads: Post() and TakeConnection() from any thread; server() and
// proxy() on the worker's loop only (or before Start()).
#pragma once

#include <uv.h>

#include <functional>
#include <memory>
#include <thread>

#include "http/mailbox.h"
#include "front/proxy.h"
#include "front/shared.h"
#include "http/server.h"

namespace wsup::front {

class Worker {
 public:
  // Runs a function on the main loop; false once that loop no longer takes work.
  using PostToMain = std::function<bool(std::function<void()>)>;

  Worker(int index, const http::ServerOptions& server, const ProxyOptions& proxy, FrontShared* shared,
         Proxy::EventSink events);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  void Start();
  // Runs fn on this worker's loop; false (fn dropped) once it has exited.
  bool Post(std::function<void(Worker&)> fn);
  // Hands over an accepted client socket (closed here if the worker is gone).
  void TakeConnection(int fd);
  // On this worker's loop: drain for up to drain_ms, close, then post `stopped` with post_main.
  void Stop(int64_t drain_ms, PostToMain post_main, std::function<void()> stopped);
  // Main thread, after `stopped`: ends the loop and joins the thread.
  void Exit();

  int index() const { return index_; }
  http::HttpServer& server() { return *server_; }
  Proxy& proxy() { return *proxy_; }

 private:
  void CloseParts();
  void PartClosed();

  int index_;
  uv_loop_t loop_;
  std::unique_ptr<http::Mailbox> mailbox_;
  std::unique_ptr<Proxy> proxy_;
  std::unique_ptr<http::HttpServer> server_;
  uv_timer_t drain_timer_;
  int64_t drain_deadline_ms_ = 0;
  int open_parts_ = 0;
  bool stopping_ = false;
  PostToMain post_main_;
  std::function<void()> stopped_;
  std::thread thread_;
};

}  // namespace wsup::front
