#include "testkit/failover_drill.h"

#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <sstream>
#include <thread>

namespace wsup::test {

using nlohmann::json;
using Steady = std::chrono::steady_clock;
using namespace std::chrono_literals;

namespace {

std::string Addr(int port) { return "127.0.0.1:" + std::to_string(port); }

void Log(bool verbose, const std::string& line) {
  if (verbose) std::fprintf(stderr, "%s\n", line.c_str());
}

// Kills an engine's process group (engines lead their own), or the process.
void KillEngine(pid_t pid) {
  if (::kill(-pid, SIGKILL) != 0) ::kill(pid, SIGKILL);
}

void StopEngine(pid_t pid) {
  if (::kill(-pid, SIGSTOP) != 0) ::kill(pid, SIGSTOP);
}

}  // namespace

// ---------------------------------------------------------------------------
// wsup

namespace {

// Polls `ready` (empty: ready; else why not) until it says ready or `limit`
// passes; the error names what was still missing.
Status WaitUntilReady(const std::string& target, std::chrono::milliseconds limit,
                      const std::function<Result<std::string>()>& ready) {
  auto deadline = Steady::now() + limit;
  std::string why = "no answer yet";
  for (;;) {
    auto r = ready();
    if (r.ok() && r->empty()) return Status::Ok();
    why = r.ok() ? *r : r.error().message();
    if (Steady::now() >= deadline) break;
    std::this_thread::sleep_for(5ms);
  }
  return Timeout(target + ": not ready for a drill within " + std::to_string(limit.count()) + " ms: " + why);
}

class WsupTarget final : public DrillTarget {
 public:
  explicit WsupTarget(WsupTargetOptions o) : o_(std::move(o)) {}
  std::string name() const override { return "wsup"; }

  Status WaitReady(std::chrono::milliseconds limit) override {
    return WaitUntilReady("wsup", limit, [this] { return Ready(); });
  }

  Status Crash(DrillRecord* d) override {
    auto st = SupStatus();
    if (!st.ok()) return st.status();
    json act = Engine(*st, "active");
    pid_t pid = act.value("pid", 0);
    if (pid <= 0) return Unavailable("wsup: no active engine to kill");
    std::string from = Addr(act.value("port", 0));
    front_.TakeEvents();
    d->t0_us = NowUs();
    KillEngine(pid);
    return WaitSwap(from, d);
  }

  Status Hang(DrillRecord* d) override {
    auto st = SupStatus();
    if (!st.ok()) return st.status();
    json act = Engine(*st, "active");
    pid_t pid = act.value("pid", 0);
    if (pid <= 0) return Unavailable("wsup: no active engine to stop");
    std::string from = Addr(act.value("port", 0));
    front_.TakeEvents();
    d->t0_us = NowUs();
    StopEngine(pid);
    Status swapped = WaitSwap(from, d);
    // The supervisor kills the engine it failed over from. Should it not
    // have (no swap), the engine is woken, so it is not left stopped.
    if (!swapped.ok() && ::kill(-pid, SIGCONT) != 0) ::kill(pid, SIGCONT);
    return swapped;
  }

  Status Planned(DrillRecord* d) override {
    // The supervisor refuses a drill while an earlier failover still waits
    // for its first answer through the front, or while the standby is being
    // re-armed (it can fail its probes and restart between our ready check
    // and the drill on a slow machine): wait until ready and ask again
    // (bounded).
    auto deadline = Steady::now() + 60s;
    for (;;) {
      auto st = SupStatus();
      if (!st.ok()) return st.status();
      std::string from = Addr(Engine(*st, "active").value("port", 0));
      front_.TakeEvents();
      Result<json> reply = Internal("no reply");
      std::atomic<bool> answered{false};
      d->t0_us = NowUs();
      std::thread caller([&] {
        ControlClient link;
        Status s = link.Connect(o_.supervisor_socket);
        reply = s.ok() ? link.Call({{"type", "failover"}, {"drill", true}, {"kill", false}}, std::chrono::seconds(60))
                       : Result<json>(s.error());
        answered = true;
      });
      Status swapped = WaitSwap(from, d, [&] { return answered.load() && !(reply.ok() && reply->value("ok", false)); });
      caller.join();
      if (!reply.ok()) return reply.error();
      if (!reply->value("ok", false)) {
        std::string why = reply->value("error", reply->dump());
        const bool transient =
            why.find("try again") != std::string::npos || why.find("not proven ready") != std::string::npos;
        if (Steady::now() < deadline && transient) {
          std::this_thread::sleep_for(20ms);
          WSUP_RETURN_IF_ERROR(WaitReady(60s));
          continue;
        }
        return Refused("wsup: the planned drill was refused: " + why);
      }
      std::ostringstream note;
      note << "supervisor: swap " << reply->value("swap_ms", -1) << " ms, first ok through the front "
           << reply->value("first_ok_ms", -1) << " ms";
      d->note = note.str();
      return swapped;
    }
  }

