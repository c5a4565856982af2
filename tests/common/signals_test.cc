// Signals (common/signals.h) with real signals raised at this process: the
// handler runs on the loop, not in signal context; Close() frees every
// handle (the loop then closes clean) and runs done after the last; a
// stopped watcher no longer catches its signal.
#include <catch2/catch.hpp>
#include <signal.h>
#include <uv.h>

#include <vector>

#include "common/signals.h"

namespace wsup {
namespace {

// A loop with a guard timer: a test that waits for a signal's handler runs
// the loop until the handler ran or the guard fired (5 s), never longer.
struct LoopRig {
  uv_loop_t loop{};
  uv_timer_t guard{};
  bool guard_fired = false;
  LoopRig() {
    uv_loop_init(&loop);
    uv_timer_init(&loop, &guard);
    guard.data = this;
  }
  ~LoopRig() {
    uv_close(reinterpret_cast<uv_handle_t*>(&guard), nullptr);
    uv_run(&loop, UV_RUN_DEFAULT);
    CHECK(uv_loop_close(&loop) == 0);  // every handle was freed
  }
  template <typename Cond>
  bool RunUntil(Cond cond) {
    guard_fired = false;
    uv_timer_start(&guard, [](uv_timer_t* t) { static_cast<LoopRig*>(t->data)->guard_fired = true; }, 5000, 0);
    while (!cond() && !guard_fired) uv_run(&loop, UV_RUN_ONCE);
    uv_timer_stop(&guard);
    return cond();
  }
};

TEST_CASE("signals: each handler of a raised signal runs on the loop", "[common][signals]") {
  LoopRig rig;
  std::vector<int> seen;
  {
    Signals signals(&rig.loop);
    signals.On(SIGUSR1, [&](int sig) { seen.push_back(sig); });
    signals.On(SIGUSR2, [&](int sig) { seen.push_back(sig); });
    signals.On(SIGUSR2, [&](int sig) { seen.push_back(-sig); });
    CHECK(signals.open() == 3);
    REQUIRE(::raise(SIGUSR1) == 0);
    CHECK(seen.empty());  // not in signal context: only when the loop runs
    REQUIRE(rig.RunUntil([&] { return seen.size() == 1; }));
    CHECK(seen == std::vector<int>{SIGUSR1});
    REQUIRE(::raise(SIGUSR2) == 0);
    REQUIRE(rig.RunUntil([&] { return seen.size() == 3; }));
    bool done = false;
    signals.Close([&] { done = true; });
    CHECK(signals.open() == 0);
    CHECK_FALSE(done);
    REQUIRE(rig.RunUntil([&] { return done; }));
  }
}

TEST_CASE("signals: the destructor closes what is open, and Close with nothing open is done at once",
          "[common][signals]") {
  LoopRig rig;
  {
    Signals signals(&rig.loop);
    signals.On(SIGUSR1, [](int) {});
  }  // the loop's close (~LoopRig) fails if the handle was left open
  Signals none(&rig.loop);
  bool done = false;
  none.Close([&] { done = true; });
  CHECK(done);
}

TEST_CASE("signals: a stopped watcher's signal is not handled", "[common][signals]") {
  LoopRig rig;
  int usr1 = 0, usr2 = 0;
  Signals signals(&rig.loop);
  signals.On(SIGUSR1, [&](int) { ++usr1; });
  Signals marker(&rig.loop);
  marker.On(SIGUSR2, [&](int) { ++usr2; });
  signals.Stop();
  // Stopped, SIGUSR1 has its default action again (it would end this
  // process): ignore it for the raise below, which must reach no handler.
  struct sigaction old {};
  struct sigaction ign {};
  ign.sa_handler = SIG_IGN;
  REQUIRE(::sigaction(SIGUSR1, &ign, &old) == 0);
  REQUIRE(::raise(SIGUSR1) == 0);
  REQUIRE(::raise(SIGUSR2) == 0);
  // The marker's handler proves the loop ran past both signals.
  REQUIRE(rig.RunUntil([&] { return usr2 == 1; }));
  CHECK(usr1 == 0);
  signals.Close();
  marker.Close();
  ::sigaction(SIGUSR1, &old, nullptr);
}

}  // namespace
}  // namespace wsup
