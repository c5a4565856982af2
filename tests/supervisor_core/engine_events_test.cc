// EngineEventList (supervisor/engine_events.h): one publication reaches
// every subscriber in the order they subscribed, and a move published from
// inside a subscriber reaches everyone before the first goes on.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "supervisor/engine_events.h"

namespace wsup {
namespace {

EngineEvent Move(const std::string& slot, SlotState from, SlotEvent event, SlotState to, const std::string& cause) {
  return EngineEvent{slot, SlotTransition{from, event, to, SlotAction::kNone}, cause};
}

// A subscriber through the interface, as an owner of its own would be.
class Recorder final : public EngineEvents {
 public:
  Recorder(std::string name, std::vector<std::string>* seen) : name_(std::move(name)), seen_(seen) {}
  void OnEngineEvent(const EngineEvent& e) override {
    seen_->push_back(name_ + ":" + e.slot + ":" + SlotStateName(e.row.from) + "->" + SlotStateName(e.row.to) + ":" +
                     e.cause);
  }

 private:
  std::string name_;
  std::vector<std::string>* seen_;
};

TEST_CASE("engine events: every subscriber sees a move once, in the order they subscribed", "[engine_events]") {
  std::vector<std::string> seen;
  Recorder pool("pool", &seen), rollout("rollout", &seen);
  EngineEventList list;
  list.Subscribe("pool", &pool);
  list.Subscribe("routes", [&](const EngineEvent& e) { seen.push_back("routes:" + e.slot); });
  list.Subscribe("rollout", &rollout);
  list.Subscribe("ledger", [&](const EngineEvent& e) {
    seen.push_back("ledger:" + e.slot + ":" + SlotEventName(e.row.event));
  });
  CHECK(list.Names() == std::vector<std::string>{"pool", "routes", "rollout", "ledger"});

  list.Publish(Move("a", SlotState::kStandby, SlotEvent::kPromote, SlotState::kActive, "no active engine"));
  CHECK(seen == std::vector<std::string>{"pool:a:standby->active:no active engine", "routes:a",
                                         "rollout:a:standby->active:no active engine", "ledger:a:promote"});
}

TEST_CASE("engine events: a move made by a subscriber is published whole before the first one goes on",
          "[engine_events]") {
  // A failover: the active slot fails, and the action (the second
  // subscriber) promotes the standby from inside that move.
  std::vector<std::string> seen;
  EngineEventList list;
  list.Subscribe("pool", [&](const EngineEvent& e) { seen.push_back("pool:" + e.slot); });
  list.Subscribe("action", [&](const EngineEvent& e) {
    seen.push_back("action:" + e.slot);
    if (e.slot == "a") list.Publish(Move("b", SlotState::kStandby, SlotEvent::kPromote, SlotState::kActive, "failover"));
  });
  list.Subscribe("routes", [&](const EngineEvent& e) { seen.push_back("routes:" + e.slot); });
  list.Subscribe("ledger", [&](const EngineEvent& e) { seen.push_back("ledger:" + e.slot); });

  list.Publish(Move("a", SlotState::kActive, SlotEvent::kProbeTrip, SlotState::kFailed, "probe"));
  CHECK(seen == std::vector<std::string>{"pool:a", "action:a", "pool:b", "action:b", "routes:b", "ledger:b",
                                         "routes:a", "ledger:a"});
}

TEST_CASE("engine events: a list with no subscriber takes a publication and does nothing", "[engine_events]") {
  EngineEventList list;
  list.Publish(Move("a", SlotState::kIdle, SlotEvent::kSpawn, SlotState::kStarting, "start"));
  CHECK(list.Names().empty());
}

}  // namespace
}  // namespace wsup
