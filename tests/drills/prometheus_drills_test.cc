// A real Prometheus (Debian's prometheus package) scrapes a node every
// second while 8 clients load it and 3 crash (SIGKILL), 2 hang (SIGSTOP)
// and 1 planned drill run; then every query of every panel of the Grafana
// dashboard (contrib/grafana/wsup.json) is asked of that Prometheus
// through its HTTP API, as Grafana would ask it.
//
// Checked: each query returns data; the failovers' increase over the run,
// by trigger, is the drills made (crash 3, hang 2, drill 1, none else);
// the slots' one-hot state sums to 1 in every scrape; and the clients'
// time to first token over the drills is above its baseline before them
// (a hang holds a stream's first token for the hedge's wait at least).
#include <catch2/catch.hpp>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>

#include <nlohmann/json.hpp>

#include "state/report.h"
#include "testkit/browser.h"
#include "testkit/failover_drill.h"
#include "testkit/failover_load.h"
#include "testkit/http_client.h"
#include "tests/drills/drill_node.h"
#include "testkit/test_util.h"

namespace wsup {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;

constexpr int kCrashes = 3, kHangs = 2, kPlanned = 1;
constexpr int kHedgeMs = 200;
constexpr const char* kPrometheus = "/usr/bin/prometheus";

std::string UrlEncode(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      char buf[4];
      std::snprintf(buf, sizeof buf, "%%%02X", c);
      out += buf;
    }
  }
  return out;
}

double NowS() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

int AdminPort(const test::Node& n) {
  auto s = n.Status();
  if (!s) return 0;
  const std::string a = s->value("admin", "");
  return std::atoi(a.c_str() + a.rfind(':') + 1);
}

// Prometheus on a port of its own, scraping the node's /metrics every second.
class Prometheus {
 public:
  Prometheus(const test::TempDir& dir, int target_port) : port_(test::FreeLoopbackPort()) {
    REQUIRE(port_ > 0);
    const std::string config = dir.Join("prometheus.yml");
    std::ofstream(config) << "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\n  evaluation_interval: 1s\n"
                             "scrape_configs:\n  - job_name: wsup\n    static_configs:\n      - targets: ['127.0.0.1:"
                          << target_port << "']\n";
    log_ = dir.Join("prometheus.log");
    child_ = test::Child::Start({kPrometheus, "--config.file=" + config, "--storage.tsdb.path=" + dir.Join("tsdb"),
                                 "--web.listen-address=127.0.0.1:" + std::to_string(port_), "--log.level=warn"},
                                log_);
  }
  ~Prometheus() {
    child_.Kill(SIGTERM);
    if (child_.Wait(10s) < 0) child_.Kill(SIGKILL);
  }
  std::string Log() const { return test::ReadAll(log_); }
  bool Ready() const { return test::HttpRequestOnce(port_, "GET", "/-/ready", "", 2s).status == 200; }

  // An API call's "data", or null (with the error in *why).
  json Api(const std::string& target, std::string* why = nullptr) const {
    test::HttpResult r = test::HttpRequestOnce(port_, "GET", target, "", 30s);
    json j = json::parse(r.body, nullptr, false);
    if (r.status != 200 || !j.is_object() || j.value("status", "") != "success") {
      if (why) *why = std::to_string(r.status) + " " + r.body.substr(0, 500);
      return nullptr;
    }
    return j["data"];
  }
  json Query(const std::string& q, double at, std::string* why = nullptr) const {
    char t[64];
    std::snprintf(t, sizeof t, "%.3f", at);
    return Api("/api/v1/query?query=" + UrlEncode(q) + "&time=" + t, why);
  }
  json Range(const std::string& q, double start, double end, std::string* why = nullptr) const {
    char t[160];
    std::snprintf(t, sizeof t, "&start=%.3f&end=%.3f&step=1", start, end);
    return Api("/api/v1/query_range?query=" + UrlEncode(q) + t, why);
  }

 private:
  int port_;
  std::string log_;
  test::Child child_;
};

// The numbers of a query's result (vector or matrix), NaN left out.
std::vector<double> Values(const json& data) {
  std::vector<double> out;
  if (!data.is_object() || !data.contains("result")) return out;
  for (const auto& s : data["result"]) {
    auto take = [&](const json& v) {
      const double x = std::strtod(v[1].get<std::string>().c_str(), nullptr);
      if (!std::isnan(x)) out.push_back(x);
    };
    if (s.contains("value")) take(s["value"]);
    if (s.contains("values")) {
      for (const auto& v : s["values"]) take(v);
    }
  }
  return out;
}

