// HealthTracker: trip and recovery thresholds, causes, deterministic jitter,
// all driven by a FakeClock (no sleeping).
#include "probes/hysteresis.h"

#include <catch2/catch.hpp>

#include <set>

namespace wsup {
namespace {

ProbeOutcome Ok() { return {true, "", 5}; }
ProbeOutcome Bad(const std::string& why = "wrong answer: got [1] expected [2]") { return {false, why, 5}; }

HysteresisOptions Opts(int failures, int successes, Health initial = Health::kHealthy) {
  HysteresisOptions o;
  o.failures = failures;
  o.successes = successes;
  o.initial = initial;
  return o;
}

// A transition was reported, from `from` to `to`.
void CheckMove(const std::optional<HealthTransition>& tr, Health from, Health to) {
  REQUIRE(tr);
  CHECK(tr->from == from);
  CHECK(tr->to == to);
}

TEST_CASE("hysteresis: N consecutive failures trip, fewer never do", "[probes]") {
  FakeClock clock;
  HealthTracker t(Opts(3, 2), clock);
  CHECK_FALSE(t.Record(Bad()));
  CHECK_FALSE(t.Record(Bad()));
  CHECK(t.state() == Health::kHealthy);
  CHECK(t.consecutive_failures() == 2);
  clock.AdvanceMs(1234);
  auto tr = t.Record(Bad("timeout after 800 ms"));
  CheckMove(tr, Health::kHealthy, Health::kUnhealthy);
  CHECK(tr->cause == "3 consecutive probe failures; last: timeout after 800 ms");
  CHECK(tr->at_ms == clock.WallMs());
  CHECK(t.state() == Health::kUnhealthy);
  // More failures do not report again.
  CHECK_FALSE(t.Record(Bad()));
}

TEST_CASE("hysteresis: one bad answer between good ones never flips the state", "[probes]") {
  FakeClock clock;
  HealthTracker t(Opts(2, 2), clock);
  for (int i = 0; i < 50; ++i) {
    CHECK_FALSE(t.Record(i % 2 ? Ok() : Bad()));
    CHECK(t.state() == Health::kHealthy);
  }
  CHECK(t.probes() == 50);
}

TEST_CASE("hysteresis: failures == 1 trips on the first failure", "[probes]") {
  FakeClock clock;
  HealthTracker t(Opts(1, 1), clock);
  auto tr = t.Record(Bad("connection refused"));
  REQUIRE(tr);
  CHECK(tr->cause == "1 probe failure; last: connection refused");
  auto back = t.Record(Ok());
  REQUIRE(back);
  CHECK(back->to == Health::kHealthy);
}

TEST_CASE("hysteresis: M consecutive successes recover - a failure restarts the count", "[probes]") {
  FakeClock clock;
  HealthTracker t(Opts(1, 3, Health::kUnhealthy), clock);
  CHECK_FALSE(t.Record(Ok()));
  CHECK_FALSE(t.Record(Ok()));
  CHECK_FALSE(t.Record(Bad()));  // count restarts
  CHECK(t.consecutive_successes() == 0);
  CHECK_FALSE(t.Record(Ok()));
  CHECK_FALSE(t.Record(Ok()));
  CHECK(t.state() == Health::kUnhealthy);
  auto tr = t.Record(Ok());
  CheckMove(tr, Health::kUnhealthy, Health::kHealthy);
  CHECK(tr->cause == "3 consecutive probe successes");
}

TEST_CASE("hysteresis: an unknown engine is proven by one pass or condemned by N failures", "[probes]") {
  FakeClock clock;
  HealthTracker a(Opts(3, 2, Health::kUnknown), clock);
  auto up = a.Record(Ok());
  CheckMove(up, Health::kUnknown, Health::kHealthy);
  CHECK(up->cause == "first probe passed");

  HealthTracker b(Opts(3, 2, Health::kUnknown), clock);
  CHECK_FALSE(b.Record(Bad()));
  CHECK_FALSE(b.Record(Bad()));
  CHECK(b.state() == Health::kUnknown);
  auto down = b.Record(Bad());
  CheckMove(down, Health::kUnknown, Health::kUnhealthy);
}

TEST_CASE("hysteresis: jittered delays are bounded and reproducible from the seed", "[probes]") {
  FakeClock clock;
  HysteresisOptions o = Opts(3, 2);
  o.interval_ms = 1000;
  o.jitter_ms = 100;
  o.seed = 42;
  HealthTracker a(o, clock), b(o, clock);
  o.seed = 43;
  HealthTracker c(o, clock);
  std::vector<int64_t> da, db, dc;
  int64_t lo = INT64_MAX, hi = 0;
  for (int i = 0; i < 2000; ++i) {
    da.push_back(a.NextDelayMs());
    db.push_back(b.NextDelayMs());
    dc.push_back(c.NextDelayMs());
    lo = std::min(lo, da.back());
    hi = std::max(hi, da.back());
  }
  CHECK(da == db);
  CHECK(da != dc);
  CHECK(lo >= 1000);
  CHECK(hi <= 1100);
  CHECK(lo <= 1002);  // the whole range is used
  CHECK(hi >= 1098);
  std::set<int64_t> distinct(da.begin(), da.end());
  CHECK(distinct.size() > 90);

  o.jitter_ms = 0;
  HealthTracker flat(o, clock);
  for (int i = 0; i < 10; ++i) CHECK(flat.NextDelayMs() == 1000);
}

// A whole schedule on the fake clock: an engine that hangs at t=5000 is
// declared unhealthy after exactly `failures` probes, and recovers after
// `successes` good ones once it answers again.
TEST_CASE("hysteresis: detection and recovery times on a fake clock", "[probes]") {
  FakeClock clock(0);
  HysteresisOptions o = Opts(3, 2, Health::kUnknown);
  o.interval_ms = 500;
  o.jitter_ms = 0;
  HealthTracker t(o, clock);
  const int64_t hang_at = 5000, back_at = 9000, timeout = 200;
  std::vector<HealthTransition> seen;
  for (int i = 0; i < 40; ++i) {
    int64_t start = clock.MonotonicMs();
    bool hung = start >= hang_at && start < back_at;
    clock.AdvanceMs(hung ? timeout : 10);  // the probe's own duration
    if (auto tr = t.Record(hung ? ProbeOutcome{false, "timeout after 200 ms", timeout} : Ok())) seen.push_back(*tr);
    clock.AdvanceMs(t.NextDelayMs());
  }
  REQUIRE(seen.size() == 3);
  CHECK(seen[0].to == Health::kHealthy);
  CHECK(seen[0].at_ms == 10);
  CHECK(seen[1].to == Health::kUnhealthy);
  // Probes start every 510 ms while healthy; the first at/after 5000 starts at
  // 5100, then 5800 and 6500 (200 ms timeouts + 500 ms intervals).
  CHECK(seen[1].at_ms == 6500 + timeout);
  CHECK(seen[2].to == Health::kHealthy);
  CHECK(seen[2].at_ms >= back_at);
}

}  // namespace
}  // namespace wsup
