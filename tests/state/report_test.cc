// Reports: percentiles on known data, durations, the since window, the miss
// tail, and both renderers.
#include "state/report.h"

#include <algorithm>
#include <numeric>
#include <random>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "state/ledger.h"
#include "testkit/test_util.h"

namespace wsup {
namespace {

TEST_CASE("report: nearest-rank percentiles on known data", "[state]") {
  std::vector<int64_t> v(100);
  std::iota(v.begin(), v.end(), 1);
  std::shuffle(v.begin(), v.end(), std::mt19937(7));
  Distribution d = Percentiles(v);
  CHECK(d.count == 100);
  CHECK(d.p50 == 50);
  CHECK(d.p95 == 95);
  CHECK(d.p99 == 99);
  CHECK(d.max == 100);

  d = Percentiles({40, 10, 30, 20});
  CHECK(d.p50 == 20);
  CHECK(d.p95 == 40);
  CHECK(d.p99 == 40);
  CHECK(d.max == 40);

  d = Percentiles({7});
  CHECK((d.p50 == 7 && d.p99 == 7 && d.max == 7));

  // 1000 values: p99 is the 990th smallest, so one slow outlier shows only in max.
  std::vector<int64_t> tail(999, 5);
  tail.push_back(9000);
  d = Percentiles(tail);
  CHECK(d.p99 == 5);
  CHECK(d.max == 9000);

  CHECK(Percentiles({}).count == 0);
}

TEST_CASE("report: durations", "[state]") {
  CHECK(*ParseDuration("500ms") == 500);
  CHECK(*ParseDuration("90s") == 90'000);
  CHECK(*ParseDuration("10m") == 600'000);
  CHECK(*ParseDuration("2h") == 7'200'000);
  CHECK(*ParseDuration("7d") == 604'800'000);
  CHECK(*ParseDuration("1w") == 604'800'000);
  for (const char* bad : {"", "10", "m", "10x", "-5m", "5 m", "1.5h", "99999999999999999999d", "10mm"}) {
    INFO(bad);
    auto r = ParseDuration(bad);
    REQUIRE_FALSE(r.ok());
    CHECK(r.error().message().find("10m, 2h, 7d") != std::string::npos);
  }
}

// A ledger with a known history: `now` is the end of the window.
constexpr int64_t kNow = 1'800'000'000'000;
constexpr int64_t kHour = 3'600'000;

void Fill(Ledger& l) {
  // Two days ago: a miss with a very slow recovery (outside a 1h window).
  FailoverRecord old{0, "crash", "old", false, "a", "b", kNow - 48 * kHour, kNow - 48 * kHour + 1,
                     kNow - 48 * kHour + 2, std::nullopt};
  auto old_id = l.RecordFailover(old);
  REQUIRE(old_id.ok());
  REQUIRE(l.RecordRecovery({0, *old_id, "a", "crash", kNow - 48 * kHour, kNow - 48 * kHour + 99'000, "miss", "cold",
                            "{}"})
              .ok());
  REQUIRE(l.RecordCacheEvent({0, kNow - 48 * kHour, "a", 0, "miss", "daemon", "cold", "", std::nullopt, 99'000}).ok());

  // The last hour: 10 failovers (one drill, three by probe), 10 recoveries
  // of 100..1000 ms; recoveries 3, 6 and 9 after a miss.
  for (int i = 1; i <= 10; ++i) {
    int64_t t = kNow - kHour / 2 + i * 1000;
    std::string trigger = i == 10 ? "drill" : i <= 3 ? "probe" : "crash";
    FailoverRecord f{0, trigger, "r", trigger == "drill", "a", "b", t, t + i, t + i + 1, t + 50};
    auto id = l.RecordFailover(f);
    REQUIRE(id.ok());
    bool miss = i % 3 == 0;
    REQUIRE(l.RecordRecovery({0, *id, "a", trigger, t, t + i * 100, miss ? "miss" : "hit",
                              miss ? (i == 9 ? "fingerprint" : "cold") : "", "{\"load_ms\":" + std::to_string(i) + "}"})
                .ok());
    REQUIRE(l.RecordCacheEvent({0, t, "a", 0, miss ? "miss" : "hit", "daemon", miss ? "cold" : "", "",
                                miss ? std::nullopt : std::optional<int64_t>(2), std::nullopt})
                .ok());
  }
  REQUIRE(l.RecordHolderRestart({0, kNow - 60'000, 0, "signal 9", true, 4}).ok());
  REQUIRE(l.RecordHolderRestart({0, kNow - 50 * kHour, 1, "signal 9", false, 4000}).ok());
  REQUIRE(l.Flush().ok());
}

TEST_CASE("report: hit rate, recovery percentiles, miss tail and the since window", "[state]") {
  test::TempDir dir;
  std::string path = dir.Join("wsup.db");
  {
    auto l = Ledger::Open(path);
    REQUIRE(l.ok());
    Fill(**l);
  }
  auto reader = LedgerReader::Open(path);
  REQUIRE(reader.ok());

  ReportOptions all;
  all.now_ms = kNow;
  all.miss_tail = 2;
  auto r = BuildReport(*reader, all);
  REQUIRE(r.ok());
  CHECK(r->cache.lookups == 11);
  CHECK(r->cache.misses == 4);
  CHECK(r->recovery.count == 11);
  CHECK(r->recovery.max == 99'000);
  REQUIRE(r->miss_tail.size() == 2);
  CHECK(r->miss_tail[0].recovery_ms == 99'000);
  CHECK(r->miss_tail[1].recovery_ms == 900);
  CHECK(r->holder_restarts == 2);

  ReportOptions hour = all;
  hour.since_ms = *ParseDuration("1h");
  hour.miss_tail = 5;
  r = BuildReport(*reader, hour);
  REQUIRE(r.ok());
  CHECK(r->from_ms == kNow - kHour);
  CHECK(r->cache.lookups == 10);
  CHECK(r->cache.hits == 7);
  CHECK(r->cache.misses == 3);
  REQUIRE(r->cache.hit_rate.has_value());
  CHECK(*r->cache.hit_rate == Approx(0.7));
  REQUIRE(r->cache.miss_reasons.size() == 1);
  CHECK(r->cache.miss_reasons[0] == std::pair<std::string, int64_t>{"cold", 3});
  CHECK(r->failovers.count == 10);
  CHECK(r->failovers.kv_back.count == 0);  // no node KV pool in these rows
  CHECK(r->failovers.drills == 1);
  CHECK(r->failovers.probe == 3);
  CHECK(r->failovers.crash == 6);
  CHECK(r->failovers.detect.max == 10);
  CHECK(r->failovers.swap.max == 1);
  CHECK(r->failovers.outage.p50 == 50);
  // 100, 200, ..., 1000 ms
  CHECK(r->recovery.count == 10);
  CHECK(r->recovery.p50 == 500);
  CHECK(r->recovery.p95 == 1000);
  CHECK(r->recovery.p99 == 1000);
  CHECK(r->recovery.max == 1000);
  CHECK(r->recovery_miss.count == 3);
  CHECK(r->recovery_miss.p50 == 600);
  CHECK(r->recovery_hit.count == 7);
  CHECK(r->recovery_hit.max == 1000);
  REQUIRE(r->miss_tail.size() == 3);
  CHECK(r->miss_tail[0].recovery_ms == 900);
  CHECK(r->miss_tail[0].cache_reason == "fingerprint");
  CHECK(r->miss_tail[1].recovery_ms == 600);
  CHECK(r->miss_tail[2].recovery_ms == 300);
  CHECK(r->holder_restarts == 1);
  CHECK(r->holder_restarts_from_fds == 1);

  std::string text = RenderReportText(*r);
  CHECK(text.find("last 1h") != std::string::npos);
  CHECK(text.find("hit rate 70.0%") != std::string::npos);
  CHECK(text.find("p50 500 ms, p95 1000 ms, p99 1000 ms, max 1000 ms (n=10)") != std::string::npos);
  CHECK(text.find("900 ms, slot a, cause crash, miss fingerprint") != std::string::npos);

  auto j = nlohmann::json::parse(RenderReportJson(*r));
  CHECK(j["cache"]["hit_rate"].get<double>() == Approx(0.7));
  CHECK(j["recovery"]["all"]["p95_ms"] == 1000);
  CHECK(j["miss_tail"].size() == 3);
  CHECK(j["miss_tail"][0]["phases"]["load_ms"] == 9);
  CHECK(j["window_ms"] == kHour);

  // An empty window has no rates to show, and says so.
  ReportOptions none = all;
  none.now_ms = kNow + 100 * kHour;
  none.since_ms = 1000;
  r = BuildReport(*reader, none);
  REQUIRE(r.ok());
  CHECK(r->cache.lookups == 0);
  CHECK_FALSE(r->cache.hit_rate.has_value());
  CHECK(RenderReportText(*r).find("hit rate n/a") != std::string::npos);
  CHECK(nlohmann::json::parse(RenderReportJson(*r))["cache"]["hit_rate"].is_null());
}

}  // namespace
}  // namespace wsup
