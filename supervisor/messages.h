// What the supervisor reads from other processes, typed: the `wsup` CLI's
// requests on its control socket (wsup.sock), the front's messages on the
// front's control socket (its events, its status replies) and an engine's
// GET /wsup/status. Each parser reads every field through the checked
// accessors of common/json_fields.h and returns the typed message or an
// Error naming the field, the type it has and the type it needs; none
// throws, whatever the JSON. The loop acts only on what a parser returned,
// so no message can end the supervisor (fuzz/control_fuzz.cc feeds them
// arbitrary frames).
//
// Fields a message does not need are ignored (a newer peer may add some);
// a field that is there must have its type.
//
// Pure functions; any thread.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace wsup {

// ---- the control socket (the `wsup` CLI)

struct ControlRequest {
  enum class Kind { kStatus, kFailover, kReload, kStop };
  Kind kind = Kind::kStatus;
  // failover: SIGKILL the active engine instead of a planned swap. Only
  // drills can be asked for ({"drill": true}); anything else is refused.
  bool kill = false;
  // reload: `wsup reload --set` overrides, "section.key=value" each (the
  // config's own checks judge their keys and values).
  std::vector<std::string> set;
};

// {"type": "status" | "stop"}, {"type": "reload", "set": [STRING, ...]}
// (set optional) or {"type": "failover", "drill": true, "kill": BOOL}. An
// error says what is wrong and what to send.
Result<ControlRequest> ParseControlRequest(const nlohmann::json& msg);

// ---- the front's control socket

// True when `m` is an event the front pushes to every client
// ({"type": "event"}), not the reply to a request.
bool IsFrontEvent(const nlohmann::json& m);

// A message from the front on the supervisor's link to it.
struct FrontMessage {
  enum class Kind {
    kSwitched,   // event: it moved the traffic from `from` to `to` by itself (`reason`)
    kSilent,     // event: requests on `backend` got no byte for `after_ms`
    kFirstOk,    // event: the first correct answer from `backend` after a route change, at `at_ms`
    kCut,        // reply to engine_dead: `cut` requests sent on
    kRoutesAck,  // reply to set_routes
    kOther,      // anything else (replies that need nothing done, newer events)
  };
  Kind kind = Kind::kOther;
  std::string from, to, reason;
  std::string backend;
  int64_t at_ms = 0;  // 0: not given
  int64_t silent = 0, inflight = 0, after_ms = 0, last_byte_ms = 0;
  int64_t cut = 0;
};
Result<FrontMessage> ParseFrontMessage(const nlohmann::json& m);

// The front's status reply: how many requests it still has on the engine
// at `address` (HOST:PORT); 0 when it lists none.
Result<int64_t> FrontInflight(const nlohmann::json& status, const std::string& address);

// The front's status reply, read by a restarted supervisor: the switches
// it made by itself (its kept `switched` events, oldest first) and when
// each engine it lists first failed.
struct FrontLog {
  struct Switch {
    std::string from, to, reason;
    int64_t at_ms = 0;
  };
  std::vector<Switch> switches;
  std::map<std::string, int64_t> failed_at_ms;  // by HOST:PORT; absent or 0: never
};
Result<FrontLog> ParseFrontLog(const nlohmann::json& status);

// ---- an engine's GET /wsup/status (the fields the supervisor acts on)

struct EngineStatus {
  std::string state;              // "ready" once it serves; "" when not given
  std::optional<bool> comm_warm;  // comm.warm
  // weights: where this start's weights came from.
  struct Weights {
    std::string mode;         // "" when not given
    std::string source;       // holder, published, disk, ...
    std::string miss_reason;  // "" when not given
    std::optional<int64_t> ms;
    std::string diffs_json;   // the fingerprint differences as JSON; "" when none
  };
  std::optional<Weights> weights;
};
Result<EngineStatus> ParseEngineStatus(const nlohmann::json& status);

}  // namespace wsup
