// JSON frames: the one codec for length-prefixed JSON on a stream socket,
// used by the holder protocol (wire/protocol.h) and by the control sockets
// of the supervisor and the front (wire/json_socket.h).
//
// A frame is a 4-byte little-endian length followed by that many bytes of
// one JSON object. The length is checked against a bound before a byte of
// the body is buffered, so a hostile length prefix costs nothing; the body
// is checked against the shared JSON limits (common/json_limits.h: size and
// nesting) before the parser runs. Nothing here throws.
//
// Each protocol that speaks these frames is a FrameDialect: its bounds, and
// the words of its refusals, so that a holder's peer reads "the peer does not
// speak the holder protocol" and a front's control client "send a 4-byte
// little-endian length and then one JSON object". The defaults are the
// holder protocol's.
//
// Binary parts (the holder protocol's): with max_blob_bytes > 0, a message
// that says "blob": B is held back until the next frame, whose prefix must
// be exactly B, has arrived; those B raw bytes belong to it. With 0, a
// "blob" key means nothing.
//
// When a bad length prefix is refused: by default when the decoder reaches
// it, so Feed() checks only the prefix of the frame being received and
// NextMessage() checks the prefix after each frame it takes, returning the
// refusal instead of that frame. This is what binary parts need: the prefix
// after a message that announces one is known only once that message is
// parsed. A dialect with check_ahead (and no binary parts) checks every
// complete prefix as soon as it arrives: Feed() refuses at once, and the
// frames that came whole before the bad prefix are still delivered, in
// order; then nothing more.
//
// Pure: no sockets, no fds, so unit tests and fuzz targets drive it
// directly. Values and single-owner objects; any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace wsup {

// Largest frame body the holder protocol accepts, and the default bound of
// every dialect. A manifest of 20,000 tensors is about 2 MiB of JSON, so
// this leaves room without letting a peer claim gigabytes.
inline constexpr uint32_t kMaxMessageBytes = 16u << 20;

// The bounds and words of one protocol's frames. In the words, "{n}" stands
// for the announced length and "{max}" for max_bytes.
struct FrameDialect {
  uint32_t max_bytes = kMaxMessageBytes;  // largest frame body accepted
  uint32_t max_blob_bytes = 0;            // largest binary part; 0: none are read
  bool check_ahead = false;               // refuse a bad prefix on arrival (see above)
  Code code = Code::kCorrupt;             // of every refusal
  // A length prefix of 0, and one above max_bytes.
  std::string zero_length = "message length prefix is 0; the peer does not speak the holder protocol";
  std::string too_long =
      "message length prefix announces {n} bytes, more than the {max} allowed; the peer does not speak the "
      "holder protocol or sent a corrupt frame";
  // A bad body: "<body> is not valid JSON; <json_fix>", "<body> is JSON but
  // not an object; <json_fix>", and the JSON limits' refusal ending with
  // limits_fix.
  std::string body = "holder protocol: message";
  std::string json_fix = "the peer does not speak the holder protocol";
  std::string limits_fix = "the peer does not speak the holder protocol";
};

// A message body and its binary part, as FrameDecoder returns them.
struct DecodedMessage {
  nlohmann::json msg;
  std::string blob;
};

// Serializes msg into a frame (length prefix + compact JSON; invalid UTF-8
// is replaced). Refuses a body larger than max_bytes.
Result<std::string> EncodeFrame(const nlohmann::json& msg, uint32_t max_bytes = kMaxMessageBytes);

// Parses one frame body: a JSON object within the shared JSON limits and
// max_bytes, or a refusal in the dialect's words.
Result<nlohmann::json> ParseFrameBody(std::string_view body, const FrameDialect& dialect);

// Splits a byte stream into messages (see the top of this file).
class FrameDecoder {
 public:
  // The holder protocol's dialect with these bounds.
  explicit FrameDecoder(uint32_t max_bytes = kMaxMessageBytes, uint32_t max_blob_bytes = 0);
  explicit FrameDecoder(FrameDialect dialect);

  // Appends bytes. Fails on a bad length prefix, and then on every later call.
  Status Feed(const void* data, size_t len);
  // The next complete message with its binary part, or nullopt when more
  // bytes are needed (or, with check_ahead, when only a refused prefix is
  // left). A body that is not a JSON object is refused and skipped: the
  // next call goes on with the frame after it.
  Result<std::optional<DecodedMessage>> NextMessage();
  // The same without the binary part (for decoders that accept none).
  Result<std::optional<nlohmann::json>> Next();
  // True when a refused length prefix is all that is left: nothing more can
  // be decoded from this stream.
  bool failed() const;
  // True when bytes of an unfinished message are buffered, or a message
  // waits for its binary part.
  bool mid_message() const { return pos_ < buf_.size() || pending_.has_value(); }
  size_t buffered() const { return buf_.size() - pos_; }
  // Length announced by the unfinished message's prefix, 0 when unknown.
  uint32_t announced() const;
  const FrameDialect& dialect() const { return dialect_; }

 private:
  Status CheckPrefix(uint32_t len) const;
  Status CheckHeader();
  Status FeedAhead(const char* data, size_t len);
  void Consume(size_t n);
  FrameDialect dialect_;
  bool ahead_;  // check_ahead, which binary parts rule out
  std::string buf_;
  size_t pos_ = 0;
  std::optional<nlohmann::json> pending_;  // a message waiting for its binary part
  uint32_t pending_blob_ = 0;              // that part's announced length
  bool failed_ = false;                    // a prefix was refused
  // check_ahead: prefixes before checked_ passed; the refused one starts at
  // bad_at_, and refusal_ is what Feed() said about it.
  size_t checked_ = 0;
  size_t bad_at_ = SIZE_MAX;
  Status refusal_;
};

}  // namespace wsup
