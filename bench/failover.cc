// wsup-bench-failover: failover under load, measured from the clients' side.
//
// Run mode: C concurrent completion clients (half streaming) send greedy
// completions of the golden cases through one proxy for the whole run, and
// every answer is checked against the golden output; meanwhile K crash
// drills (SIGKILL of the active engine's process group), K planned drills and
// H hang drills (SIGSTOP of that group) take turns. Per drill: kill to swap, kill to the first correct answer to a
// request sent after the kill, and the requests failed, lost, duplicated or
// wrong, streams resumed and requests retried in its window.
//
//   wsup-bench-failover --target wsup --url 127.0.0.1:8000
//       --supervisor-socket RUN/wsup.sock --front-socket RUN/front.sock
//       --golden golden.json --clients 16 --seconds 60 --crash 10 --planned 10 --out wsup.json
//   wsup-bench-failover --target haproxy --label "HAProxy" --url 127.0.0.1:8100
//       --haproxy-stats DIR/haproxy.sock --primary-port P1 --backup-port P2
//       --supervisor-socket RUN/wsup.sock ... --out haproxy.json
//
// Table mode: the Markdown table of several runs, wsup first.
//
//   wsup-bench-failover --table wsup.json haproxy.json
//
// bench/failover.sh sets up the node and HAProxy and runs both.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "testkit/failover_drill.h"
#include "testkit/failover_load.h"

