// ControlSurface: the node's two doors for its operators, as one owner.
//
//   - The control socket (supervisor.control_socket, 0600, this user only),
//     which the `wsup` CLI talks to: status, failover drills, reload and
//     stop. Every request is read by ParseControlRequest (messages.h), typed
//     and checked field by field; one that is not a request gets an error
//     reply naming the field, is counted (wsup_bad_messages_total)
//     and changes nothing. No message can stop the supervisor but `stop`.
//   - The admin HTTP listener (admin.listen), read-only: GET /metrics (the
//     Prometheus exposition) and GET /status (what `wsup status` shows, as
//     JSON). Anything but a read is refused with 405, any other path 404.
//
// What a request does is the node's: it is passed on through Hooks, given
// once at construction, so tests drive the surface on a loop of their own
// with fake hooks (tests/supervisor_core/control_surface_test.cc).
//
// Threads: the loop thread only.
#pragma once

#include <uv.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "http/server.h"
#include "supervisor/metrics.h"
#include "wire/json_socket.h"

namespace wsup {

class ControlSurface {
 public:
  using Conn = std::shared_ptr<JsonConn>;
  struct Hooks {
    // `wsup status` (and the admin listener's /status).
    std::function<nlohmann::json()> status;
    // `wsup failover`: a planned swap, or a kill drill (kill). The hook
    // answers the caller.
    std::function<void(const Conn&, bool kill)> drill;
    // `wsup reload [--set k=v ...]`. The hook answers the caller.
    std::function<void(const Conn&, const std::vector<std::string>& sets)> reload;
    // `wsup stop`: the caller is answered once the node has stopped.
    std::function<void(const Conn&)> stop;
    // The metrics exposition for /metrics, gathered now.
    std::function<std::string()> metrics;
  };

  ControlSurface(uv_loop_t* loop, Metrics& metrics, Hooks hooks);
  ~ControlSurface();
  ControlSurface(const ControlSurface&) = delete;
  ControlSurface& operator=(const ControlSurface&) = delete;

  // Listens on the control socket at `path`.
  Status ListenControl(const std::string& path);
  // Listens for the admin listener on host:port (0: the kernel picks one).
  Status ListenAdmin(const std::string& host, int port);
  // The admin listener's port; 0 before ListenAdmin().
  int admin_port() const;

  // Closes both listeners and their connections (the node stops); `done`
  // runs on the loop once the admin listener's handles are closed. Safe to
  // call twice.
  void Close(std::function<void()> done = {});
  // Frees both listeners; after Close() and its callbacks.
  void Release();

 private:
  void OnControl(const Conn& c, const nlohmann::json& msg);
  void OnAdmin(const std::shared_ptr<http::ResponseWriter>& w);

  uv_loop_t* loop_;
  Metrics& metrics_;
  Hooks hooks_;
  std::unique_ptr<JsonServer> control_;
  std::unique_ptr<http::HttpServer> admin_;
};

}  // namespace wsup
