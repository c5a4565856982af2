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
#include "common/json_fields.h"
#include "common/log.h"
#include "state/ledger.h"
#include "state/report.h"
#include "state/report_html.h"
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
  auto r = JsonCall(socket, req, timeout_ms, "the supervisor");
  if (!r.ok()) {
    return Error(r.error().code(), r.error().message() +
                                       "; is the supervisor running? (`wsup start CONFIG`; pass --socket or "
                                       "--config to name another node)");
  }
  auto type = FieldOr<std::string>(*r, "type", "");
  if (type.ok() && *type == "error") {
    auto message = FieldOr<std::string>(*r, "message", "refused");
    return Refused(socket + ": " + (message.ok() ? *message : "refused (" + message.error().message() + ")"));
  }
  return std::move(*r);
}

// The supervisor's answer, read for what the CLI prints: a field that is
// absent reads as its fallback, and so does one of another type, which is
// also named once at the end (a supervisor of another wsup version). Never
// throws.
class AnswerReader {
 public:
  std::string Str(const json& o, std::string_view key, std::string fallback = "") {
    return Read<std::string>(o, key, std::move(fallback));
  }
  int64_t Int(const json& o, std::string_view key, int64_t fallback = 0) { return Read<int64_t>(o, key, fallback); }
  uint64_t Uint(const json& o, std::string_view key) { return Read<uint64_t>(o, key, 0); }
  bool Bool(const json& o, std::string_view key) { return Read<bool>(o, key, false); }
  // An empty object (array) when absent or of another type.
  const json& Obj(const json& o, std::string_view key) { return Nested(ObjectFieldOr(o, key), kEmptyObject); }
  const json& Arr(const json& o, std::string_view key) { return Nested(ArrayFieldOr(o, key), kEmptyArray); }
  // What could not be read, as a line to print; "" when everything could.
  std::string Note() const {
    if (bad_.empty()) return "";
    return "(part of the supervisor's answer could not be read: " + bad_ +
           "; run the same wsup version as the supervisor)\n";
  }

 private:
  template <typename T>
  T Read(const json& o, std::string_view key, T fallback) {
    auto v = FieldOr<T>(o, key, fallback);
    if (v.ok()) return std::move(*v);
    Bad(v.error());
    return fallback;
  }
  const json& Nested(const Result<const json*>& r, const json& fallback) {
    if (!r.ok()) Bad(r.error());
    return r.ok() && *r ? **r : fallback;
  }
  void Bad(const Error& e) {
    if (bad_.empty()) bad_ = e.message();
  }
  inline static const json kEmptyObject = json::object();
  inline static const json kEmptyArray = json::array();
  std::string bad_;
};

