#include "engine/engine_state.h"

namespace wsup::engine {
namespace {

using S = EngineState;
using E = EngineEvent;
using A = EngineAction;

// One row per transition; each (from, event) pair appears at most once
// (checked by a test).
constexpr EngineTransition kTable[] = {
    {S::kStarting, E::kLoaded, S::kReady, A::kStartServing},
    {S::kStarting, E::kStartupFailed, S::kStopping, A::kShutDown},
    {S::kStarting, E::kListenFailed, S::kStopping, A::kShutDown},
    {S::kStarting, E::kStop, S::kStopping, A::kShutDown},

    {S::kReady, E::kStop, S::kStopping, A::kShutDown},

    // A second signal changes nothing; the startup thread may finish (or
    // fail) after the stop began: the loop drops its news.
    {S::kStopping, E::kStop, S::kStopping, A::kNone},
    {S::kStopping, E::kLoaded, S::kStopping, A::kNone},
    {S::kStopping, E::kStartupFailed, S::kStopping, A::kNone},
};

}  // namespace

const char* EngineStateName(EngineState s) {
  switch (s) {
    case S::kStarting: return "starting";
    case S::kReady: return "ready";
    case S::kStopping: return "stopping";
  }
  return "?";
}

const char* EngineEventName(EngineEvent e) {
  switch (e) {
    case E::kLoaded: return "loaded";
    case E::kStartupFailed: return "startup_failed";
    case E::kListenFailed: return "listen_failed";
    case E::kStop: return "stop";
  }
  return "?";
}

const char* EngineActionName(EngineAction a) {
  switch (a) {
    case A::kNone: return "none";
    case A::kStartServing: return "start_serving";
    case A::kShutDown: return "shut_down";
  }
  return "?";
}

std::optional<EngineTransition> NextEngineTransition(EngineState state, EngineEvent event) {
  for (const auto& t : kTable) {
    if (t.from == state && t.event == event) return t;
  }
  return std::nullopt;
}

const EngineTransition* EngineTable(size_t* count) {
  *count = sizeof(kTable) / sizeof(kTable[0]);
  return kTable;
}

}  // namespace wsup::engine
