#include "engine/engine_state.h"

namespace wsup::engine {
namespace {

using S = EngineState;
using E = EngineEvent;
using A = EngineAction;

// The names, in the order of each enum's values (the logs' and tests' words).
constexpr EnumNames<S::kStopping> kStateNames{"starting", "ready", "stopping"};
constexpr EnumNames<E::kStop> kEventNames{"loaded", "startup_failed", "listen_failed", "stop"};
constexpr EnumNames<A::kShutDown> kActionNames{"none", "start_serving", "shut_down"};

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

const char* EngineStateName(EngineState s) { return kStateNames(s); }
const char* EngineEventName(EngineEvent e) { return kEventNames(e); }
const char* EngineActionName(EngineAction a) { return kActionNames(a); }

std::optional<EngineTransition> NextEngineTransition(EngineState state, EngineEvent event) {
  return FindRow(kTable, state, event);
}

const EngineTransition* EngineTable(size_t* count) { return AllRows(kTable, count); }

}  // namespace wsup::engine
