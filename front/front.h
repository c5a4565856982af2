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
// Ownership: Front owns the server, the proxy, the control server and its
// signal handles. Stop() drains (bounded) and closes all of them; `done`
// runs when the last handle is closed, after which the loop ends clean.
// Threads: the loop thread only.
#pragma once

#include <uv.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "front/address.h"
#include "front/proxy.h"
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
  http::ServerOptions server;
  ProxyOptions proxy;
};

class Front {
 public:
  Front(uv_loop_t* loop, FrontOptions options);
  ~Front();
  Front(const Front&) = delete;
  Front& operator=(const Front&) = delete;

  // Listens (or adopts the socket), opens the control socket, applies the
  // initial routes and reports readiness.
  Status Start();
  // Stops taking new work, lets calls in flight finish for up to
  // drain_timeout_ms, then closes everything. Safe to call twice.
  void Stop(std::function<void()> done = {});

  // The answer to one control message (also used by tests).
  nlohmann::json HandleControl(const nlohmann::json& msg);

  int port() const { return server_ ? server_->port() : 0; }
  const std::string& listen_address() const { return listen_address_; }
  Proxy& proxy() { return *proxy_; }

 private:
  void CloseAll();
  void MaybeDone();

  uv_loop_t* loop_;
  FrontOptions options_;
  std::unique_ptr<Proxy> proxy_;
  std::unique_ptr<http::HttpServer> server_;
  std::unique_ptr<JsonServer> control_;
  uv_timer_t drain_timer_;
  int open_parts_ = 0;
  bool started_ = false;
  bool stopping_ = false;
  int64_t drain_deadline_ms_ = 0;
  std::string listen_address_;
  std::function<void()> done_;
};

// The whole program: flags, logging, signals, the loop. Returns the exit code.
int FrontMain(int argc, char** argv);

}  // namespace wsup::front
