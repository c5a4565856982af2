// NodeHealth (supervisor/node_health.h): the node's state from the facts the
// test sets, and what systemd is told.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "supervisor/node_health.h"

namespace wsup {
namespace {

struct HealthRig {
  NodeHealth::Facts facts;
  std::vector<std::string> status, ready;
  NodeHealth health{NodeHealth::Hooks{[this] { return facts; },
                                      [this](const std::string& line) { status.push_back(line); },
                                      [this](const std::string& line) { ready.push_back(line); }}};
  HealthRig() { facts.slots = {{"a", "starting"}, {"b", "starting"}}; }
};

TEST_CASE("node health: starting, serving, degraded without an active engine once it served, stopping",
          "[supervisor][node_health]") {
  HealthRig r;
  CHECK(r.health.State() == "starting");
  CHECK(r.health.StatusLine() == "starting: no active engine, a starting, b starting");
  r.facts.active = "a";
  r.facts.slots = {{"a", "active"}, {"b", "standby"}};
  CHECK(r.health.State() == "serving");
  r.health.Serving("serving: proven");
  r.facts.active.clear();
  r.facts.slots = {{"a", "failed"}, {"b", "starting"}};
  CHECK(r.health.State() == "degraded");
  CHECK(r.health.StatusLine() == "degraded: no active engine, a failed, b starting");
  r.facts.stopping = true;
  CHECK(r.health.State() == "stopping");
}

TEST_CASE("node health: READY=1 is sent once, on the first proof", "[supervisor][node_health]") {
  HealthRig r;
  CHECK_FALSE(r.health.served());
  r.health.Serving("serving: the active engine answered the probe through the front");
  r.health.Serving("serving (re-adopted)");
  CHECK(r.health.served());
  CHECK(r.ready == std::vector<std::string>{"serving: the active engine answered the probe through the front"});
}

TEST_CASE("node health: a degraded cause stays, is shown at once, and wins over serving", "[supervisor][node_health]") {
  HealthRig r;
  r.facts.active = "b";
  r.facts.slots = {{"a", "failed"}, {"b", "active"}};
  r.facts.front_crash_looping = true;
  r.health.SetDegraded("holder 0 gave up after 5 restarts");
  CHECK(r.health.degraded());
  CHECK(r.health.degraded_reason() == "holder 0 gave up after 5 restarts");
  CHECK(r.health.State() == "degraded");
  REQUIRE(r.status.size() == 1);
  CHECK(r.status[0] ==
        "degraded: active b, a failed, b active, front crash-looping (holder 0 gave up after 5 restarts)");
  r.health.Serving("serving: proven");
  CHECK(r.health.State() == "degraded");
  r.health.Update();
  CHECK(r.status.size() == 2);
  CHECK(r.status[1] == r.status[0]);
}

}  // namespace
}  // namespace wsup