  Status Counters(int64_t* resumed, int64_t* retried) override {
    auto f = FrontStatus();
    if (!f.ok()) return f.status();
    *resumed = (*f)["counters"].value("resumed", 0);
    *retried = (*f)["counters"].value("retried", 0);
    return Status::Ok();
  }

 private:
  Result<json> SupStatus() {
    if (!sup_linked_) {
      WSUP_RETURN_IF_ERROR(sup_.Connect(o_.supervisor_socket));
      sup_linked_ = true;
    }
    return sup_.Call({{"type", "status"}});
  }
  Result<json> FrontStatus() {
    if (!front_linked_) {
      WSUP_RETURN_IF_ERROR(front_.Connect(o_.front_socket));
      front_linked_ = true;
    }
    return front_.Call({{"type", "status"}});
  }
  static json Engine(const json& st, const std::string& role) {
    for (const auto& e : st.value("engines", json::array())) {
      if (e.value("role", "") == role) return e;
    }
    return json::object();
  }

  // Empty when ready; otherwise what is missing.
  Result<std::string> Ready() {
    auto st = SupStatus();
    if (!st.ok()) return st.error();
    if (st->value("state", "") != "serving") return "node state " + st->value("state", "?");
    json act = Engine(*st, "active"), stby = Engine(*st, "standby");
    if (!act.value("semantic_ready", false)) return std::string("no proven active engine");
    if (!stby.value("semantic_ready", false)) return std::string("no proven standby engine");
    auto f = FrontStatus();
    if (!f.ok()) return f.error();
    std::string fa = (*f)["active"].is_string() ? (*f)["active"].get<std::string>() : "";
    std::string fs = (*f)["standby"].is_string() ? (*f)["standby"].get<std::string>() : "";
    if (fa != Addr(act.value("port", 0)) || fs != Addr(stby.value("port", 0))) {
      return "front routes " + fa + " / " + fs + " not yet the supervisor's";
    }
    return std::string();
  }

  // The swap: the front's own `switched` event, or its routes moving away
  // from `from` (set by the supervisor), whichever is seen first.
  Status WaitSwap(const std::string& from, DrillRecord* d, const std::function<bool()>& give_up = nullptr) {
    auto deadline = Steady::now() + 30s;
    while (Steady::now() < deadline) {
      if (give_up && give_up()) return Refused("wsup: no swap: the drill was refused");
      auto f = FrontStatus();
      int64_t seen = NowUs();
      for (const auto& e : front_.TakeEvents()) {
        if (e.value("kind", "") == "switched" && e.value("from", "") == from) {
          d->swap_us = std::max<int64_t>(d->t0_us, e.value("at_ms", int64_t{0}) * 1000);
          d->swap_source = "front switched by itself";
          return Status::Ok();
        }
      }
      if (f.ok() && (*f)["active"].is_string() && (*f)["active"].get<std::string>() != from) {
        d->swap_us = seen;
        d->swap_source = "route set by the supervisor";
        return Status::Ok();
      }
      std::this_thread::sleep_for(500us);
    }
    return Timeout("wsup: the front still routes to " + from + " 30 s after the drill");
  }

  WsupTargetOptions o_;
  ControlClient sup_, front_;
  bool sup_linked_ = false, front_linked_ = false;
};

// ---------------------------------------------------------------------------
// HAProxy

struct ServerStat {
  std::string status;  // UP, DOWN, DRAIN, MAINT, "UP 1/2", ...
  int64_t retries = 0;
  int64_t redispatches = 0;
};

class HaproxyTarget final : public DrillTarget {
 public:
  explicit HaproxyTarget(HaproxyTargetOptions o) : o_(std::move(o)) {}
  std::string name() const override { return "haproxy"; }

  Status WaitReady(std::chrono::milliseconds limit) override {
    return WaitUntilReady("haproxy", limit, [this] { return Ready(); });
  }

  Status Crash(DrillRecord* d) override {
    auto pid = EnginePid(o_.primary_port);
    if (!pid.ok()) return pid.status();
    d->t0_us = NowUs();
    KillEngine(*pid);
    if (WaitPrimaryDown(d)) return Status::Ok();
    return Timeout("haproxy: the primary is still UP 30 s after its engine was killed");
  }

