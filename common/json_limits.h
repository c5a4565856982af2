// The one bound on JSON that wsup reads from a socket or a file: how deeply
// it may nest, and how large it may be. Every parser on a network or socket
// path (the front's request path, its engine event relay and its control
// socket, the holder protocol, the engine's API, the supervisor's reading of
// engine status, the probes) and the checkpoint reader check a text here
// before nlohmann::json sees it.
//
// Why: nlohmann::json's parser keeps its own stack, but what it builds is a
// tree, and copying, dumping, comparing and (in older releases) destroying
// that tree recurse once per level. A 140 KB body that opens 70,000 brackets
// overflows the thread's stack in any of them (a SIGSEGV, not an exception).
// Real wsup messages nest 2 to 5 levels; model configs and safetensors
// headers a few more. 64 levels leaves room for any of them and keeps every
// walk over an accepted value a few kilobytes of stack.
//
// The scan is one pass over the bytes: brackets inside strings (with their
// escapes) do not count, and it is exact for every text the parser accepts
// and conservative for the rest (a stray closing bracket never lowers the
// depth below zero, so it cannot hide deeper nesting after it).
//
// Pure functions; any thread.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace wsup {

// The deepest nesting of arrays and objects accepted anywhere.
inline constexpr int kMaxJsonDepth = 64;
// The largest JSON text accepted where the caller has no tighter bound of
// its own (the holder protocol's message limit).
inline constexpr size_t kMaxJsonBytes = 16u << 20;

// The deepest bracket nesting of `text` outside strings, or, once it passes
// `stop_at`, stop_at + 1 (the scan ends there).
int JsonNestingDepth(std::string_view text, int stop_at = kMaxJsonDepth);

// Ok when `text` is at most `max_bytes` long and nests at most kMaxJsonDepth
// levels; otherwise an InvalidArgument naming `what` (such as "the request
// body" or "model/config.json"), the limit, and ending with `fix` (what the
// sender should do instead). Says nothing about whether the text is JSON.
Status CheckJsonLimits(std::string_view text, std::string_view what, std::string_view fix,
                       size_t max_bytes = kMaxJsonBytes);

// CheckJsonLimits, then the parse itself (never throws). A text that is not
// JSON is an InvalidArgument naming `what` and ending with `fix`. Json is
// nlohmann::json or nlohmann::ordered_json.
template <typename Json = nlohmann::json>
Result<Json> ParseJsonChecked(std::string_view text, std::string_view what, std::string_view fix,
                              size_t max_bytes = kMaxJsonBytes) {
  Status limits = CheckJsonLimits(text, what, fix, max_bytes);
  if (!limits.ok()) return limits.error();
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgument(std::string(what) + " is not valid JSON; " + std::string(fix));
  return j;
}

}  // namespace wsup
