// Feeds arbitrary bytes to what the supervisor reads from other processes,
// as protocol_fuzz does for the holder: the frames of its control socket
// (wsup.sock, the frame decoder in the socket's dialect, in chunks whose
// sizes come from the input) and every parser of supervisor/messages.h on
// each complete message: the CLI's requests (the control socket's
// dispatch acts on nothing else), the front's events and status replies,
// an engine's /wsup/status. The whole input is also parsed as one message
// body and as an engine's status text. Every field of every message is
// read with every checked accessor (common/json_fields.h). Nothing may
// crash, throw or read out of bounds; a request that is accepted must be
// one the CLI could have sent.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "common/json_fields.h"
#include "common/json_limits.h"
#include "supervisor/messages.h"
#include "wire/json_frame.h"

namespace {

using nlohmann::json;

// The dialect of the supervisor's control socket (JsonConnOptions' default).
const wsup::FrameDialect kControl{.max_bytes = 1u << 20};

void CheckRequest(const json& msg) {
  auto req = wsup::ParseControlRequest(msg);
  if (!req.ok()) {
    if (req.error().message().empty()) std::abort();
    return;
  }
  // Accepted: a string type naming a request, and for a failover a drill
  // whose flags are booleans.
  auto type = msg.find("type");
  if (type == msg.end() || !type->is_string()) std::abort();
  const std::string& t = type->get_ref<const std::string&>();
  switch (req->kind) {
    case wsup::ControlRequest::Kind::kStatus:
      if (t != "status" || req->kill) std::abort();
      break;
    case wsup::ControlRequest::Kind::kReload:
      if (t != "reload" || req->kill) std::abort();
      break;
    case wsup::ControlRequest::Kind::kStop:
      if (t != "stop" || req->kill) std::abort();
      break;
    case wsup::ControlRequest::Kind::kFailover: {
      auto drill = msg.find("drill");
      if (t != "failover" || drill == msg.end() || !drill->is_boolean() || !drill->get<bool>()) std::abort();
      auto kill = msg.find("kill");
      const bool kill_ok = kill == msg.end() || kill->is_null() || (kill->is_boolean() && kill->get<bool>() == req->kill);
      if (!kill_ok) std::abort();
      break;
    }
  }
}

void ReadEveryField(const json& msg) {
  if (!msg.is_object()) return;
  for (const auto& [key, value] : msg.items()) {
    (void)wsup::Field<bool>(msg, key);
    (void)wsup::Field<std::string>(msg, key);
    (void)wsup::FieldOr<int64_t>(msg, key, 0);
    (void)wsup::FieldOr<uint64_t>(msg, key, 0);
    (void)wsup::FieldOr<int>(msg, key, 0);
    (void)wsup::FieldOr<double>(msg, key, 0);
    (void)wsup::ObjectFieldOr(msg, key);
    (void)wsup::ArrayFieldOr(msg, key);
    (void)wsup::JsonExcerpt(value);
    // One level down too: the front's status and an engine's nest objects.
    if (value.is_object()) {
      for (const auto& [k2, v2] : value.items()) {
        (void)wsup::FieldOr<int64_t>(value, k2, 0);
        (void)wsup::FieldOr<std::string>(value, k2, "");
        (void)v2;
      }
    }
  }
}

void Exercise(const json& msg) {
  CheckRequest(msg);
  (void)wsup::IsFrontEvent(msg);
  auto front = wsup::ParseFrontMessage(msg);
  if (front.ok() && front->kind == wsup::FrontMessage::Kind::kCut && !msg.contains("cut")) std::abort();
  (void)wsup::FrontInflight(msg, "127.0.0.1:8001");
  if (msg.is_object() && !msg.empty()) (void)wsup::FrontInflight(msg, msg.begin().key());
  auto log = wsup::ParseFrontLog(msg);
  if (log.ok()) {
    for (const auto& [address, at] : log->failed_at_ms) {
      if (at <= 0) std::abort();
    }
  }
  auto engine = wsup::ParseEngineStatus(msg);
  if (engine.ok() && engine->weights && engine->weights->ms && *engine->weights->ms < 0) std::abort();
  ReadEveryField(msg);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  // The first byte picks the chunk size; the rest is the stream.
  const size_t chunk = 1 + data[0] % 64;
  std::string_view stream(reinterpret_cast<const char*>(data + 1), size - 1);

  wsup::FrameDecoder decoder(kControl);
  size_t pos = 0;
  bool done = false;
  while (pos < stream.size() && !done) {
    const size_t n = std::min(chunk, stream.size() - pos);
    if (!decoder.Feed(stream.data() + pos, n).ok()) break;
    pos += n;
    for (;;) {
      auto next = decoder.Next();
      if (!next.ok()) {
        // A bad body is skipped (the socket closes the connection on it);
        // a bad length prefix ends the stream.
        if (decoder.failed()) done = true;
        if (done) break;
        continue;
      }
      if (!next->has_value()) break;
      if (!(*next)->is_object()) std::abort();
      Exercise(**next);
    }
  }
  // The whole input as one message body, and as an engine's status text.
  auto body = wsup::ParseFrameBody(stream, kControl);
  if (body.ok()) Exercise(*body);
  auto status = wsup::ParseJsonChecked(stream, "fuzz", "");
  if (status.ok()) Exercise(*status);
  return 0;
}