  Status Hang(DrillRecord* d) override {
    auto pid = EnginePid(o_.primary_port);
    if (!pid.ok()) return pid.status();
    d->t0_us = NowUs();
    StopEngine(*pid);
    if (WaitPrimaryDown(d)) return Status::Ok();
    if (::kill(-*pid, SIGCONT) != 0) ::kill(*pid, SIGCONT);
    return Timeout("haproxy: the primary is still UP 30 s after its engine was stopped");
  }

  // HAProxy's own failover: its health checks mark the primary DOWN (or it
  // was put in MAINT or NOLB). Sets the drill's swap time; false after 30 s.
  bool WaitPrimaryDown(DrillRecord* d) {
    auto deadline = Steady::now() + 30s;
    while (Steady::now() < deadline) {
      auto s = Stats();
      int64_t seen = NowUs();
      if (s.ok()) {
        const std::string& st = (*s)[o_.primary].status;
        if (st.rfind("DOWN", 0) == 0 || st.rfind("MAINT", 0) == 0 || st.rfind("NOLB", 0) == 0) {
          d->swap_us = seen;
          d->swap_source = "primary " + st + " in the stats";
          return true;
        }
      }
      std::this_thread::sleep_for(500us);
    }
    return false;
  }

  Status Planned(DrillRecord* d) override {
    d->t0_us = NowUs();
    auto r = HaproxyCommand(o_.stats_socket, "set server " + o_.backend + "/" + o_.primary + " state drain");
    if (!r.ok()) return r.status();
    d->swap_us = NowUs();
    d->swap_source = "runtime API: primary drained";
    return Status::Ok();
  }

  Status AfterDrill(const DrillRecord& d) override {
    if (d.kind != "planned") return Status::Ok();
    auto r = HaproxyCommand(o_.stats_socket, "set server " + o_.backend + "/" + o_.primary + " state ready");
    return r.status();
  }

  Status Counters(int64_t* resumed, int64_t* retried) override {
    auto s = Stats();
    if (!s.ok()) return s.status();
    *resumed = 0;  // HAProxy cannot continue a cut answer
    const ServerStat& b = (*s)["BACKEND"];
    *retried = b.retries + b.redispatches;
    return Status::Ok();
  }

 private:
  Result<std::map<std::string, ServerStat>> Stats() {
    auto out = HaproxyCommand(o_.stats_socket, "show stat");
    if (!out.ok()) return out.error();
    std::istringstream in(*out);
    std::string line;
    std::vector<std::string> cols;
    std::map<std::string, ServerStat> m;
    auto split = [](const std::string& l) {
      std::vector<std::string> f;
      std::string cur;
      for (char c : l) {
        if (c == ',') {
          f.push_back(cur);
          cur.clear();
        } else {
          cur += c;
        }
      }
      f.push_back(cur);
      return f;
    };
    while (std::getline(in, line)) {
      if (line.rfind("# ", 0) == 0) {
        cols = split(line.substr(2));
        continue;
      }
      if (line.empty() || cols.empty()) continue;
      auto f = split(line);
      auto col = [&](const std::string& name) -> std::string {
        for (size_t i = 0; i < cols.size() && i < f.size(); ++i) {
          if (cols[i] == name) return f[i];
        }
        return "";
      };
      if (col("pxname") != o_.backend) continue;
      ServerStat s;
      s.status = col("status");
      s.retries = std::atoll(col("wretr").c_str());
      s.redispatches = std::atoll(col("wredis").c_str());
      m[col("svname")] = s;
    }
    if (!m.count(o_.primary) || !m.count(o_.backup)) {
      return NotFound("haproxy: backend " + o_.backend + " with servers " + o_.primary + " and " + o_.backup +
                      " not in the stats; check the config");
    }
    return m;
  }

  Result<pid_t> EnginePid(int port) {
    ControlClient sup;
    WSUP_RETURN_IF_ERROR(sup.Connect(o_.supervisor_socket));
    auto st = sup.Call({{"type", "status"}});
    if (!st.ok()) return st.error();
    for (const auto& e : st->value("engines", json::array())) {
      if (e.value("port", 0) == port && e.value("pid", 0) > 0) return static_cast<pid_t>(e.value("pid", 0));
    }
    return NotFound("haproxy: no engine of the wsup node runs on port " + std::to_string(port));
  }

  Result<std::string> Ready() {
    auto s = Stats();
    if (!s.ok()) return s.error();
    for (const std::string& n : {o_.primary, o_.backup}) {
      if ((*s)[n].status != "UP") return n + " is " + (*s)[n].status;
    }
    ControlClient sup;
    WSUP_RETURN_IF_ERROR(sup.Connect(o_.supervisor_socket));
    auto st = sup.Call({{"type", "status"}});
    if (!st.ok()) return st.error();
    for (int port : {o_.primary_port, o_.backup_port}) {
      bool ok = false;
      for (const auto& e : st->value("engines", json::array())) {
        ok = ok || (e.value("port", 0) == port && e.value("semantic_ready", false));
      }
      if (!ok) return "the engine on port " + std::to_string(port) + " is not proven ready";
    }
    return std::string();
  }

