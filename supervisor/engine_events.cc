// Publication of engine slot moves (engine_events.h).
#include "supervisor/engine_events.h"

namespace wsup {

void EngineEventList::Subscribe(std::string name, EngineEvents* subscriber) {
  entries_.push_back({std::move(name), [subscriber](const EngineEvent& e) { subscriber->OnEngineEvent(e); }});
}

void EngineEventList::Subscribe(std::string name, std::function<void(const EngineEvent&)> fn) {
  entries_.push_back({std::move(name), std::move(fn)});
}

void EngineEventList::Publish(const EngineEvent& e) const {
  // By index: the list is not changed while it publishes, and a nested
  // Publish from a subscriber reads the same list.
  for (size_t i = 0; i < entries_.size(); ++i) entries_[i].fn(e);
}

std::vector<std::string> EngineEventList::Names() const {
  std::vector<std::string> names;
  names.reserve(entries_.size());
  for (const auto& entry : entries_) names.push_back(entry.name);
  return names;
}

}  // namespace wsup
