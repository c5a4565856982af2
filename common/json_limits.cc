#include "common/json_limits.h"

namespace wsup {

int JsonNestingDepth(std::string_view text, int stop_at) {
  int depth = 0;
  int deepest = 0;
  bool in_string = false;
  bool escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (++depth > deepest) {
        deepest = depth;
        if (deepest > stop_at) return deepest;
      }
    } else if ((c == '}' || c == ']') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

Status CheckJsonLimits(std::string_view text, std::string_view what, std::string_view fix, size_t max_bytes) {
  if (text.size() > max_bytes) {
    return InvalidArgument(std::string(what) + " is " + std::to_string(text.size()) +
                           " bytes of JSON, more than the limit of " + std::to_string(max_bytes) + " bytes; " +
                           std::string(fix));
  }
  if (JsonNestingDepth(text, kMaxJsonDepth) > kMaxJsonDepth) {
    return InvalidArgument(std::string(what) + " is JSON nested deeper than the limit of " +
                           std::to_string(kMaxJsonDepth) + " levels; " + std::string(fix));
  }
  return Status::Ok();
}

}  // namespace wsup
