#include "front/routes.h"

namespace wsup::front {

bool IsForwardedPath(std::string_view path) {
  if (path == "/health") return true;
  constexpr std::string_view kApi = "/v1/";
  if (path.substr(0, kApi.size()) != kApi) return false;
  // Every segment after "/v1/" must be a name, not "." or "..".
  std::string_view rest = path.substr(kApi.size());
  if (rest.empty()) return false;
  while (true) {
    const size_t slash = rest.find('/');
    const std::string_view seg = rest.substr(0, slash);
    if (seg == "." || seg == "..") return false;
    if (slash == std::string_view::npos) return true;
    rest.remove_prefix(slash + 1);
  }
}

}  // namespace wsup::front
