// Front: the wsup-front process as a library: one libuv loop running the
// client-facing HTTP server (http/server.h), the Proxy behind it, and the
// control socket through which the supervisor steers it.
//
// The front is deliberately independent of the supervisor: it starts with
// initial routes from its flags (so a restarted front serves at once), it
// keeps serving while no supervisor is connected, and it can take over a
// listening socket the supervisor keeps (--listen-fd), so a crashed front
// is replaced without refusing a connection (new ones wait in the backlog).
//
// Control messages (JSON objects on the socket of control_socket.h):
//   {"type":"set_routes","active":"H:P"|null,"standby":"H:P"|null,"epoch":N}
//     -> {"ok":true,"epoch":N}
//   {"type":"status"} -> {"ok":true,"listen":..,"active":..,"standby":..,
//     "epoch":..,"inflight":{addr:n},"queued":n,"down":{..},"counters":{..},
//     "backends":{addr:{..,"failed_at_ms"?,"last_ok_ms"?}},"events":[..]}
//   {"type":"engine_dead","engine":"H:P"[,"why":"..."]} -> {"ok":true,"cut":n}
//     the engine died (its supervisor saw it before its sockets closed):
//     every loop fails what it has in flight there as if the connection
//     had been reset (retried, or a stream resumed, on the routed active)
//     and marks it down;
//   anything else -> {"ok":false,"error":"..."}
//   {"type":"set_limits","queue_timeout_ms":N,"max_queued":N
//    [,"hedge_after_ms":N,"hedge_percent":N,"hedge_burst":N]} -> {"ok":true}
// Events pushed to every control client: {"type":"event","kind":"switched",
// "from","to","reason","epoch","at_ms"}, {"type":"event","kind":"first_ok",
// "backend","epoch","at_ms"[,"hedged":true]} and {"type":"event","kind":"silent","backend",
// "silent","inflight","after_ms","last_byte_ms","epoch","at_ms"} (most
// requests on the active engine have had no byte for after_ms; last_byte_ms
// is when it last sent one, 0 if never). The last 64 of them are also kept and returned
// by status as "events", oldest first: a supervisor that was not connected
// when the front switched by itself learns what happened and when.
//
// Loops (--loops N, 0: one per CPU the process may run on): the main loop
// owns the listening socket (front/acceptor.h), the control socket and the
// signals; N worker loops (front/worker.h), each on its own thread, serve
// the connections dealt to them in turn, each with its own Proxy. The main
// loop keeps the one view of the routes, epoch and events: a route change
// or a limit reaches every loop before it is acknowledged; a loop's own
// switch (the active engine failed under it) is accepted once, reported
// once and followed by the other loops at once; first_ok is reported once
// per route change; status sums the loops (front/status_merge.h). Engine
// silence and the hedge budget are judged across loops (front/shared.h).
// Control replies go out in the order the messages came.
//
// Ownership: Front owns the acceptor, the workers, the control server and
// the main mailbox. Stop() stops accepting, lets every loop drain (bounded)
// and close, joins them, then closes the rest; `done` runs on the main loop
// when the last handle is closed, after which the loop ends clean.
// Threads: the main loop's thread only; workers post back through its mailbox.
#pragma once

#include <uv.h>

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/close_latch.h"
#include "common/status.h"
#include "front/acceptor.h"
#include "front/address.h"
#include "http/mailbox.h"
#include "front/proxy.h"
#include "front/shared.h"
#include "front/worker.h"
#include "http/server.h"
#include "wire/json_socket.h"

namespace wsup::front {

struct FrontOptions {
  std::string listen;      // "HOST:PORT"; used when listen_fd < 0
  int listen_fd = -1;      // a bound, listening TCP socket to adopt
  std::string control;     // Unix socket path; empty: no control socket
  std::string active;      // initial routes, "HOST:PORT" or empty
  std::string standby;
  int64_t epoch = 0;       // the epoch of the initial routes
  int ready_fd = -1;       // gets "listening on HOST:PORT\n" once serving
  int64_t drain_timeout_ms = 5'000;
  int loops = 0;           // worker loops; 0: one per CPU this process may run on
  http::ServerOptions server;
  ProxyOptions proxy;
};

// The most worker loops a front runs (--loops and the CPU count are capped here).
inline constexpr int kMaxLoops = 64;
// --loops as given, or (0) the number of CPUs this process may run on, within 1..kMaxLoops.
int ResolveLoops(int loops);

class Front {
 public:
  using Reply = std::function<void(nlohmann::json)>;

  Front(uv_loop_t* loop, FrontOptions options);
  ~Front();
  Front(const Front&) = delete;
  Front& operator=(const Front&) = delete;

  // Listens (or adopts the socket), starts the worker loops with the
  // initial routes, opens the control socket and reports readiness.
  Status Start();
  // Stops taking new connections, lets calls in flight finish for up to
  // drain_timeout_ms, then closes everything. Safe to call twice.
  void Stop(std::function<void()> done = {});

  // Answers one control message; `reply` runs on the main loop, at once or
  // once every loop has answered.
  void HandleControl(const nlohmann::json& msg, const Reply& reply);

  int port() const { return acceptor_.port(); }
  const std::string& listen_address() const { return listen_address_; }
  int loop_count() const { return static_cast<int>(workers_.size()); }

 private:
  struct Gather;
  // Runs `ask` on every worker loop; `done` gets their answers (null for a
  // loop already gone) on the main loop.
  void AskWorkers(const std::function<nlohmann::json(Worker&)>& ask, std::function<void(std::vector<nlohmann::json>)> done);
  void OnSocket(int fd);
  void OnWorkerEvent(int worker, const nlohmann::json& event);
  void Emit(const nlohmann::json& event);
  void SetRoutes(const nlohmann::json& msg, const Reply& reply);
  void SetLimits(const nlohmann::json& msg, const Reply& reply);
  void EngineDead(const nlohmann::json& msg, const Reply& reply);
  void OnControlMessage(const std::shared_ptr<JsonConn>& c, const nlohmann::json& msg);
  void FlushReplies(const std::shared_ptr<JsonConn>& c);
  void OnWorkerStopped();

  uv_loop_t* loop_;
  FrontOptions options_;
  FrontShared shared_;
  http::Mailbox mailbox_;  // workers post their events and answers here
  Acceptor acceptor_;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::unique_ptr<JsonServer> control_;
  size_t next_worker_ = 0;
  size_t stopped_workers_ = 0;
  int open_parts_ = 0;
  bool started_ = false;
  std::string listen_address_;
  // Done once the acceptor, the control server and the mailbox are closed.
  CloseLatch close_{[this] { return open_parts_ == 0; }};

  // The one view of the routes (the loops follow it).
  std::optional<HostPort> active_;
  std::optional<HostPort> standby_;
  int64_t epoch_ = 0;
  std::string first_ok_pending_;  // the engine whose first good answer is still to be reported
  int64_t first_ok_since_ms_ = 0;  // wall time it became the active engine
  uint64_t switched_self_ = 0;
  HedgeLimits hedge_;
  std::deque<nlohmann::json> event_log_;
  // Replies per control client, sent in the order the messages came.
  std::map<std::shared_ptr<JsonConn>, std::deque<std::shared_ptr<std::optional<nlohmann::json>>>> replies_;
};

// The whole program: flags, logging, signals, the loop. Returns the exit code.
int FrontMain(int argc, char** argv);

}  // namespace wsup::front
