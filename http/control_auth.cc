#include "http/control_auth.h"

#include <cstddef>

namespace wsup::http {

Header ControlAuthHeader(const std::string& token) { return Header{"Authorization", "Bearer " + token}; }

namespace {

// Equal in content and length, in time that depends on the lengths only.
bool SameSecret(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const size_t n = a.size() < b.size() ? a.size() : b.size();
  for (size_t i = 0; i < n; ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

bool StartsWithNoCase(std::string_view s, std::string_view prefix) {
  if (s.size() < prefix.size()) return false;
  for (size_t i = 0; i < prefix.size(); ++i) {
    char c = s[i];
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    char p = prefix[i];
    if (p >= 'A' && p <= 'Z') p = static_cast<char>(p - 'A' + 'a');
    if (c != p) return false;
  }
  return true;
}

}  // namespace

Status CheckControlAuth(const HttpRequest& request, std::string_view token) {
  if (token.empty()) return Status::Ok();
  const std::string* auth = request.FindHeader("Authorization");
  if (!auth) {
    return Refused("the engine's control routes (/wsup/...) are the supervisor's: send "
                            "'Authorization: Bearer' with the token the supervisor gave this engine in " +
                            std::string(kControlTokenEnv));
  }
  std::string_view v = *auth;
  constexpr std::string_view kBearer = "bearer ";
  if (!StartsWithNoCase(v, kBearer)) {
    return Refused("the Authorization header of a control route must be 'Bearer TOKEN' (the token in " +
                            std::string(kControlTokenEnv) + ")");
  }
  v.remove_prefix(kBearer.size());
  while (!v.empty() && v.front() == ' ') v.remove_prefix(1);
  while (!v.empty() && v.back() == ' ') v.remove_suffix(1);
  if (!SameSecret(v, token)) {
    return Refused("the bearer token is not the one this engine was given in " + std::string(kControlTokenEnv) +
                   "; only the supervisor that started it may use /wsup/...");
  }
  return Status::Ok();
}

bool IsControlPath(std::string_view path) {
  return path == "/wsup" || path.substr(0, 6) == "/wsup/";
}

}  // namespace wsup::http
