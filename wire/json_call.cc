#include "wire/json_call.h"

#include <sys/stat.h>

#include <chrono>

#include "common/json_fields.h"
#include "wire/protocol.h"

namespace wsup {

namespace {

// {"type": "event"}; a reply whose type is of another kind is no event.
bool IsEvent(const nlohmann::json& msg) {
  auto type = FieldOr<std::string>(msg, "type", "");
  return type.ok() && *type == "event";
}

}  // namespace

Result<nlohmann::json> JsonCall(const std::string& path, const nlohmann::json& request, int timeout_ms,
                                const std::string& peer) {
  auto ch = Channel::Connect(path, timeout_ms);
  if (!ch.ok()) {
    struct stat st{};
    if (::stat(path.c_str(), &st) != 0) return Unavailable(path + ": no such control socket");
    return Unavailable(path + ": nothing accepts connections there");
  }
  ch->set_peer(peer);
  auto reply = ch->Call(request, timeout_ms);
  // A socket may push events to every client (the front's
  // {"type":"event"}: a backend down, the first good answer after a swap);
  // one that lands between the request and its reply is not the reply.
  // Skipped, within the same bound: a reply follows each request.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (reply.ok() && IsEvent(reply->msg)) {
    auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      return Unavailable(path + ": no reply within " + std::to_string(timeout_ms) + " ms, only events");
    }
    reply = ch->Receive(static_cast<int>(left.count()));
  }
  if (!reply.ok()) return reply.error();
  return std::move(reply->msg);
}

}  // namespace wsup
