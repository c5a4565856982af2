#include "front/control_frame.h"

#include "common/json_limits.h"

namespace wsup::front {

namespace {

uint32_t ReadLe32(const char* p) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  return static_cast<uint32_t>(u[0]) | (static_cast<uint32_t>(u[1]) << 8) | (static_cast<uint32_t>(u[2]) << 16) |
         (static_cast<uint32_t>(u[3]) << 24);
}

}  // namespace

std::string EncodeControlFrame(const nlohmann::json& msg) {
  std::string body = msg.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  auto n = static_cast<uint32_t>(body.size());
  std::string out;
  out.reserve(4 + body.size());
  out.push_back(static_cast<char>(n & 0xff));
  out.push_back(static_cast<char>((n >> 8) & 0xff));
  out.push_back(static_cast<char>((n >> 16) & 0xff));
  out.push_back(static_cast<char>((n >> 24) & 0xff));
  out += body;
  return out;
}

Status ControlFrameDecoder::Feed(const char* data, size_t len) {
  if (failed_) return InvalidArgument("control: the connection already sent a bad frame; reconnect");
  if (pos_ > 0 && pos_ == buf_.size()) {
    buf_.clear();
    pos_ = 0;
  }
  buf_.append(data, len);
  // Check every complete prefix now, so an oversized announcement is refused
  // before its body is buffered.
  size_t p = pos_;
  while (buf_.size() - p >= 4) {
    uint32_t n = ReadLe32(buf_.data() + p);
    if (n == 0 || n > max_bytes_) {
      failed_ = true;
      bad_at_ = p;
      return InvalidArgument("control: a message announces " + std::to_string(n) + " bytes; the limit is 1 to " +
                             std::to_string(max_bytes_) +
                             " bytes: send a 4-byte little-endian length and then one JSON object");
    }
    if (buf_.size() - p - 4 < n) break;
    p += 4 + n;
  }
  return Status::Ok();
}

std::optional<std::string> ControlFrameDecoder::Next() {
  // Frames that arrived whole before a bad prefix are still delivered.
  if (pos_ >= bad_at_ || buf_.size() - pos_ < 4) return std::nullopt;
  uint32_t n = ReadLe32(buf_.data() + pos_);
  if (buf_.size() - pos_ - 4 < n) return std::nullopt;
  std::string body = buf_.substr(pos_ + 4, n);
  pos_ += 4 + n;
  if (pos_ == buf_.size() && !failed_) {
    buf_.clear();
    pos_ = 0;
  }
  return body;
}

Result<nlohmann::json> ParseControlMessage(std::string_view body) {
  Status limits = CheckJsonLimits(body, "control: the message", "send a flat JSON object such as {\"type\":\"status\"}",
                                  kMaxControlMessageBytes);
  if (!limits.ok()) return limits.error();
  nlohmann::json j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return InvalidArgument("control: the message is not valid JSON; send one JSON object such as {\"type\":\"status\"}");
  }
  if (!j.is_object()) {
    return InvalidArgument("control: the message is JSON but not an object; send one JSON object such as "
                           "{\"type\":\"status\"}");
  }
  return j;
}

}  // namespace wsup::front
