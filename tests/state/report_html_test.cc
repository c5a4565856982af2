// `wsup report --html`'s page (state/report_html.h): its data is the
// report's rows, hostile text in a reason stays text, and, where Debian's
// chromium is installed, the page renders in it: one bar per failover, a
// mark on the timeline for each failover, rollout and cache miss, no console
// message.
#include "state/report_html.h"

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <fstream>
#include <string>

#include "testkit/browser.h"
#include "testkit/test_util.h"

namespace wsup {
namespace {

using nlohmann::json;

constexpr int64_t kT = 1'800'000'000'000;

size_t Count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + needle.size())) ++n;
  return n;
}

// The JSON the page carries, read back out of it.
json EmbeddedData(const std::string& page) {
  const std::string open = "<script type=\"application/json\" id=\"wsup-report-data\">";
  const size_t at = page.find(open);
  REQUIRE(at != std::string::npos);
  const size_t from = at + open.size();
  const size_t to = page.find("</script>", from);
  REQUIRE(to != std::string::npos);
  return json::parse(page.substr(from, to - from));
}

Report Sample() {
  Report r;
  r.now_ms = kT + 60'000;
  for (int i = 1; i <= 4; ++i) {
    FailoverRecord f;
    f.id = i;
    f.trigger = i == 4 ? "hang" : "crash";
    f.reason = i == 2 ? "</script><script>document.body.dataset.rendered='x'</script>" : "exit signal 9";
    f.from_slot = i % 2 ? "a" : "b";
    f.to_slot = i % 2 ? "b" : "a";
    f.fault_ms = kT + i * 10'000;
    f.detected_ms = f.fault_ms + 3;
    f.swapped_ms = f.detected_ms + 1;
    if (i != 3) f.first_ok_ms = f.swapped_ms + 10 * i;
    if (i == 1) f.kv_full_ms = *f.first_ok_ms + 5;
    r.failover_rows.push_back(f);
  }
  // A reason that is not UTF-8 (an engine's words) must not stop the page.
  r.failover_rows[2].reason = std::string("bad \xff\xfe bytes");
  RolloutRecord ro;
  ro.id = 1;
  ro.started_ms = kT + 5'000;
  ro.ended_ms = kT + 8'000;
  ro.outcome = "done";
  ro.command_before = "secret-command --token hf_abc";
  r.rollouts.push_back(ro);
  CacheEventRecord m;
  m.time_ms = kT + 9'000;
  m.slot = "a";
  m.result = "miss";
  m.miss_reason = "cold";
  r.cache_miss_rows.push_back(m);
  r.recovery.count = 2;
  r.recovery.p50 = 800;
  return r;
}

TEST_CASE("report html: the page carries the report's rows, and text from the ledger stays text", "[state][html]") {
  const Report r = Sample();
  const std::string page = RenderReportHtml(r);
  const json data = EmbeddedData(page);
  REQUIRE(data["failovers"].size() == 4);
  CHECK(data["failovers"][0]["kv_full_ms"] == *r.failover_rows[0].kv_full_ms);
  CHECK(data["failovers"][2]["first_ok_ms"].is_null());
  CHECK(data["failovers"][1]["reason"] == r.failover_rows[1].reason);  // read back whole, escaped in the page
  CHECK(data["failovers"][2]["reason"].get<std::string>().rfind("bad ", 0) == 0);
  CHECK(data["rollouts"].size() == 1);
  CHECK(data["cache_misses"].size() == 1);
  CHECK(data == json::parse(ReportPageData(r).dump(-1, ' ', false, json::error_handler_t::replace)));
  // One script of data and one of code: the reason's "</script>" did not end either.
  CHECK(Count(page, "</script>") == 2);
  // The operator's engine commands are not on a page that may be mailed around.
  CHECK(page.find("secret-command") == std::string::npos);
  // Self-contained: nothing is fetched.
  CHECK(page.find("src=") == std::string::npos);
  CHECK(page.find("http://") == page.find("http://www.w3.org/2000/svg"));
}

TEST_CASE("report html: rendered in headless Chromium - a bar per failover, a mark per event, no console message",
          "[state][html]") {
  if (!test::HaveChromium()) {
    WARN("skipped: " << test::kChromium << " is not installed (scripts/setup.sh installs Debian's chromium)");
    return;
  }
  test::TempDir dir;
  const std::string path = dir.Join("report.html");
  std::ofstream(path) << RenderReportHtml(Sample());
  test::RenderedPage page = test::RenderPage(path, dir.path(), dir.Join("report.png"));
  CHECK(test::ReportPageProblems(page, 4).empty());
  CHECK(page.Count("class=\"event failover\"") == 4);
  CHECK(page.Count("class=\"event rollout\"") == 1);
  CHECK(page.Count("class=\"event miss\"") == 1);
  // The first failover has all four phases; the third none past its swap.
  CHECK(page.Count("class=\"seg kv\"") == 1);
  CHECK(page.Count("class=\"seg answer\"") == 3);
  CHECK(test::ReadAll(dir.Join("report.png")).rfind("\x89PNG", 0) == 0);

  // An empty window renders too, and says so.
  const std::string empty = dir.Join("empty.html");
  Report none;
  none.now_ms = kT;
  std::ofstream(empty) << RenderReportHtml(none);
  test::RenderedPage e = test::RenderPage(empty, dir.path(), "");
  CHECK(test::ReportPageProblems(e, 0).empty());
  CHECK(e.dom.find("no failover in this window") != std::string::npos);

  // A page whose script breaks is caught: the error in the console, no
  // bars, no data-rendered.
  std::string broken = RenderReportHtml(Sample());
  const size_t at = broken.find("JSON.parse(");
  REQUIRE(at != std::string::npos);
  broken.replace(at, 11, "JSON.parsed(");
  const std::string bad = dir.Join("broken.html");
  std::ofstream(bad) << broken;
  const std::string problems = test::ReportPageProblems(test::RenderPage(bad, dir.path(), ""), 4);
  INFO(problems);
  CHECK(problems.find("its console said") != std::string::npos);
  CHECK(problems.find("Uncaught") != std::string::npos);
  CHECK(problems.find("did not finish") != std::string::npos);
  CHECK(problems.find("0 failover bars, not 4") != std::string::npos);
}

}  // namespace
}  // namespace wsup
