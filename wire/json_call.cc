#include "wire/json_call.h"

#include <sys/stat.h>

#include "wire/protocol.h"

namespace wsup {

Result<nlohmann::json> JsonCall(const std::string& path, const nlohmann::json& request, int timeout_ms) {
  auto ch = Channel::Connect(path, timeout_ms);
  if (!ch.ok()) {
    struct stat st{};
    if (::stat(path.c_str(), &st) != 0) return Unavailable(path + ": no such control socket");
    return Unavailable(path + ": nothing accepts connections there");
  }
  auto reply = ch->Call(request, timeout_ms);
  if (!reply.ok()) return reply.error();
  return std::move(reply->msg);
}

}  // namespace wsup
