// Control routes: who may call an engine's /wsup/... routes.
//
// An engine's control routes (GET /wsup/status, POST /wsup/role) are the
// supervisor's alone: /wsup/role decides which engine writes the node's KV
// pool, and a client that could set it would make two engines write one
// pool. The supervisor makes a fresh secret for every engine start and hands
// it over in the engine's environment (kControlTokenEnv; an environment is
// readable only by its own uid and root, never through /proc by another
// user); the engine then answers a control route only to a request that
// carries it as "Authorization: Bearer TOKEN". The secret is never shown in
// /wsup/status, logs or the supervisor's status; the supervisor keeps it in
// its 0600 state.json so that a restarted supervisor can still talk to the
// engines it adopts. (docs/architecture.md, "Trust model".)
//
// Any thread; pure functions.
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"
#include "http/request.h"

namespace wsup::http {

// The environment variable that carries an engine's control token.
inline constexpr const char* kControlTokenEnv = "WSUP_CONTROL_TOKEN";

// The header a control request carries: {"Authorization", "Bearer TOKEN"}.
Header ControlAuthHeader(const std::string& token);

// Whether the request may use a control route of an engine started with
// `token`. An empty token (an engine started by hand, outside a supervisor)
// admits every request. The comparison takes the same time wherever the
// first difference lies. On refusal, the error says what to send, never the
// token.
Status CheckControlAuth(const HttpRequest& request, std::string_view token);

// Whether `path` names a control route (/wsup and everything under it).
bool IsControlPath(std::string_view path);

}  // namespace wsup::http
