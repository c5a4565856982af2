// EngineStateTable: the life of one wsup-engine process as an explicit
// state x event table, as GET /wsup/status and /health report it.
//
// Every change of the engine's state is one row of kTable
// (engine_state.cc), and each row is tested (tests/engine/
// engine_state_test.cc). The table is pure: it names the next state and
// what the engine must do; the loop thread (engine/engine_server.cc) does
// it.
//
//   starting --loaded--> ready [start_serving]
//   starting --startup_failed | listen_failed--> stopping [shut_down]
//   starting | ready --stop--> stopping [shut_down]
//   stopping --stop | loaded | startup_failed--> stopping (late news: dropped)
//
// The names ("starting", "ready", "stopping") are the status contract.
//
// Thread-safety: none; the engine's state belongs to its loop thread.
#pragma once

#include <cstddef>
#include <optional>

#include "common/state_table.h"

namespace wsup::engine {

enum class EngineState {
  kStarting,  // the API answers; the startup thread loads the model
  kReady,     // the scheduler serves completions
  kStopping,  // a signal or a fatal error: the server closes, the loop ends
};

enum class EngineEvent {
  kLoaded,         // the startup thread finished every phase
  kStartupFailed,  // a startup phase failed (the exit code comes from its error)
  kListenFailed,   // the HTTP socket could not be bound
  kStop,           // SIGTERM or SIGINT
};

enum class EngineAction {
  kNone,
  kStartServing,  // start the scheduler, print the phases, tell --ready-fd
  kShutDown,      // stop the scheduler, close the server and the loop's handles
};

const char* EngineStateName(EngineState s);  // the status contract's values
const char* EngineEventName(EngineEvent e);
const char* EngineActionName(EngineAction a);
inline constexpr TableNames<EngineState, EngineEvent, EngineAction> kEngineNames{
    EngineStateName, EngineEventName, EngineActionName};

using EngineTransition = TableRow<EngineState, EngineEvent, EngineAction>;

// nullopt: the event cannot happen in that state (a bug in the caller,
// which logs it and keeps its state).
std::optional<EngineTransition> NextEngineTransition(EngineState state, EngineEvent event);

// The whole table, for tests.
const EngineTransition* EngineTable(size_t* count);

}  // namespace wsup::engine