namespace wsup::bench {
namespace {

using nlohmann::json;
using namespace ::wsup::test;  // the load and drill library (testkit/)

std::string Ms(const json& v) {
  if (!v.is_number()) return "-";
  double x = v.get<double>();
  if (x < 0) return "-";
  if (x >= 1e8) return "none";
  char b[32];
  std::snprintf(b, sizeof b, x < 10 ? "%.2f" : "%.1f", x);
  return b;
}

std::string Table(const std::vector<json>& runs) {
  std::ostringstream o;
  o << "| proxy | drill | drills | requests | failed | lost | duplicated | wrong | streams resumed | retried "
       "| kill to swap p50 / p99 (ms) | kill to first correct response p50 / p99 (ms) "
       "| kill to first complete correct answer p50 / p99 (ms) | largest extra latency of a request (ms) |\n";
  o << "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const json& r : runs) {
    for (const char* kind : {"crash", "planned", "hang"}) {
      if (!r["analysis"]["by_kind"].contains(kind)) continue;
      const json& s = r["analysis"]["by_kind"][kind];
      o << "| " << r.value("label", "?") << " | " << kind << " | " << s["drills"] << " | " << s["requests"] << " | "
        << s["failed"] << " | " << s["lost"] << " | " << s["duplicated"] << " | " << s["wrong"] << " | "
        << s["resumed"] << " | " << s["retried"] << " | " << Ms(s["swap_ms_p50"]) << " / " << Ms(s["swap_ms_p99"])
        << " | " << Ms(s["first_correct_ms_p50"]) << " / " << Ms(s["first_correct_ms_p99"]) << " | "
        << Ms(s["first_ok_ms_p50"]) << " / " << Ms(s["first_ok_ms_p99"]) << " | " << Ms(s["extra_ms_max"]) << " |\n";
    }
  }
  o << "\n";
  for (const json& r : runs) {
    const json& t = r["analysis"]["total"];
    const json& b = r["analysis"]["before_drills"];
    const json& l = r["analysis"]["latency_before_drills"];
    o << "- " << r.value("label", "?") << ": " << t["requests"] << " requests in " << r.value("seconds", 0.0)
      << " s (" << t["streams"] << " client streams, " << t["probes"] << " probes), " << t["ok"]
      << " ok; before the first drill: " << b["requests"]
      << " requests, " << (b["requests"].get<int64_t>() - b["ok"].get<int64_t>()) << " not ok; undisturbed latency "
      << "p50 / p99: answer " << Ms(l["plain_ms_p50"]) << " / " << Ms(l["plain_ms_p99"]) << " ms, stream's first token "
      << Ms(l["stream_first_token_ms_p50"]) << " / " << Ms(l["stream_first_token_ms_p99"]) << " ms, whole stream "
      << Ms(l["stream_ms_p50"]) << " / " << Ms(l["stream_ms_p99"]) << " ms, probe's first token "
      << Ms(l["probe_first_token_ms_p50"]) << " / " << Ms(l["probe_first_token_ms_p99"]) << " ms.\n";
  }
  // The goals, against the first run (wsup) and each other run.
  if (!runs.empty() && runs[0]["analysis"]["by_kind"].contains("crash")) {
    const json& w = runs[0]["analysis"]["by_kind"];
    int64_t bad = 0;
    for (const char* kind : {"crash", "planned", "hang"}) {
      if (!w.contains(kind)) continue;
      bad += w[kind]["failed"].get<int64_t>() + w[kind]["lost"].get<int64_t>() +
             w[kind]["duplicated"].get<int64_t>() + w[kind]["wrong"].get<int64_t>();
    }
    double wp99 = w["crash"]["first_correct_ms_p99"].get<double>();
    o << "- " << runs[0].value("label", "?") << ": " << bad << " requests failed, lost, duplicated or wrong in the drills "
      << "(goal 0); crash drills, kill to first correct response p99 " << Ms(wp99) << " ms (goal at most 50 ms).\n";
    // Hang drills: what each run's clients waited for.
    for (const json& r : runs) {
      const json& k = r["analysis"]["by_kind"];
      if (!k.contains("hang")) continue;
      o << "- " << r.value("label", "?") << ": hang drills (SIGSTOP), stop to first correct response p50 / p99 "
        << Ms(k["hang"]["first_correct_ms_p50"]) << " / " << Ms(k["hang"]["first_correct_ms_p99"])
        << " ms; the most a client request waited past its usual latency " << Ms(k["hang"]["extra_ms_max"])
        << " ms.\n";
    }
    for (size_t i = 1; i < runs.size(); ++i) {
      const json& h = runs[i]["analysis"]["by_kind"];
      if (runs[i].value("target", "") != "haproxy" || !h.contains("crash")) continue;
      double hp99 = h["crash"]["first_correct_ms_p99"].get<double>();
      char ratio[64];
      std::snprintf(ratio, sizeof ratio, "%.1fx", wp99 > 0 ? hp99 / wp99 : 0.0);
      o << "- " << runs[i].value("label", "?") << ": crash drills, kill to first correct response p99 " << Ms(hp99)
        << " ms = " << (hp99 >= 1e8 ? std::string("no recovery in a window") : std::string(ratio)) << " "
        << runs[0].value("label", "?") << "'s (goal at least 10x).\n";
    }
  }
  return o.str();
}

int Main(int argc, char** argv) {
  CLI::App app{"wsup-bench-failover: failover drills under load, wsup beside HAProxy"};
  std::string target = "wsup", label, url, golden, out, records, sup_socket, front_socket, stats;
  int clients = 16, crash = 10, planned = 10, hang = 0, primary_port = 0, backup_port = 0, probe_ms = 50;
  double seconds = 60;
  std::vector<std::string> table;
  app.add_option("--target", target, "wsup | haproxy")->check(CLI::IsMember({"wsup", "haproxy"}));
  app.add_option("--label", label, "name of the run in the table (default: the target)");
  app.add_option("--url", url, "HOST:PORT the clients send to (the front, or HAProxy)");
  app.add_option("--golden", golden, "the checkpoint's golden.json");
  app.add_option("--clients", clients, "concurrent clients; even-numbered ones stream");
  app.add_option("--seconds", seconds, "the drills are spread over at least this long");
  app.add_option("--probe-ms", probe_ms, "a short probe stream every this many ms, open loop (0: none)");
  app.add_option("--crash", crash, "crash drills (SIGKILL of the active engine)");
  app.add_option("--planned", planned, "planned drills");
  app.add_option("--hang", hang, "hang drills (SIGSTOP of the active engine)");
  app.add_option("--supervisor-socket", sup_socket, "the wsup node's control socket (RUNTIME_DIR/wsup.sock)");
  app.add_option("--front-socket", front_socket, "the front's control socket (RUNTIME_DIR/front.sock)");
  app.add_option("--haproxy-stats", stats, "HAProxy's stats socket (level admin)");
  app.add_option("--primary-port", primary_port, "the engine port behind HAProxy's primary server");
  app.add_option("--backup-port", backup_port, "the engine port behind HAProxy's backup server");
  app.add_option("--out", out, "write the run's JSON here");
  app.add_option("--records", records, "write every request (and the drills) as JSON here");
  app.add_option("--table", table, "print the Markdown table of these run files instead of running");
  CLI11_PARSE(app, argc, argv);

  if (!table.empty()) {
    std::vector<json> runs;
    for (const auto& f : table) {
      std::ifstream in(f);
      json j = json::parse(in, nullptr, false);
      if (j.is_discarded()) {
        std::cerr << f << ": not a run file of wsup-bench-failover\n";
        return 1;
      }
      runs.push_back(j);
    }
    std::cout << Table(runs);
    return 0;
  }
  if (url.empty() || golden.empty() || sup_socket.empty()) {
    std::cerr << "wsup-bench-failover: --url, --golden and --supervisor-socket are needed (see --help)\n";
    return 2;
  }
  auto cases = LoadGolden(golden);
  if (!cases.ok()) {
    std::cerr << cases.error().message() << "\n";
    return 1;
  }
  size_t colon = url.rfind(':');
  LoadOptions lo;
  lo.host = url.substr(0, colon);
  lo.port = std::atoi(url.c_str() + colon + 1);
  lo.clients = clients;
  lo.probe_interval_ms = probe_ms;
  std::unique_ptr<DrillTarget> t;
  if (target == "wsup") {
    if (front_socket.empty()) {
      std::cerr << "wsup-bench-failover: --target wsup needs --front-socket\n";
      return 2;
    }
    t = MakeWsupTarget({sup_socket, front_socket});
  } else {
    if (stats.empty() || primary_port <= 0 || backup_port <= 0) {
      std::cerr << "wsup-bench-failover: --target haproxy needs --haproxy-stats, --primary-port, --backup-port\n";
      return 2;
    }
    HaproxyTargetOptions ho;
    ho.stats_socket = stats;
    ho.primary_port = primary_port;
    ho.backup_port = backup_port;
    ho.supervisor_socket = sup_socket;
    t = MakeHaproxyTarget(ho);
  }
  if (label.empty()) label = target;

  Status ready = t->WaitReady(std::chrono::seconds(120));
  if (!ready.ok()) {
    std::cerr << ready.error().message() << "\n";
    return 1;
  }
  LoadGenerator load(lo, *cases);
  DrillPlan plan;
  plan.crash = crash;
  plan.planned = planned;
  plan.hang = hang;
  plan.total = std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
  std::vector<DrillRecord> drills;
  int64_t t0 = NowUs();
  load.Start();
  Status s = RunDrills(*t, load, plan, &drills);
  load.Stop();
  int64_t t1 = NowUs();
  json a = Analyze(drills, load.records());
  json run{{"label", label},
           {"target", target},
           {"url", url},
           {"clients", clients},
           {"probe_ms", probe_ms},
           {"seconds", (t1 - t0) / 1e6},
           {"crash", crash},
           {"planned", planned},
           {"hang", hang},
           {"completed", s.ok()},
           {"error", s.ok() ? "" : s.error().message()},
           {"analysis", a}};
  if (!out.empty()) std::ofstream(out) << run.dump(1) << "\n";
  if (!records.empty()) {
    json dj = json::array();
    for (const auto& d : drills) {
      dj.push_back({{"kind", d.kind}, {"t0_ms", (d.t0_us - t0) / 1e3},
                    {"swap_ms", d.swap_us < 0 ? -1.0 : (d.swap_us - d.t0_us) / 1e3}});
    }
    std::ofstream(records) << json{{"drills", dj}, {"requests", RecordsJson(load.records(), t0)}}.dump() << "\n";
  }
  std::cout << Table({run});
  if (!s.ok()) {
    std::cerr << "wsup-bench-failover: " << s.error().message() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace wsup::bench

int main(int argc, char** argv) { return wsup::bench::Main(argc, argv); }
