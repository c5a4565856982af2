// Which request paths the front forwards to an engine.
//
// Only the OpenAI API (/v1/...) and /health reach the engines through the
// front. Everything else, the engines' control routes (/wsup/status,
// /wsup/role) above all, is answered 404 by the front itself: those routes
// are the supervisor's (docs/architecture.md, "Trust model"), and a client
// of the node must not be able to read an engine's internals or set its
// role, even where the engine would check a token of its own.
//
// Pure; any thread.
#pragma once

#include <string_view>

namespace wsup::front {

// Whether a request for `path` (the target up to '?') is forwarded: "/health",
// or "/v1/" followed by a path without "." or ".." segments (a dot segment
// could be resolved by something behind the front into a path outside /v1).
bool IsForwardedPath(std::string_view path);

// The 404 body's message for a path that is not forwarded.
inline constexpr const char* kNotForwardedMessage =
    "no such route at the front; it serves the OpenAI API (/v1/...) and /health";

}  // namespace wsup::front
