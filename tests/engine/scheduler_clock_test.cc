// The scheduler's timed decisions on a fake clock (engine/clock.h): the
// keepalive, a resumed request's wait for the pool, and the shortest step
// happen when the clock says so, with no real time in between. Each test
// proves that the scheduler went round its loop at a given time by running
// a request to its end at that time.
#include <catch2/catch.hpp>

#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "checkpoint/checkpoint.h"
#include "engine/clock.h"
#include "engine/runner.h"
#include "engine/scheduler.h"
#include "tests/engine/tiny_runner.h"
#include "testkit/test_util.h"

using namespace std::chrono_literals;
using namespace wsup;
using namespace wsup::engine;

namespace {

constexpr uint64_t kBlock = 32768;  // llama-tiny-f32: one block of 16 positions

using testing::TinyRunner;

struct Outcomes {
  std::mutex mu;
  std::map<uint64_t, size_t> tokens;
  std::map<uint64_t, std::string> finish;
  Scheduler::Sink Sink() {
    return [this](std::vector<GenEvent> events) {
      std::lock_guard<std::mutex> lk(mu);
      for (auto& e : events) {
        tokens[e.id] += e.tokens.size();
        if (e.done) finish[e.id] = e.error ? "error: " + e.error->message() : e.finish_reason;
      }
    };
  }
  bool Done(uint64_t id) {
    std::lock_guard<std::mutex> lk(mu);
    return finish.count(id) > 0;
  }
  std::string Finish(uint64_t id) {
    std::lock_guard<std::mutex> lk(mu);
    return finish[id];
  }
  size_t Tokens(uint64_t id) {
    std::lock_guard<std::mutex> lk(mu);
    return tokens[id];
  }
};

GenRequest Req(uint64_t id, int max_tokens) {
  GenRequest g;
  g.id = id;
  g.prompt = {104, 105};  // "hi"
  g.max_tokens = max_tokens;
  return g;
}

// Runs a one-token request to its end: the scheduler has gone round its
// loop at the clock's present time.
void Round(Scheduler& s, Outcomes& out, uint64_t id) {
  REQUIRE(s.Submit(Req(id, 1)).ok());
  REQUIRE(test::WaitFor([&] { return out.Done(id); }, 30s));
}

}  // namespace

