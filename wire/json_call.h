// JsonCall: one blocking request and its reply on a JSON control socket
// (the supervisor's or the front's), for CLI commands and tests: connect,
// send, wait for the reply, each bounded by timeout_ms. Events the socket
// pushes to every client ({"type":"event"}, the front's) are skipped. It speaks the
// frames of wire/json_frame.h through the holder protocol's blocking
// Channel (wire/protocol.h), so it lives beside it in wsup_wire, not in the
// loop-side wsup_json_socket.
//
// A reply is any JSON object: reading its fields is the caller's business.
//
// Any thread; blocks the caller (connecting, sending and waiting are each
// bounded by timeout_ms).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace wsup {

// `peer` names who answers on the socket in the errors ("the supervisor
// closed the connection; ...").
Result<nlohmann::json> JsonCall(const std::string& path, const nlohmann::json& request, int timeout_ms,
                                const std::string& peer = "the server");

}  // namespace wsup