void PrintStatus(std::ostream& o, const json& s) {
  AnswerReader rd;
  o << "node " << rd.Str(s, "node", "?") << ": " << rd.Str(s, "state", "?");
  if (s.contains("degraded_reason")) o << " (" << rd.Str(s, "degraded_reason") << ")";
  o << "\nactive: " << rd.Str(s, "active", "none") << "\n";
  const json& f = rd.Obj(s, "front");
  o << "front: " << rd.Str(f, "listen") << " (pid " << rd.Int(f, "pid") << ", " << rd.Str(f, "state", "?")
    << ", restarts " << rd.Int(f, "restarts") << (rd.Bool(f, "crash_looping") ? ", CRASH-LOOPING" : "") << ")\n";
  o << "engines:\n";
  for (const auto& e : rd.Arr(s, "engines")) {
    o << "  " << rd.Str(e, "slot") << "  " << rd.Str(e, "state") << "  pid " << rd.Int(e, "pid") << "  port "
      << rd.Int(e, "port") << "  semantic_ready " << (rd.Bool(e, "semantic_ready") ? "yes" : "no")
      << "  comm_warm " << (rd.Bool(e, "comm_warm") ? "yes" : "no") << "  cache " << rd.Str(e, "cache", "-");
    // Its KV: the node's pool, its scratch, or a cache of its own.
    if (const json& kv = rd.Obj(e, "kv"); !kv.empty()) {
      o << "  kv " << rd.Str(kv, "source", "?");
      if (kv.contains("bytes")) o << " " << (rd.Uint(kv, "bytes") >> 20) << " MiB";
    }
    if (e.contains("death_seen_by")) o << "  death seen by " << rd.Str(e, "death_seen_by");
    o << "\n";
  }
  if (const json& p = rd.Obj(s, "kv_pool"); !p.empty()) {
    const std::string owner = rd.Str(p, "owner");
    o << "kv pool: " << rd.Int(p, "pool_mib") << " MiB per rank, "
      << (!owner.empty() ? "mapped by " + owner + " (" + rd.Str(p, "state", "?") + ")"
                         : std::string("mapped by no engine (") + rd.Str(p, "state", "?") + ")")
      << ", scratch " << rd.Int(p, "scratch_mib") << " MiB\n";
  }
  if (const json& holders = rd.Arr(s, "holders"); !holders.empty()) {
    o << "holders:\n";
    for (const auto& h : holders) {
      o << "  rank " << rd.Int(h, "rank") << "  pid " << rd.Int(h, "pid") << "  " << rd.Str(h, "socket")
        << "  kept fds " << rd.Int(h, "kept_fds");
      if (const json& kp = rd.Obj(h, "kv_pool"); !kp.empty()) {
        o << "  kv pool " << rd.Str(kp, "id", "?").substr(0, 8) << " (" << (rd.Uint(kp, "bytes") >> 20) << " MiB)";
      }
      if (rd.Int(h, "kept_layouts") > 0) {
        o << "  kept layouts " << rd.Int(h, "kept_layouts") << " (" << rd.Int(h, "kept_layout_fds") << " fds)";
      }
      o << "\n";
    }
  }
  if (const json& fo = rd.Obj(s, "failover"); rd.Bool(fo, "in_progress")) {
    const std::string to = rd.Str(fo, "to_slot");
    o << "failover #" << rd.Int(fo, "failover_id") << " in progress: engine " << rd.Str(fo, "from_slot", "?")
      << " to " << (!to.empty() ? "engine " + to : std::string("none yet"))
      << (rd.Bool(fo, "drill") ? " (drill)" : "") << ", until the first correct answer through the front\n";
  }
  if (const json& r = rd.Obj(s, "rollout"); !r.empty()) {
    if (rd.Bool(r, "in_progress")) {
      o << "rollout #" << rd.Int(r, "id") << ": step " << rd.Str(r, "step", "?") << " (new version on engine "
        << rd.Str(r, "new_slot", "?") << " first, then " << rd.Str(r, "old_slot", "?") << ")\n  to "
        << rd.Str(r, "command_after") << "\n";
    } else if (const json& l = rd.Obj(r, "last"); !l.empty()) {
      o << "last rollout #" << rd.Int(l, "id") << ": " << rd.Str(l, "outcome", "?");
      if (const std::string reason = rd.Str(l, "reason"); !reason.empty()) o << " (" << reason << ")";
      o << "\n";
    }
  }
  if (const json& l = rd.Obj(s, "ledger_writes"); !l.empty()) {
    const int64_t now = rd.Int(l, "write_errors");
    // lost_rows counts earlier runs too (a supervisor without it: this run's).
    const int64_t all = std::max(now, rd.Int(l, "lost_rows"));
    if (all > 0) {
      o << "ledger: " << all << " row(s) NOT recorded";
      if (all != now) o << " (" << now << " by this supervisor, the rest before its start)";
      std::string last = rd.Str(l, "last_write_error", rd.Str(l, "last_error", rd.Str(l, "lost_last_error")));
      if (!last.empty()) o << " (last: " << last << ")";
      o << "; check the disk and permissions of " << rd.Str(s, "ledger", "the ledger")
        << "; `wsup report` counts them by table\n";
    }
    if (rd.Bool(l, "retrying")) {
      o << "ledger: a write failed and is being retried: " << rd.Str(l, "retry_error") << "\n";
    }
    if (l.contains("lost_file_error")) {
      o << "ledger: the count of lost rows cannot be saved (" << rd.Str(l, "lost_file_error")
        << "); it is kept in memory only\n";
    }
    if (l.contains("reopened")) o << "ledger: " << rd.Str(l, "reopened") << "\n";
  }
  o << rd.Note();
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
  auto* c = app.add_subcommand("check", "check config files: exit 0, or 1 with FILE:LINE:COL: key: what is wrong; "
                                        "several are checked as one group's members");
  auto config = std::make_shared<std::vector<std::string>>();
  auto sets = std::make_shared<std::vector<std::string>>();
  auto no_paths = std::make_shared<bool>(false);
  c->add_option("config", *config, "the config file; a group's members' files, all of them, to check the group")
      ->required();
  c->add_option("--set", *sets, "override a key: section.key=value (repeatable)");
  c->add_flag("--no-paths", *no_paths,
              "do not check the model folder, programs and folders on this machine (a config for another one)");
  c->callback([&ctx, config, sets, no_paths] {
    auto out = CheckConfigs(*config, *sets, !*no_paths, JoinPath(SelfDir(), "wsup-holder"));
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
    AnswerReader rd;
    bool ok = rd.Bool(*r, "ok");
    // A failover the ledger did not record happened, but a drill is also
    // its record: the caller must know it is missing.
    bool recorded = !r->contains("recorded") || rd.Bool(*r, "recorded");
    if (*as_json) {
      *ctx.out << r->dump(2) << "\n";
    } else if (ok) {
      *ctx.out << "failover " << rd.Str(*r, "from_slot") << " -> " << rd.Str(*r, "to_slot") << ": swapped after "
               << rd.Int(*r, "swap_ms") << " ms, first correct answer through the front after "
               << rd.Int(*r, "first_ok_ms") << " ms\n" << rd.Note();
    } else {
      *ctx.err << "wsup failover: " << rd.Str(*r, "error", "failed") << "\n" << rd.Note();
    }
    if (!recorded && !*as_json) {
      *ctx.err << "wsup failover: the ledger did NOT record this failover: " << rd.Str(*r, "ledger_error", "?")
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
    AnswerReader rd;
    const bool ok = rd.Bool(*r, "ok");
    const std::string outcome = rd.Str(*r, "outcome", "?");
    if (*as_json) {
      *ctx.out << r->dump(2) << "\n";
    } else if (outcome == "done") {
      *ctx.out << "rollout #" << rd.Int(*r, "rollout_id") << " done in " << rd.Int(*r, "ms")
               << " ms: both engines run the new version\n";
    } else if (outcome == "applied" || outcome == "unchanged") {
      *ctx.out << "reload: " << (outcome == "applied" ? "applied at once" : "nothing changed") << "\n";
    } else {
      std::string why = rd.Str(*r, "error", rd.Str(*r, "reason"));
      *ctx.err << "wsup reload: " << outcome << (why.empty() ? "" : ": " + why) << "\n";
    }
    if (!*as_json) *(ok ? ctx.out : ctx.err) << rd.Note();
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
  auto html = std::make_shared<std::string>();
  t->AddFlags(c);
  c->add_flag("--miss-tail", *miss_tail, "list the slowest recoveries after a cache miss");
  c->add_option("--tail", *tail_n, "how many rows the miss tail lists (default 5)");
  c->add_flag("--json", *as_json, "print JSON");
  c->add_option("--since", *since, "only events in the last DURATION (90s, 10m, 2h, 7d)");
  c->add_option("--db", *db, "read this ledger file instead of asking the supervisor");
  c->add_option("--html", *html,
                "write the report as one self-contained HTML page to FILE: a timeline of failovers, rollouts and "
                "cache misses, each failover's phases as a bar, the percentiles");
  c->callback([&ctx, t, miss_tail, tail_n, as_json, since, db, html] {
    if (!html->empty() && *as_json) {
      *ctx.err << "wsup report: --html and --json are two outputs; ask for one of them\n";
      ctx.exit_code = kCliExitUsage;
      return;
    }
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
        AnswerReader rd;
        path = rd.Str(*s, "ledger");
        *ctx.err << rd.Note();
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
    if (!html->empty()) {
      // Written whole under a new name and renamed: a page being written is
      // never seen half.
      if (Status w = WriteFileAtomic(*html, RenderReportHtml(*rep)); !w.ok()) {
        *ctx.err << "wsup report: --html " << *html << ": " << w.error().message()
                 << "; name a file in a folder that exists and you can write\n";
        ctx.exit_code = 1;
        return;
      }
      *ctx.out << "wrote " << *html << ": " << rep->failover_rows.size() << " failovers, " << rep->rollouts.size()
               << " rollouts, " << rep->cache_miss_rows.size() << " cache misses\n";
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