TEST_CASE("engine clock: a fake clock's waiter wakes when the clock reaches its deadline, not before") {
  FakeEngineClock clock(5'000);
  CHECK(clock.NowMs() == 5'000);
  std::mutex mu;
  std::condition_variable cv;
  bool woke = false;
  std::thread waiter([&] {
    std::unique_lock<std::mutex> lk(mu);
    while (clock.NowMs() < 5'100) clock.WaitUntilMs(cv, lk, 5'100);
    woke = true;
  });
  clock.AdvanceMs(99);
  {
    std::unique_lock<std::mutex> lk(mu);
    CHECK_FALSE(woke);
  }
  clock.AdvanceMs(1);
  waiter.join();
  CHECK(woke);
  CHECK(clock.NowUs() == 5'100'000);
  // A deadline already passed returns at once.
  std::unique_lock<std::mutex> lk(mu);
  clock.WaitUntilMs(cv, lk, 5'000);
}

TEST_CASE("scheduler clock: the keepalive runs when its clock says so") {
  REQUIRE(test::HaveTestData("llama-tiny-f32"));
  auto runner = TinyRunner();
  REQUIRE(runner->AllocateKv(1 << 20, 16).ok());
  FakeEngineClock clock(1'000'000);
  Outcomes out;
  SchedulerOptions so;
  so.keepalive_ms = 1000;
  Scheduler s(runner.get(), so, out.Sink(), clock);
  s.Start();
  Round(s, out, 1);
  CHECK(s.stats().keepalives == 0);
  CHECK(s.stats().last_keepalive_mono_ms == 1'000'000);  // proven at startup, at the clock's time
  for (uint64_t period = 1; period <= 2; ++period) {
    INFO("period " << period);
    clock.AdvanceMs(999);
    Round(s, out, period + 1);
    CHECK(s.stats().keepalives == period - 1);
    // Idle now: the advance alone wakes it.
    clock.AdvanceMs(1);
    REQUIRE(test::WaitFor([&] { return s.stats().keepalives == period; }, 30s));
    CHECK(s.stats().last_keepalive_mono_ms == 1'000'000 + 1'000 * static_cast<int64_t>(period));
    CHECK(s.stats().last_keepalive_us == 0);  // no time passed on the clock while it ran
    CHECK(s.stats().keepalive_failures == 0);
  }
}

TEST_CASE("scheduler clock: a resume waits for the pool until adopt_wait_ms has passed on its clock") {
  REQUIRE(test::HaveTestData("llama-tiny-f32"));
  auto runner = TinyRunner();
  // A pooled cache whose pool never opens: 4 scratch blocks.
  REQUIRE(runner->AllocatePooledKv({{1 << 20}}, 4 * kBlock, 16).ok());
  FakeEngineClock clock;
  Outcomes out;
  SchedulerOptions so;
  so.adopt_wait_ms = 200;
  Scheduler s(runner.get(), so, out.Sink(), clock);
  s.Start();
  GenRequest resumed = Req(1, 4);
  resumed.request_id = "cut-stream-1";
  resumed.resumed = true;
  REQUIRE(s.Submit(resumed).ok());
  REQUIRE(test::WaitFor([&] { return s.stats().resume_held == 1; }, 30s));
  clock.AdvanceMs(199);
  Round(s, out, 2);  // went round at +199 ms: still held
  CHECK(s.stats().resume_held == 1);
  CHECK(out.Tokens(1) == 0);
  clock.AdvanceMs(1);
  REQUIRE(test::WaitFor([&] { return out.Done(1); }, 30s));
  CHECK(out.Finish(1) == "length");
  CHECK(out.Tokens(1) == 4);
  const SchedulerStats st = s.stats();
  CHECK(st.resume_held == 0);
  CHECK(st.resume_held_total == 1);
  CHECK(st.resume_held_max_ms == 200);
  CHECK(st.recomputed_reasons == std::map<std::string, uint64_t>{{"pool_not_granted", 1}});
}

TEST_CASE("scheduler clock: min_step_ms holds the next step until its clock has moved") {
  REQUIRE(test::HaveTestData("llama-tiny-f32"));
  auto runner = TinyRunner();
  REQUIRE(runner->AllocateKv(1 << 20, 16).ok());
  FakeEngineClock clock;
  Outcomes out;
  SchedulerOptions so;
  so.min_step_ms = 3'600'000;  // an hour: only the fake clock can end a step's wait
  so.keepalive_ms = 10 * so.min_step_ms;
  Scheduler s(runner.get(), so, out.Sink(), clock);
  s.Start();
  REQUIRE(s.Submit(Req(1, 2)).ok());
  REQUIRE(test::WaitFor([&] { return out.Tokens(1) == 1; }, 30s));
  CHECK(s.stats().steps == 1);
  clock.AdvanceMs(so.min_step_ms - 1);
  CHECK(s.stats().steps == 1);
  clock.AdvanceMs(1);
  REQUIRE(test::WaitFor([&] { return out.Done(1); }, 30s));
  CHECK(out.Tokens(1) == 2);
  // The step that ended it is held too; then, Stop() ends a step's wait at
  // once, whatever the clock says.
  clock.AdvanceMs(so.min_step_ms);
  REQUIRE(s.Submit(Req(2, 5)).ok());
  REQUIRE(test::WaitFor([&] { return out.Tokens(2) >= 1; }, 30s));
  s.Stop();
  CHECK_FALSE(out.Done(2));
}

// A scheduler that makes one step each time the test says so: min_step_ms
// is an hour, and only the fake clock ends a step's wait.
struct SteppedScheduler {
  explicit SteppedScheduler(int max_step_tokens) : runner(TinyRunner()) {
    REQUIRE(runner->AllocateKv(1 << 20, 16).ok());
    SchedulerOptions so;
    so.max_step_tokens = max_step_tokens;
    so.min_step_ms = kHour;
    so.keepalive_ms = 10 * kHour;
    s = std::make_unique<Scheduler>(runner.get(), so, out.Sink(), clock);
    s->Start();
  }
  ~SteppedScheduler() { s->Stop(); }
  // Lets step n run (the first runs as soon as there is work), and waits
  // until it has.
  void Step(uint64_t n) {
    if (n > 1) clock.AdvanceMs(kHour);
    REQUIRE(test::WaitFor([&] { return s->stats().steps == n; }, 30s));
  }
  static constexpr int64_t kHour = 3'600'000;
  std::unique_ptr<ModelRunner> runner;
  FakeEngineClock clock;
  Outcomes out;
  std::unique_ptr<Scheduler> s;
};

TEST_CASE("scheduler clock: a probe is admitted ahead of the queue and its prompt goes first in the next step") {
  REQUIRE(test::HaveTestData("llama-tiny-f32"));
  SteppedScheduler t(8);
  // A prompt of 40 tokens: five steps of prefill at 8 a step.
  GenRequest longer = Req(1, 1);
  longer.prompt.assign(40, 104);
  REQUIRE(t.s->Submit(longer).ok());
  t.Step(1);
  // A plain request, then a probe, come while it is prefilled.
  REQUIRE(t.s->Submit(Req(2, 1)).ok());
  GenRequest probe = Req(3, 1);
  probe.probe = true;
  REQUIRE(t.s->Submit(probe).ok());
  t.Step(2);
  // The probe's prompt went in that very step and it is answered; the
  // plain request, come before it, still waits for the long prompt.
  CHECK(t.out.Done(3));
  CHECK(t.out.Finish(3) == "length");
  CHECK(t.out.Tokens(2) == 0);
  CHECK_FALSE(t.out.Done(1));
  CHECK(t.s->stats().probes == 1);
}

TEST_CASE("scheduler clock: while a probe runs, other prompts get 16 tokens a step, running streams their tokens") {
  REQUIRE(test::HaveTestData("llama-tiny-f32"));
  SteppedScheduler t(64);
  // A running stream, then a prompt of 400 tokens.
  REQUIRE(t.s->Submit(Req(1, 20)).ok());
  t.Step(1);
  GenRequest longer = Req(2, 1);
  longer.prompt.assign(400, 104);
  REQUIRE(t.s->Submit(longer).ok());
  t.Step(2);  // 64 of its tokens
  // A probe of 4 tokens: its 4 steps (3 to 6) take 16 of the long prompt's
  // tokens each; then 64 a step again: 400 = 64 + 4 x 16 + 4 x 64 + 16, its
  // answer at step 11. Without the probe's share it would come at step 8.
  GenRequest probe = Req(3, 4);
  probe.probe = true;
  REQUIRE(t.s->Submit(probe).ok());
  for (uint64_t step = 3; step <= 11; ++step) {
    INFO("step " << step);
    t.Step(step);
    CHECK(t.out.Tokens(1) == step);  // the stream's token in every step
    CHECK(t.out.Done(3) == (step >= 6));
    CHECK(t.out.Done(2) == (step == 11));
  }
}
