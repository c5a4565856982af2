#include "checkpoint/json_text.h"

#include <cstdint>

#include "common/json_limits.h"

namespace wsup::checkpoint_text {

using json = nlohmann::json;

namespace {

// Writes at most about `limit` characters of v. Each level of nesting adds a
// character before recursing, so the recursion is as shallow as the limit.
void Brief(const json& v, std::string& out, size_t limit) {
  if (out.size() > limit) return;
  if (v.is_array() || v.is_object()) {
    out += v.is_array() ? '[' : '{';
    bool first = true;
    for (auto it = v.begin(); it != v.end() && out.size() <= limit; ++it) {
      if (!first) out += ',';
      first = false;
      if (v.is_object()) out += json(it.key()).dump(-1, ' ', false, json::error_handler_t::replace) + ':';
      Brief(*it, out, limit);
    }
    out += v.is_array() ? ']' : '}';
    return;
  }
  out += v.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace

// Shortens what a header or config says before quoting it in a message, so a
// hostile file cannot fill a log line.
// Built by appending: GCC 12 at -O3 warns (-Wrestrict, a false positive) on
// the inlined `"'" + std::string(name)`, and the Release build treats that
// warning as an error.
std::string QuoteTensor(std::string_view name) {
  std::string s;
  s.reserve(name.size() + 2);
  s += '\'';
  s += name;
  s += '\'';
  return s;
}

std::string Quote(const json& v) {
  std::string s;
  Brief(v, s, 80);
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

// Real headers and configs nest a few levels; refusing deep nesting before
// parsing (common/json_limits.h) keeps every later walk over the value (dump,
// compare, destroy) shallow whatever the input. Sizes are bounded by the
// readers (kMaxConfigBytes, the header length check), with their own messages.
Status CheckDepth(std::string_view text, const std::string& what, const std::string& fix) {
  Status limits = CheckJsonLimits(text, what, fix, SIZE_MAX);
  if (!limits.ok()) return Corrupt(limits.error().message());
  return Status::Ok();
}

}  // namespace wsup::checkpoint_text
