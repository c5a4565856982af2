// The framing of the front's control socket: every message is a 4-byte
// little-endian length followed by that many bytes of one JSON object.
// This is the same wire format as the holder protocol (wire/protocol.h);
// the front keeps its own small copy because it must not link the attach
// library (CUDA loader, manifests) to speak six message types.
//
// ControlFrameDecoder refuses a zero or oversized length as soon as the four
// prefix bytes are in, before buffering a byte of the body, so a hostile
// length costs nothing. ParseControlMessage checks the shared JSON limits
// (common/json_limits.h: size and nesting) before the parser runs and never
// throws.
//
// Pure: no sockets, so the unit tests and a fuzz target drive it directly.
// Values and single-owner objects; any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace wsup::front {

// Control messages are a few hundred bytes; 64 KiB leaves room for a status
// reply with many backends without letting a peer make us buffer megabytes.
inline constexpr uint32_t kMaxControlMessageBytes = 64 * 1024;

// Length prefix + compact JSON (invalid UTF-8 replaced, never throws).
std::string EncodeControlFrame(const nlohmann::json& msg);

class ControlFrameDecoder {
 public:
  explicit ControlFrameDecoder(uint32_t max_bytes = kMaxControlMessageBytes) : max_bytes_(max_bytes) {}

  // Appends bytes. Fails (and stays failed) on a zero or oversized length.
  Status Feed(const char* data, size_t len);
  // The next complete body, or nullopt when more bytes are needed.
  std::optional<std::string> Next();
  bool failed() const { return failed_; }

 private:
  uint32_t max_bytes_;
  std::string buf_;
  size_t pos_ = 0;
  size_t bad_at_ = SIZE_MAX;  // where the bad prefix starts
  bool failed_ = false;
};

// A body as a JSON object, within the shared JSON limits. Errors name the problem
// and what a control client must send instead.
Result<nlohmann::json> ParseControlMessage(std::string_view body);

}  // namespace wsup::front
