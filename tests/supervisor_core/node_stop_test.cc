// NodeStop (supervisor/node_stop.h) on its own: the children, state.json and
// the handles behind its hooks, the flush pause on fake timers. Each test
// checks what was done, in which order, and how many times.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "supervisor/node_stop.h"
#include "tests/fake_timers.h"

namespace wsup {
namespace {

using testing::FakeTimers;

struct StopRig {
  FakeClock clock;
  FakeTimers timers{&clock};
  int children = 2;  // child processes still running
  std::vector<std::string> done;  // "stop: why", "remove", "close", "answer N"
  NodeStop stop{timers, NodeStop::Hooks{[this](const std::string& why) { done.push_back("stop: " + why); },
                                        [this] { return children > 0; }, [this] { done.push_back("remove"); },
                                        [this] { done.push_back("close"); }}};
  // A child exits and tells the node.
  void Exit() {
    --children;
    stop.ChildExited();
  }
};

TEST_CASE("node stop: the first cause wins, the children are told once, and the stop finishes after the last exit",
          "[supervisor][node_stop]") {
  StopRig r;
  r.Exit();  // an exit before any stop finishes nothing
  CHECK_FALSE(r.stop.stopping());
  CHECK(r.done.empty());
  r.children = 2;
  r.stop.Begin("engine a: its configuration cannot work", 78);
  r.stop.Begin("SIGTERM", 0);
  CHECK(r.stop.stopping());
  CHECK(r.stop.exit_code() == 78);
  CHECK(r.done == std::vector<std::string>{"stop: engine a: its configuration cannot work"});
  r.Exit();
  CHECK_FALSE(r.stop.finishing());
  r.Exit();
  CHECK(r.stop.finishing());
  CHECK(r.done.back() == "remove");
  // The handles close after the flush pause, once, however many exits are
  // told after the last.
  r.stop.ChildExited();
  r.timers.Advance(NodeStop::kFlushMs - 1);
  CHECK_FALSE(r.stop.finished());
  r.timers.Advance(1);
  CHECK(r.stop.finished());
  CHECK(r.done == std::vector<std::string>{"stop: engine a: its configuration cannot work", "remove", "close"});
  r.timers.Advance(1000);
  CHECK(r.done.size() == 3);
}

TEST_CASE("node stop: the callers of `wsup stop` are answered after the last child is gone, before the handles close, "
          "and one that asks late is answered at once",
          "[supervisor][node_stop]") {
  StopRig r;
  r.stop.OnStopped([&r] { r.done.push_back("answer 1"); });
  r.stop.Begin("wsup stop", 0);
  r.stop.OnStopped([&r] { r.done.push_back("answer 2"); });
  r.Exit();
  CHECK(r.done == std::vector<std::string>{"stop: wsup stop"});
  r.Exit();
  CHECK(r.done == std::vector<std::string>{"stop: wsup stop", "remove", "answer 1", "answer 2"});
  r.stop.OnStopped([&r] { r.done.push_back("answer 3"); });
  CHECK(r.done.back() == "answer 3");
  r.timers.Advance(NodeStop::kFlushMs);
  CHECK(r.done.back() == "close");
  CHECK(r.stop.exit_code() == 0);
}

TEST_CASE("node stop: a node with no child running finishes at once", "[supervisor][node_stop]") {
  StopRig r;
  r.children = 0;
  r.stop.Begin("SIGINT", 0);
  CHECK(r.stop.finishing());
  CHECK(r.done == std::vector<std::string>{"stop: SIGINT", "remove"});
  r.timers.Advance(NodeStop::kFlushMs);
  CHECK(r.stop.finished());
}

}  // namespace
}  // namespace wsup
