// EngineEvents: a move of an engine slot's table (engine_fsm.h), published
// once to the parts of the supervisor that care, instead of each being
// called by hand where the move is made.
//
// A publication is one EngineEvent: the slot, the row taken (from, event,
// to, action) and its cause. Subscribers see it in the order they
// subscribed, which is the order of their effects: the owner subscribes
// them in that order once, at construction (Node::
// SubscribeToEngines, node_wiring.cc, lists the node's). A subscriber may move a slot
// again while it is told of a move (a failover promotes the standby from
// inside the failed slot's move); that move is published at once, to every
// subscriber, before the first publication goes on to the next subscriber:
// depth first, as nested calls would be.
//
// Subscribers are not removed: each lives as long as the list (members of
// the same owner). Pure: no I/O. Loop thread only.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "supervisor/engine_fsm.h"

namespace wsup {

struct EngineEvent {
  std::string slot;   // "a" or "b"
  SlotTransition row; // from, event, to, action
  std::string cause;
};

// What a subscriber implements.
class EngineEvents {
 public:
  virtual ~EngineEvents() = default;
  virtual void OnEngineEvent(const EngineEvent& e) = 0;
};

class EngineEventList {
 public:
  // Adds a subscriber after those already there; `name` says who it is
  // (logs, tests).
  void Subscribe(std::string name, EngineEvents* subscriber);
  void Subscribe(std::string name, std::function<void(const EngineEvent&)> fn);
  // Tells every subscriber, in order.
  void Publish(const EngineEvent& e) const;
  // The subscribers' names, in order.
  std::vector<std::string> Names() const;

 private:
  struct Entry {
    std::string name;
    std::function<void(const EngineEvent&)> fn;
  };
  std::vector<Entry> entries_;
};

}  // namespace wsup
