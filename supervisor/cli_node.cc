// `wsup start | check | status | failover | report | stop`: the node
// commands. `start` runs the supervisor in the foreground; the others find
// it through its control socket:
//   --socket PATH, else --config CONFIG (with the same --set overrides as
//   start), else $WSUP_CONFIG, else the default runtime dir (/run/wsup).
#include <CLI/CLI.hpp>
#include <limits.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <ostream>

#include <nlohmann/json.hpp>

#include "common/fs.h"
#include "common/log.h"
#include "state/ledger.h"
#include "state/report.h"
#include "supervisor/cli.h"
#include "supervisor/config.h"
#include "supervisor/runtime_state.h"
#include "supervisor/supervisor.h"
#include "wire/json_call.h"

namespace wsup {
namespace {

using nlohmann::json;

constexpr const char* kDefaultRuntimeDir = "/run/wsup";

struct Target {
  std::string socket;
  std::string config;
  std::vector<std::string> sets;
  void AddFlags(CLI::App* c) {
    c->add_option("--socket", socket, "the supervisor's control socket (<runtime_dir>/wsup.sock)");
    c->add_option("--config", config, "find the supervisor through this config file");
    c->add_option("--set", sets, "section.key=value overrides, as given to `wsup start`");
  }
  // The control socket and, when a config was found, the config.
  Result<std::pair<std::string, std::optional<Config>>> Resolve() const {
    if (!socket.empty()) return std::make_pair(socket, std::optional<Config>());
    std::string path = config;
    if (path.empty()) {
      const char* env = std::getenv("WSUP_CONFIG");
      if (env && *env) path = env;
    }
    if (!path.empty()) {
      auto cfg = LoadConfig(path, sets);
      if (!cfg.ok()) return cfg.error();
      // The socket is copied before the config is moved from.
      std::string sock = cfg->supervisor.control_socket;
      return std::make_pair(std::move(sock), std::optional<Config>(std::move(*cfg)));
    }
    return std::make_pair(JoinPath(kDefaultRuntimeDir, "wsup.sock"), std::optional<Config>());
  }
};

std::string SelfDir() {
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return ".";
  buf[n] = 0;
  return DirName(buf);
}

Result<json> Call(const std::string& socket, const json& req, int timeout_ms) {
  auto r = JsonCall(socket, req, timeout_ms);
  if (!r.ok()) {
    return Error(r.error().code(), r.error().message() +
                                       "; is the supervisor running? (`wsup start CONFIG`; pass --socket or "
                                       "--config to name another node)");
  }
  if (r->value("type", "") == "error") return Refused(socket + ": " + r->value("message", "refused"));
  return std::move(*r);
}

void PrintStatus(std::ostream& o, const json& s) {
  o << "node " << s.value("node", "?") << ": " << s.value("state", "?");
  if (s.contains("degraded_reason")) o << " (" << s["degraded_reason"].get<std::string>() << ")";
  o << "\nactive: " << (s["active"].is_null() ? "none" : s["active"].get<std::string>()) << "\n";
  const json& f = s["front"];
  o << "front: " << f.value("listen", "") << " (pid " << f.value("pid", 0) << ", " << f.value("state", "?")
    << ", restarts " << f.value("restarts", 0) << (f.value("crash_looping", false) ? ", CRASH-LOOPING" : "") << ")\n";
  o << "engines:\n";
  for (const auto& e : s["engines"]) {
    o << "  " << e.value("slot", "") << "  " << e.value("state", "") << "  pid " << e.value("pid", 0) << "  port "
      << e.value("port", 0) << "  semantic_ready " << (e.value("semantic_ready", false) ? "yes" : "no")
      << "  comm_warm " << (e.value("comm_warm", false) ? "yes" : "no") << "  cache "
      << (e.value("cache", "").empty() ? "-" : e.value("cache", ""));
    // Its KV: the node's pool, its scratch, or a cache of its own.
    if (e.contains("kv") && e["kv"].is_object()) {
      const json& kv = e["kv"];
      o << "  kv " << kv.value("source", "?");
      if (kv.contains("bytes") && kv["bytes"].is_number_unsigned()) o << " " << (kv["bytes"].get<uint64_t>() >> 20) << " MiB";
    }
    if (e.contains("death_seen_by") && e["death_seen_by"].is_string()) {
      o << "  death seen by " << e["death_seen_by"].get<std::string>();
    }
    o << "\n";
  }
  if (s.contains("kv_pool") && s["kv_pool"].is_object()) {
    const json& p = s["kv_pool"];
    o << "kv pool: " << p.value("pool_mib", int64_t{0}) << " MiB per rank, "
      << (p["owner"].is_string() ? "mapped by " + p["owner"].get<std::string>() + " (" + p.value("state", "?") + ")"
                                 : std::string("mapped by no engine (") + p.value("state", "?") + ")")
      << ", scratch " << p.value("scratch_mib", int64_t{0}) << " MiB\n";
  }
  if (!s["holders"].empty()) {
    o << "holders:\n";
    for (const auto& h : s["holders"]) {
      o << "  rank " << h.value("rank", 0) << "  pid " << h.value("pid", 0) << "  " << h.value("socket", "")
        << "  kept fds " << h.value("kept_fds", 0);
      if (h.contains("kv_pool") && h["kv_pool"].is_object()) {
        o << "  kv pool " << h["kv_pool"].value("id", "?").substr(0, 8) << " ("
          << (h["kv_pool"].value("bytes", uint64_t{0}) >> 20) << " MiB)";
      }
      if (h.value("kept_layouts", 0) > 0) {
        o << "  kept layouts " << h.value("kept_layouts", 0) << " (" << h.value("kept_layout_fds", 0) << " fds)";
      }
      o << "\n";
    }
  }
  if (s.contains("failover") && s["failover"].is_object() && s["failover"].value("in_progress", false)) {
    const json& fo = s["failover"];
    o << "failover #" << fo.value("failover_id", int64_t{0}) << " in progress: engine " << fo.value("from_slot", "?")
      << " to " << (fo["to_slot"].is_string() ? "engine " + fo["to_slot"].get<std::string>() : std::string("none yet"))
      << (fo.value("drill", false) ? " (drill)" : "") << ", until the first correct answer through the front\n";
  }
  if (s.contains("rollout") && s["rollout"].is_object()) {
    const json& r = s["rollout"];
    if (r.value("in_progress", false)) {
      o << "rollout #" << r.value("id", int64_t{0}) << ": step " << r.value("step", "?") << " (new version on engine "
        << r.value("new_slot", "?") << " first, then " << r.value("old_slot", "?") << ")\n  to " << r.value("command_after", "")
        << "\n";
    } else if (r.contains("last") && r["last"].is_object()) {
      const json& l = r["last"];
      o << "last rollout #" << l.value("id", int64_t{0}) << ": " << l.value("outcome", "?");
      if (!l.value("reason", "").empty()) o << " (" << l.value("reason", "") << ")";
      o << "\n";
    }
  }
  if (s.contains("ledger_writes") && s["ledger_writes"].is_object()) {
    const json& l = s["ledger_writes"];
    const int64_t now = l.value("write_errors", int64_t{0});
    // lost_rows counts earlier runs too (a supervisor without it: this run's).
    const int64_t all = std::max(now, l.value("lost_rows", int64_t{0}));
    if (all > 0) {
      o << "ledger: " << all << " row(s) NOT recorded";
      if (all != now) o << " (" << now << " by this supervisor, the rest before its start)";
      std::string last = l.value("last_write_error", l.value("last_error", l.value("lost_last_error", "")));
      if (!last.empty()) o << " (last: " << last << ")";
      o << "; check the disk and permissions of " << s.value("ledger", "the ledger")
        << "; `wsup report` counts them by table\n";
    }
    if (l.value("retrying", false)) {
      o << "ledger: a write failed and is being retried: " << l.value("retry_error", "") << "\n";
    }
    if (l.contains("lost_file_error")) {
      o << "ledger: the count of lost rows cannot be saved (" << l.value("lost_file_error", "")
        << "); it is kept in memory only\n";
    }
    if (l.contains("reopened")) o << "ledger: " << l.value("reopened", "") << "\n";
  }
}

void RegisterStart(CLI::App& app, CliContext& ctx) {
  auto* c = app.add_subcommand("start", "run the supervisor for CONFIG in the foreground (systemd Type=notify)");
  auto config = std::make_shared<std::string>();
  auto sets = std::make_shared<std::vector<std::string>>();
  c->add_option("config", *config, "the node's config file (TOML)")->required();
  c->add_option("--set", *sets, "override a key: section.key=value (repeatable)");
  c->callback([&ctx, config, sets] {
    auto cfg = LoadConfig(*config, *sets);
    if (!cfg.ok()) {
      *ctx.err << cfg.error().message() << "\n";
      ctx.exit_code = kExitConfig;
      return;
    }
    InitLogging("wsup", cfg->supervisor.log_level);
    SupervisorOptions o;
    o.bin_dir = SelfDir();
    auto sup = Supervisor::Create(std::move(*cfg), o);
    if (!sup.ok()) {
      *ctx.err << "wsup start: " << sup.error().message() << "\n";
      ctx.exit_code = sup.error().code() == Code::kInvalidArgument ? kExitConfig : 1;
      return;
    }
    ctx.exit_code = (*sup)->Run();
  });
}

void RegisterCheck(CLI::App& app, CliContext& ctx) {
  auto* c = app.add_subcommand("check", "check a config file: exit 0, or 1 with FILE:LINE:COL: key: what is wrong");
  auto config = std::make_shared<std::string>();
  auto sets = std::make_shared<std::vector<std::string>>();
  auto no_paths = std::make_shared<bool>(false);
  c->add_option("config", *config, "the config file")->required();
  c->add_option("--set", *sets, "override a key: section.key=value (repeatable)");
  c->add_flag("--no-paths", *no_paths,
              "do not check the model folder, programs and folders on this machine (a config for another one)");
  c->callback([&ctx, config, sets, no_paths] {
    auto out = CheckConfig(*config, *sets, !*no_paths, JoinPath(SelfDir(), "wsup-holder"));
    (out.exit_code == 0 ? *ctx.out : *ctx.err) << out.output;
    ctx.exit_code = out.exit_code;
  });
}

void RegisterStatus(CLI::App& app, CliContext& ctx) {
  auto* c = app.add_subcommand("status", "show the node: state, active engine, engines, holders, front");
  auto t = std::make_shared<Target>();
  auto as_json = std::make_shared<bool>(false);
  t->AddFlags(c);
  c->add_flag("--json", *as_json, "print JSON");
  c->callback([&ctx, t, as_json] {
    auto where = t->Resolve();
    if (!where.ok()) {
      *ctx.err << where.error().message() << "\n";
      ctx.exit_code = 1;
      return;
    }
    auto s = Call(where->first, json{{"type", "status"}}, 5000);
    if (!s.ok()) {
      *ctx.err << "wsup status: " << s.error().message() << "\n";
      ctx.exit_code = 1;
      return;
    }
    s->erase("type");
    if (*as_json) {
      *ctx.out << s->dump(2) << "\n";
    } else {
      PrintStatus(*ctx.out, *s);
    }
  });
}

void RegisterFailover(CLI::App& app, CliContext& ctx) {
  auto* c = app.add_subcommand("failover", "move traffic to the standby: a drill, planned or with --kill");
  auto t = std::make_shared<Target>();
  auto drill = std::make_shared<bool>(false);
  auto kill = std::make_shared<bool>(false);
  auto as_json = std::make_shared<bool>(false);
  auto timeout = std::make_shared<int>(60'000);
  t->AddFlags(c);
  c->add_flag("--drill", *drill, "a deliberate failover (required: real ones are the supervisor's decision)");
  c->add_flag("--kill", *kill, "SIGKILL the active engine instead of a planned swap");
  c->add_flag("--json", *as_json, "print JSON");
  c->add_option("--timeout-ms", *timeout, "how long to wait for traffic on the new active engine");
  c->callback([&ctx, t, drill, kill, as_json, timeout] {
    if (!*drill) {
      *ctx.err << "wsup failover: pass --drill (and --kill for a crash drill); failovers outside drills are "
                  "decided by the supervisor\n";
      ctx.exit_code = kCliExitUsage;
      return;
    }
    auto where = t->Resolve();
    if (!where.ok()) {
      *ctx.err << where.error().message() << "\n";
      ctx.exit_code = 1;
      return;
    }
    auto r = Call(where->first, json{{"type", "failover"}, {"drill", true}, {"kill", *kill}}, *timeout);
    if (!r.ok()) {
      *ctx.err << "wsup failover: " << r.error().message() << "\n";
      ctx.exit_code = 1;
      return;
    }
    r->erase("type");
    bool ok = r->value("ok", false);
    // A failover the ledger did not record happened, but a drill is also
    // its record: the caller must know it is missing.
    bool recorded = !r->contains("recorded") || r->value("recorded", false);
    if (*as_json) {
      *ctx.out << r->dump(2) << "\n";
    } else if (ok) {
      *ctx.out << "failover " << r->value("from_slot", "") << " -> " << r->value("to_slot", "") << ": swapped after "
               << r->value("swap_ms", 0) << " ms, first correct answer through the front after "
               << r->value("first_ok_ms", 0) << " ms\n";
    } else {
      *ctx.err << "wsup failover: " << r->value("error", "failed") << "\n";
    }
    if (!recorded && !*as_json) {
      *ctx.err << "wsup failover: the ledger did NOT record this failover: " << r->value("ledger_error", "?")
               << "; `wsup status` and `wsup report` count the rows lost\n";
    }
    ctx.exit_code = ok && recorded ? 0 : 1;
  });
}

void RegisterReload(CLI::App& app, CliContext& ctx) {
  auto* c = app.add_subcommand(
      "reload", "read the config file again (with the start's --set overrides, then this command's): apply what can "
                "change at once, roll a new engine version through the standby first (rolled back if it fails); waits "
                "until it is done");
  auto t = std::make_shared<Target>();
  auto as_json = std::make_shared<bool>(false);
  auto timeout = std::make_shared<int>(3'600'000);
  t->AddFlags(c);
  c->add_flag("--json", *as_json, "print JSON");
  c->add_option("--timeout-ms", *timeout, "how long to wait for the roll to end (default one hour)");
  c->callback([&ctx, t, as_json, timeout] {
    auto where = t->Resolve();
    if (!where.ok()) {
      *ctx.err << where.error().message() << "\n";
      ctx.exit_code = 1;
      return;
    }
    json req{{"type", "reload"}};
    // Applied on top of the overrides the node was started with, and kept
    // for the next reload.
    if (!t->sets.empty()) req["set"] = t->sets;
    auto r = Call(where->first, req, *timeout);
    if (!r.ok()) {
      *ctx.err << "wsup reload: " << r.error().message() << "\n";
      ctx.exit_code = 1;
      return;
    }
    r->erase("type");
    const bool ok = r->value("ok", false);
    const std::string outcome = r->value("outcome", "?");
    if (*as_json) {
      *ctx.out << r->dump(2) << "\n";
    } else if (outcome == "done") {
      *ctx.out << "rollout #" << r->value("rollout_id", int64_t{0}) << " done in " << r->value("ms", int64_t{0})
               << " ms: both engines run the new version\n";
    } else if (outcome == "applied" || outcome == "unchanged") {
      *ctx.out << "reload: " << (outcome == "applied" ? "applied at once" : "nothing changed") << "\n";
    } else {
      std::string why = r->value("error", r->value("reason", ""));
      *ctx.err << "wsup reload: " << outcome << (why.empty() ? "" : ": " + why) << "\n";
    }
    ctx.exit_code = ok ? 0 : 1;
  });
}

void RegisterReport(CLI::App& app, CliContext& ctx) {
  auto* c = app.add_subcommand("report", "cache hit rate, recovery percentiles, failovers, the miss tail");
  auto t = std::make_shared<Target>();
  auto miss_tail = std::make_shared<bool>(false);
  auto tail_n = std::make_shared<int>(5);
  auto as_json = std::make_shared<bool>(false);
  auto since = std::make_shared<std::string>();
  auto db = std::make_shared<std::string>();
  t->AddFlags(c);
  c->add_flag("--miss-tail", *miss_tail, "list the slowest recoveries after a cache miss");
  c->add_option("--tail", *tail_n, "how many rows the miss tail lists (default 5)");
  c->add_flag("--json", *as_json, "print JSON");
  c->add_option("--since", *since, "only events in the last DURATION (90s, 10m, 2h, 7d)");
  c->add_option("--db", *db, "read this ledger file instead of asking the supervisor");
  c->callback([&ctx, t, miss_tail, tail_n, as_json, since, db] {
    std::string path = *db;
    if (path.empty()) {
      auto where = t->Resolve();
      if (!where.ok()) {
        *ctx.err << where.error().message() << "\n";
        ctx.exit_code = 1;
        return;
      }
      if (where->second) {
        path = Ledger::PathIn(where->second->node.state_dir);
      } else {
        auto s = Call(where->first, json{{"type", "status"}}, 5000);
        if (!s.ok()) {
          *ctx.err << "wsup report: " << s.error().message() << "\n";
          ctx.exit_code = 1;
          return;
        }
        path = s->value("ledger", "");
      }
    }
    ReportOptions o;
    o.now_ms = RealClock().WallMs();
    o.miss_tail = *miss_tail ? std::max(1, *tail_n) : 0;
    if (!since->empty()) {
      auto d = ParseDuration(*since);
      if (!d.ok()) {
        *ctx.err << "wsup report: --since " << *since << ": " << d.error().message() << "\n";
        ctx.exit_code = kCliExitUsage;
        return;
      }
      o.since_ms = *d;
    }
    auto reader = LedgerReader::Open(path);
    if (!reader.ok()) {
      *ctx.err << "wsup report: " << reader.error().message() << "\n";
      ctx.exit_code = 1;
      return;
    }
    auto rep = BuildReport(*reader, o);
    if (!rep.ok()) {
      *ctx.err << "wsup report: " << rep.error().message() << "\n";
      ctx.exit_code = 1;
      return;
    }
    *ctx.out << (*as_json ? RenderReportJson(*rep) : RenderReportText(*rep));
  });
}

void RegisterStop(CLI::App& app, CliContext& ctx) {
  auto* c = app.add_subcommand("stop", "stop the node: engines, front, holders, then the supervisor");
  auto t = std::make_shared<Target>();
  auto timeout = std::make_shared<int>(120'000);
  t->AddFlags(c);
  c->add_option("--timeout-ms", *timeout, "how long to wait for everything to stop");
  c->callback([&ctx, t, timeout] {
    auto where = t->Resolve();
    if (!where.ok()) {
      *ctx.err << where.error().message() << "\n";
      ctx.exit_code = 1;
      return;
    }
    auto r = Call(where->first, json{{"type", "stop"}}, *timeout);
    if (!r.ok()) {
      // No supervisor answers: stop what the node left, through its runtime
      // dir (the config's, else the control socket's folder).
      std::string runtime_dir = where->second ? where->second->node.runtime_dir : DirName(where->first);
      auto left = StopLeftovers(runtime_dir, std::min(*timeout, 10'000));
      if (!left.ok()) {
        *ctx.err << "wsup stop: " << left.error().message() << "\n";
        ctx.exit_code = 1;
        return;
      }
      if (left->empty()) {
        *ctx.err << "wsup stop: " << r.error().message() << "\n";
        ctx.exit_code = 1;
        return;
      }
      *ctx.out << "no supervisor was running; stopped what it left in " << runtime_dir << ":\n";
      for (const auto& line : *left) *ctx.out << "  " << line << "\n";
      return;
    }
    *ctx.out << "stopped\n";
  });
}

}  // namespace

void RegisterNodeCommands(CLI::App& app, CliContext& ctx) {
  RegisterStart(app, ctx);
  RegisterCheck(app, ctx);
  RegisterStatus(app, ctx);
  RegisterFailover(app, ctx);
  RegisterReload(app, ctx);
  RegisterReport(app, ctx);
  RegisterStop(app, ctx);
}

}  // namespace wsup