  HaproxyTargetOptions o_;
};

}  // namespace

std::unique_ptr<DrillTarget> MakeWsupTarget(WsupTargetOptions o) { return std::make_unique<WsupTarget>(std::move(o)); }
std::unique_ptr<DrillTarget> MakeHaproxyTarget(HaproxyTargetOptions o) {
  return std::make_unique<HaproxyTarget>(std::move(o));
}

// ---------------------------------------------------------------------------

Status RunDrills(DrillTarget& target, LoadGenerator& load, const DrillPlan& plan, std::vector<DrillRecord>* out) {
  int n = plan.crash + plan.planned + plan.hang;
  auto gap = plan.gap;
  if (plan.total.count() > 0 && n > 0) gap = std::max(gap, plan.total / (n + 1));
  // Kinds in turn (crash, planned, hang, crash, ...), skipping those used up.
  const char* kKinds[] = {"crash", "planned", "hang"};
  int left[] = {plan.crash, plan.planned, plan.hang};
  int turn = 0;
  int64_t resumed0 = 0, retried0 = 0;
  auto last = Steady::now();
  uint64_t last_completed = load.completed();
  for (int i = 0; i < n; ++i) {
    while (left[turn % 3] == 0) ++turn;
    const int kind = turn++ % 3;
    DrillRecord d;
    d.kind = kKinds[kind];
    Status ready = target.WaitReady(plan.ready_limit);
    if (!ready.ok()) return ready;
    // Undisturbed load between drills, bounded.
    auto deadline = Steady::now() + plan.gap + 60s;
    while ((Steady::now() < last + gap || load.completed() < last_completed + plan.min_requests_between) &&
           Steady::now() < deadline) {
      std::this_thread::sleep_for(5ms);
    }
    if (load.completed() < last_completed + plan.min_requests_between) {
      return Timeout(target.name() + ": the load completed only " + std::to_string(load.completed() - last_completed) +
                     " requests in the minute before drill " + std::to_string(i));
    }
    WSUP_RETURN_IF_ERROR(target.WaitReady(plan.ready_limit));
    int64_t resumed = 0, retried = 0;
    WSUP_RETURN_IF_ERROR(target.Counters(&resumed, &retried));
    if (!out->empty()) {
      out->back().resumed = resumed - resumed0;
      out->back().retried = retried - retried0;
    }
    resumed0 = resumed;
    retried0 = retried;
    load.BurstProbes();  // dense probes from just before the drill
    Status s = kind == 0 ? target.Crash(&d) : kind == 1 ? target.Planned(&d) : target.Hang(&d);
    if (!s.ok()) return Status(Error(s.code(), target.name() + " drill " + std::to_string(i) + " (" + d.kind + "): " +
                                                   s.error().message()));
    --left[kind];
    last = Steady::now();
    last_completed = load.completed();
    // The service answers correctly again before the next drill.
    auto rdeadline = Steady::now() + plan.recover_limit;
    int64_t first_ok = 0;
    while ((first_ok = load.FirstOkSince(d.t0_us)) == 0 && Steady::now() < rdeadline) {
      std::this_thread::sleep_for(1ms);
    }
    char line[256];
    std::snprintf(line, sizeof line, "%s drill %d/%d %-7s swap %7.1f ms  first correct answer %7.1f ms  (%s)",
                  target.name().c_str(), i + 1, n, d.kind.c_str(), d.swap_us < 0 ? -1.0 : (d.swap_us - d.t0_us) / 1e3,
                  first_ok == 0 ? -1.0 : (first_ok - d.t0_us) / 1e3, d.swap_source.c_str());
    Log(plan.verbose, line);
    WSUP_RETURN_IF_ERROR(target.AfterDrill(d));
    out->push_back(d);
  }
  // The last drill's window: undisturbed load, then its counters.
  auto deadline = Steady::now() + gap + 60s;
  while ((Steady::now() < last + gap || load.completed() < last_completed + plan.min_requests_between) &&
         Steady::now() < deadline) {
    std::this_thread::sleep_for(5ms);
  }
  if (!out->empty()) {
    int64_t resumed = 0, retried = 0;
    WSUP_RETURN_IF_ERROR(target.Counters(&resumed, &retried));
    out->back().resumed = resumed - resumed0;
    out->back().retried = retried - retried0;
  }
  return Status::Ok();
}

}  // namespace wsup::test