double Max(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, x);
  return m;
}

// The dashboard's queries as Grafana sends them: $node for every node,
// $__rate_interval at four scrape intervals (Grafana's floor for it).
std::vector<std::pair<std::string, std::string>> DashboardQueries() {
  json dash = json::parse(test::ReadAll(std::string(WSUP_SOURCE_DIR) + "/contrib/grafana/wsup.json"));
  std::vector<std::pair<std::string, std::string>> out;
  std::function<void(const json&)> walk = [&](const json& panels) {
    for (const auto& p : panels) {
      if (p.value("type", "") == "row") {
        if (p.contains("panels")) walk(p["panels"]);
        continue;
      }
      for (const auto& t : p.value("targets", json::array())) {
        std::string e = t.value("expr", "");
        for (auto [from, to] : {std::pair<std::string, std::string>{"$__rate_interval", "4s"}, {"$node", ".*"}}) {
          for (size_t at = e.find(from); at != std::string::npos; at = e.find(from, at + to.size())) {
            e.replace(at, from.size(), to);
          }
        }
        out.emplace_back(p.value("title", "?") + " / " + t.value("refId", "?"), e);
      }
    }
  };
  walk(dash["panels"]);
  return out;
}

TEST_CASE("metrics: a real Prometheus scrapes a node through 3 kill, 2 hang and 1 planned drill under 8 clients - "
          "every dashboard query has data and the counts are the drills",
          "[drills][metrics]") {
  if (test::SkipWithout("llama-tiny-f32")) return;
  if (::access(kPrometheus, X_OK) != 0) {
    WARN("skipped: " << kPrometheus << " is not installed (scripts/setup.sh installs Debian's prometheus package)");
    return;
  }
  const std::vector<test::GoldenCase> golden = test::DrillGolden("llama-tiny-f32");
  test::DrillNodeSpec spec;
  spec.kv_pool = true;
  spec.sets = {"front.hedge_after_ms=" + std::to_string(kHedgeMs)};
  test::DrillNode node(spec);
  node.Start();
  INFO(node.Log());
  REQUIRE(node.WaitServing());
  const int admin = AdminPort(node);
  REQUIRE(admin > 0);

  Prometheus prom(node.dir(), admin);
  INFO(prom.Log());
  REQUIRE(test::WaitFor([&] { return prom.Ready(); }, 60s));
  REQUIRE(test::WaitFor([&] { return Values(prom.Query("up{job=\"wsup\"}", NowS())) == std::vector<double>{1}; }, 30s));

  auto target = test::MakeWsupTarget({node.SupervisorSocket(), node.FrontSocket()});
  test::LoadOptions lo = test::DrillLoad(node, 8);
  lo.think_ms = test::kSanitized ? 300 : 100;
  test::LoadGenerator load(lo, golden);
  load.Start();
  // The baseline: the load undisturbed for a few scrapes.
  const double t0 = NowS();
  REQUIRE(test::WaitFor([&] { return NowS() - t0 >= 8; }, 20s));
  const double drills_start = NowS();
  test::DrillPlan plan = test::DrillPlanOf(kCrashes, kPlanned, kHangs, 16);
  plan.gap = test::kSanitized ? 1000ms : 500ms;
  test::DrillOutcome out = test::RunAndAnalyze(node, *target, load, plan);
  INFO(out.report);
  test::CheckDrilled(out, kCrashes + kHangs + kPlanned);

  // Prometheus has the last failover (the supervisor counts it at once; a
  // scrape a second later has it).
  const std::string by_trigger = "sum by (trigger) (wsup_failovers_total)";
  REQUIRE(test::WaitFor([&] { return Max(Values(prom.Query("sum(wsup_failovers_total)", NowS()))) >= 6; }, 30s));
  // Two more scrapes, so that the front's counters (asked every second) are in.
  const double settled = NowS();
  REQUIRE(test::WaitFor([&] { return NowS() - settled >= 2.5; }, 10s));
  const double end = NowS();
  const int run_s = static_cast<int>(std::ceil(end - t0)) + 2;

  // Every panel's every query returns data over the run.
  for (const auto& [where, q] : DashboardQueries()) {
    INFO(where << ": " << q);
    std::string why;
    json data = prom.Range(q, t0, end, &why);
    INFO(why);
    REQUIRE(data.is_object());
    CHECK(!Values(data).empty());
  }

  // The failovers' increase over the run, by trigger: the drills made.
  const std::string increase = "sum by (trigger) (increase(wsup_failovers_total[" + std::to_string(run_s) + "s]))";
  std::map<std::string, double> got;
  std::string why;
  const json inc = prom.Query(increase, end, &why);
  INFO(why);
  REQUIRE(inc.is_object());
  for (const auto& s : inc["result"]) {
    got[s["metric"].value("trigger", "")] = std::strtod(s["value"][1].get<std::string>().c_str(), nullptr);
  }
  INFO(increase << " -> " << json(got).dump());
  // increase() extrapolates to the window's edges by up to half a scrape
  // interval: the count is the nearest whole number.
  CHECK(std::lround(got["crash"]) == kCrashes);
  CHECK(std::lround(got["hang"]) == kHangs);
  CHECK(std::lround(got["drill"]) == kPlanned);
  CHECK(std::lround(got["probe"]) == 0);
  CHECK(std::lround(got["rollout"]) == 0);
  INFO(by_trigger);

  // The one-hot state sums to 1 for each slot in every scrape: the raw
  // samples, grouped by slot and scrape time.
  json raw = prom.Query("wsup_engine_state[" + std::to_string(run_s) + "s]", end);
  REQUIRE(raw.is_object());
  std::map<std::pair<std::string, std::string>, double> sums;
  for (const auto& s : raw["result"]) {
    for (const auto& v : s["values"]) {
      sums[{s["metric"].value("slot", ""), v[0].dump()}] += std::strtod(v[1].get<std::string>().c_str(), nullptr);
    }
  }
  CHECK(sums.size() >= 2 * static_cast<size_t>(end - t0) / 2);  // about a scrape a second, for each slot
  size_t not_one = 0;
  for (const auto& [k, v] : sums) not_one += v == 1 ? 0 : 1;
  CHECK(not_one == 0);

  // Time to first token: its p99 over 4 s windows, as the dashboard's panel
  // draws it, peaks higher during the drills than before them.
  const std::string ttft =
      "histogram_quantile(0.99, sum by (le) (rate(wsup_front_time_to_first_token_seconds_bucket[4s])))";
  const double before = Max(Values(prom.Range(ttft, t0 + 4, drills_start)));
  const double during = Max(Values(prom.Range(ttft, drills_start, end)));
  INFO("time to first token p99: at most " << before << " s before the drills, up to " << during << " s during them");
  CHECK(before > 0);
  CHECK(during >= 1.5 * before);
  WARN("time to first token p99: at most " << before << " s before the drills, up to " << during
                                           << " s during them");

  // The same run as a page: `wsup report --html` on the node's ledger,
  // rendered in headless Chromium, one bar per failover, no console
  // message; the screenshot stays in the build tree.
  // The ledger's writer commits off the supervisor's loop: every drill's
  // row is there first.
  const std::string db = node.dir().Join("state/wsup.db");
  auto reader = LedgerReader::Open(db);
  REQUIRE(reader.ok());
  REQUIRE(test::WaitFor(
      [&] {
        auto rows = reader->Failovers();
        return rows.ok() && rows->size() == static_cast<size_t>(kCrashes + kHangs + kPlanned);
      },
      30s));
  const std::string page = node.dir().Join("report.html");
  auto report = test::Run({test::BinPath("wsup"), "report", "--db", db, "--html", page},
                          60s);
  INFO(report.output);
  REQUIRE(report.exit_code == 0);
  CHECK(report.output.find("6 failovers") != std::string::npos);
  if (!test::HaveChromium()) {
    WARN("not rendered: " << test::kChromium << " is not installed (scripts/setup.sh installs Debian's chromium)");
    return;
  }
  std::filesystem::create_directories(std::string(WSUP_BUILD_DIR) + "/artifacts");
  const std::string shot = std::string(WSUP_BUILD_DIR) + "/artifacts/drills_report.png";
  test::RenderedPage rendered = test::RenderPage(page, node.dir().path(), shot);
  CHECK(test::ReportPageProblems(rendered, kCrashes + kHangs + kPlanned).empty());
  CHECK(test::ReadAll(shot).rfind("\x89PNG", 0) == 0);
  WARN("the drills' report page: " << shot);
}

}  // namespace
}  // namespace wsup
