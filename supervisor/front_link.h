// FrontLink: the node's front (wsup-front) as one owner. It alone holds the
// front's process (pid, exit watch, restart throttle), its listening socket
// (kept across front restarts so that connections wait in the backlog), its
// control link, and the routes and epoch the front was told. Everything
// else in the supervisor goes through the methods below.
//
// Its life is the front rows of the child table (child_fsm.h): every event
// goes through Fire(), which looks the row up, logs it with its cause and
// carries out its action. What it cannot decide itself (whether the node
// is stopping, what the routes should be now, what a message from the
// front means to the engines) it asks or tells through Hooks, given once at
// construction; the launcher and the timers come in the same way, so tests
// drive it on fake processes and a fake clock (tests/supervisor_core/
// front_link_test.cc).
//
// Threads: the loop thread only.
#pragma once

#include <uv.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "common/clock.h"
#include "common/status.h"
#include "common/timer.h"
#include "common/unique_fd.h"
#include "supervisor/child_fsm.h"
#include "supervisor/config.h"
#include "supervisor/launcher.h"
#include "supervisor/messages.h"
#include "supervisor/metrics.h"
#include "supervisor/restart_throttle.h"
#include "supervisor/runtime_state.h"
#include "wire/json_socket.h"

namespace wsup {

// "host:port", with brackets for an IPv6 literal.
std::string HostPortString(const std::string& host, int port);

class FrontLink {
 public:
  // Where the front sends new traffic, and where it fails over by itself
  // ("" for none): "host:port" of an engine.
  struct Routes {
    std::string active, standby;
    bool operator==(const Routes& o) const { return active == o.active && standby == o.standby; }
  };

  struct Hooks {
    // The node is stopping: nothing is started, restarted or linked.
    std::function<bool()> stopping;
    // The front cannot be started at all (its socket, its binary): the
    // node stops with the configuration's exit code.
    std::function<void(const std::string& why)> fatal;
    // A process or the routes changed: state.json is written again.
    std::function<void()> save_state;
    // The front is given up on: the node is degraded for this reason.
    std::function<void(const std::string& why)> down;
    // It began to crash-loop (the status line says so).
    std::function<void()> crash_looping;
    // The routes the front should have now (pushed once its link is up).
    std::function<Routes()> routes;
    // A message from the front, read and checked (messages.h).
    std::function<void(const FrontMessage&)> message;
    // Its process exited and the table has moved.
    std::function<void()> exited;
    // Hands its listening socket to the service manager's fd store.
    std::function<void(int fd)> store_listen_fd;
  };

  // cfg is read at each use (a reload changes the front's limits in place)
  // and must outlive this.
  FrontLink(uv_loop_t* loop, Launcher& launcher, TimerSource& timers, const Clock& clock, const Config& cfg,
            std::string bin_dir, Hooks hooks);
  // Stops watching the process and closes the link; the process runs on.
  ~FrontLink();
  FrontLink(const FrontLink&) = delete;
  FrontLink& operator=(const FrontLink&) = delete;

  // Binds front.listen now (preflight): a later start serves on it.
  Status Bind();
  // Starts a front (first start or restart) on the kept socket.
  void Start();
  // A restarted supervisor found the front of its predecessor running.
  void Adopt(const RuntimeState::Front& prev, int64_t epoch);
  // The node is stopping: no restart; the process is asked to stop.
  void Stop(const std::string& why);
  // Forgets the process without stopping it (the supervisor goes away).
  void Detach(const std::string& why);
  // Closes the control link (the node's last handles).
  void CloseLink(const std::string& why);

  // New routes: a new epoch when they differ from the last ones (state.json
  // written), sent when the link is up (else when it comes up).
  void SetRoutes(const Routes& routes);
  // The engine at `address` died: the front fails over what it has in flight
  // there now (front/front.h, engine_dead).
  void CutEngine(const std::string& address, const std::string& why);
  // The queue and hedge limits of cfg (a reload changed them); a front
  // started later gets them on its command line.
  void PushLimits();
  void SetRestartPolicy(RestartPolicy policy) { throttle_.set_policy(std::move(policy)); }
  // The front's own status (its `status` answer, on a connection of its
  // own): done(nullptr) when there is no front, it does not answer, or the
  // link closes first.
  void AskStatus(const std::function<void(const nlohmann::json* reply)>& done);

  ChildState state() const { return state_; }
  pid_t pid() const { return pid_; }
  bool has_process() const { return pid_ > 0; }
  bool linked() const { return link_ != nullptr; }
  int port() const { return port_; }
  int64_t epoch() const { return epoch_; }
  const Routes& routes() const { return routes_; }
  bool crash_looping() const { return throttle_.crash_looping(); }
  uint64_t restarts() const { return throttle_.total(); }
  // Its entry in state.json; none without a process.
  std::optional<RuntimeState::Front> Record() const;
  // `front` of `wsup status`.
  nlohmann::json StatusJson() const;
  // Its counters and gauges into the node's metrics (before they render).
  // The front's own counters (hedges, resumes, retries: its `status`) are
  // asked every kCountersPollMs on a connection of their own, at most one
  // ask in flight, and summed over every front process this supervisor has
  // seen (a restarted front counts from 0 again; the sum never goes down).
  void Report(Metrics& m) const;
  static constexpr int64_t kCountersPollMs = 1000;

 private:
  void Fire(ChildEvent event, const std::string& cause, int exit_code = -1);
  void Connect();
  void OnMessage(const nlohmann::json& m);
  void OnExit(const ExitInfo& info);
  void ScheduleRestart(int exit_code, const std::string& how);
  void Send(const nlohmann::json& m);
  void PollCounters();
  void TakeCounters(pid_t pid, const nlohmann::json& counters);
  void TakeGauges(const nlohmann::json& reply);
  bool Stopping() const { return hooks_.stopping && hooks_.stopping(); }
  std::string LogPath() const;

  uv_loop_t* loop_;
  Launcher& launcher_;
  const Clock& clock_;
  const Config& cfg_;
  std::string bin_dir_;
  Hooks hooks_;

  ChildState state_ = ChildState::kIdle;
  UniqueFd listen_;  // kept across front restarts: connections wait in the backlog
  int port_ = 0;
  pid_t pid_ = 0;
  uint64_t start_time_ = 0;
  ProcessWatch* watch_ = nullptr;
  std::string control_path_;
  std::shared_ptr<JsonConn> link_;
  std::unique_ptr<Timer> retry_;          // control link retries
  std::unique_ptr<Timer> restart_timer_;  // backoff
  RestartThrottle throttle_;
  std::string last_exit_;  // how the last one ended
  std::string down_reason_;
  int64_t epoch_ = 0;
  Routes routes_;
  uint64_t bad_messages_ = 0;
  bool detached_ = false;  // Detach(): the link's close is not a lost link
  // The front's counters (PollCounters): the sums of the fronts that are
  // gone, the latest of the one that runs (counters_pid_), and the ask in
  // flight since poll_since_ms_ (0: none). alive_ tells an answer that
  // comes after this owner is gone to drop itself.
  std::unique_ptr<Timer> poll_;
  int64_t poll_since_ms_ = 0;
  pid_t counters_pid_ = 0;
  std::map<std::string, uint64_t> counters_gone_, counters_now_;
  uint64_t queued_ = 0, inflight_ = 0;  // the front's queue and requests in flight, as last told
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

// The front's restart policy, from the one [supervisor] section.
RestartPolicy FrontRestartPolicy(const Config& cfg);

}  // namespace wsup
