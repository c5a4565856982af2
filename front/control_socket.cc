#include "front/control_socket.h"

namespace wsup::front {

nlohmann::json ErrorReply(const std::string& message) { return {{"ok", false}, {"error", message}}; }

FrameDialect ControlFrames(uint32_t max_bytes) {
  FrameDialect d;
  d.max_bytes = max_bytes;
  d.check_ahead = true;
  d.code = Code::kInvalidArgument;
  d.zero_length = d.too_long =
      "control: a message announces {n} bytes; the limit is 1 to {max} bytes: send a 4-byte little-endian length "
      "and then one JSON object";
  d.body = "control: the message";
  d.json_fix = "send one JSON object such as {\"type\":\"status\"}";
  d.limits_fix = "send a flat JSON object such as {\"type\":\"status\"}";
  return d;
}

JsonServerOptions ControlSocketOptions() {
  JsonServerOptions o;
  o.conn.frames = ControlFrames();
  o.conn.max_queued_bytes = kMaxControlQueuedBytes;
  o.conn.answer_bad_messages = true;
  o.conn.error_reply = &ErrorReply;
  o.conn.log_name = "control";
  o.max_clients = kMaxControlClients;
  o.same_uid_only = false;
  o.backlog = 16;
  JsonServerWords& w = o.words;
  w.path_too_long = "control socket path '{path}' is empty or longer than {max} bytes; pass a shorter --control path";
  w.not_a_socket = "control socket path {path} exists and is not a socket; remove it or pass another --control path";
  w.in_use =
      "control socket {path} is in use by a running process (another wsup-front?); stop it or pass another "
      "--control path";
  w.cannot_listen =
      "control: cannot listen on {path}: {why}; check that its directory exists and is writable, or pass another "
      "--control path";
  w.too_many_clients = "control: too many clients are connected to {path}; close idle ones and retry";
  return o;
}

}  // namespace wsup::front
