#include "wire/json_frame.h"

#include <algorithm>
#include <cstring>

#include "common/json_limits.h"

namespace wsup {

using nlohmann::json;

namespace {

uint32_t ReadLe32(const char* p) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  return static_cast<uint32_t>(u[0]) | (static_cast<uint32_t>(u[1]) << 8) |
         (static_cast<uint32_t>(u[2]) << 16) | (static_cast<uint32_t>(u[3]) << 24);
}

// `words` with {n} and {max} filled in.
std::string Fill(const std::string& words, uint32_t n, uint32_t max) {
  std::string out;
  out.reserve(words.size() + 16);
  for (size_t i = 0; i < words.size();) {
    if (words.compare(i, 3, "{n}") == 0) {
      out += std::to_string(n);
      i += 3;
    } else if (words.compare(i, 5, "{max}") == 0) {
      out += std::to_string(max);
      i += 5;
    } else {
      out += words[i++];
    }
  }
  return out;
}

FrameDialect HolderDialect(uint32_t max_bytes, uint32_t max_blob_bytes) {
  FrameDialect d;
  d.max_bytes = max_bytes;
  d.max_blob_bytes = max_blob_bytes;
  return d;
}

}  // namespace

Result<std::string> EncodeFrame(const json& msg, uint32_t max_bytes) {
  std::string body;
  try {
    body = msg.dump(-1, ' ', false, json::error_handler_t::replace);
  } catch (const std::exception& e) {
    return Internal(std::string("cannot serialize a protocol message: ") + e.what());
  }
  if (body.size() > max_bytes) {
    return InvalidArgument("a protocol message of " + std::to_string(body.size()) + " bytes exceeds the " +
                           std::to_string(max_bytes) +
                           "-byte limit; the manifest is too large to send: use fewer, larger tensors");
  }
  std::string out(4 + body.size(), '\0');
  auto n = static_cast<uint32_t>(body.size());
  for (int i = 0; i < 4; ++i) out[static_cast<size_t>(i)] = static_cast<char>((n >> (8 * i)) & 0xff);
  std::memcpy(out.data() + 4, body.data(), body.size());
  return out;
}

Result<json> ParseFrameBody(std::string_view body, const FrameDialect& d) {
  // Bounded before the parser builds a tree that later walks would recurse into.
  Status limits = CheckJsonLimits(body, d.body, d.limits_fix, d.max_bytes);
  if (!limits.ok()) return Error(d.code, limits.error().message());
  json j;
  try {
    j = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  } catch (const std::exception& e) {
    return Error(d.code, d.body + " is not valid JSON (" + e.what() + "); " + d.json_fix);
  }
  if (j.is_discarded()) return Error(d.code, d.body + " is not valid JSON; " + d.json_fix);
  if (!j.is_object()) return Error(d.code, d.body + " is JSON but not an object; " + d.json_fix);
  return j;
}

FrameDecoder::FrameDecoder(uint32_t max_bytes, uint32_t max_blob_bytes)
    : FrameDecoder(HolderDialect(max_bytes, max_blob_bytes)) {}

FrameDecoder::FrameDecoder(FrameDialect dialect)
    : dialect_(std::move(dialect)), ahead_(dialect_.check_ahead && dialect_.max_blob_bytes == 0) {}

bool FrameDecoder::failed() const { return failed_ && (!ahead_ || pos_ >= bad_at_); }

uint32_t FrameDecoder::announced() const { return buffered() >= 4 ? ReadLe32(buf_.data() + pos_) : 0; }

Status FrameDecoder::CheckPrefix(uint32_t len) const {
  if (pending_) {
    if (len != pending_blob_) {
      return Error(dialect_.code, "a message announced a binary part of " + std::to_string(pending_blob_) +
                                      " bytes but the frame after it holds " + std::to_string(len) +
                                      "; the peer does not speak this version of the holder protocol or sent "
                                      "a corrupt frame");
    }
    return Status::Ok();
  }
  if (len == 0) return Error(dialect_.code, Fill(dialect_.zero_length, len, dialect_.max_bytes));
  if (len > dialect_.max_bytes) return Error(dialect_.code, Fill(dialect_.too_long, len, dialect_.max_bytes));
  return Status::Ok();
}

Status FrameDecoder::CheckHeader() {
  if (buffered() < 4) return Status::Ok();
  Status s = CheckPrefix(ReadLe32(buf_.data() + pos_));
  if (!s.ok()) failed_ = true;
  return s;
}

Status FrameDecoder::Feed(const void* data, size_t len) {
  if (ahead_) return FeedAhead(static_cast<const char*>(data), len);
  // Refuse a bad prefix before its body is buffered: check the prefix as
  // soon as its 4 bytes are present, whether they came in this call or not.
  uint32_t frame = 0;  // the length of the frame being received, once known
  if (buffered() >= 4) {
    frame = ReadLe32(buf_.data() + pos_);
  } else if (buffered() + len >= 4) {
    char head[4];
    size_t have = buffered();
    std::memcpy(head, buf_.data() + pos_, have);
    std::memcpy(head + have, data, 4 - have);
    frame = ReadLe32(head);
    if (!CheckPrefix(frame).ok()) {
      buf_.append(static_cast<const char*>(data), 4 - have);
      return CheckHeader();
    }
  }
  // A large frame (a manifest, a tensor table) gets its whole size at once
  // rather than growing by doubling, which would copy it and touch fresh
  // memory several times over. Its prefix passed the bound, so this is at
  // most the bound.
  const size_t need = 4 + static_cast<size_t>(frame);
  if (frame > 0 && need > buffered() + len && buf_.capacity() - pos_ < need && CheckPrefix(frame).ok()) {
    if (pos_ > 0) {
      buf_.erase(0, pos_);
      pos_ = 0;
    }
    buf_.reserve(need);
  }
  buf_.append(static_cast<const char*>(data), len);
  return CheckHeader();
}

Status FrameDecoder::FeedAhead(const char* data, size_t len) {
  if (failed_) return refusal_;
  if (pos_ > 0 && pos_ == buf_.size()) {
    buf_.clear();
    pos_ = 0;
    checked_ = 0;
  }
  buf_.append(data, len);
  // Every complete prefix now, so an oversized announcement is refused
  // before its body is buffered.
  size_t p = std::max(checked_, pos_);
  while (buf_.size() - p >= 4) {
    uint32_t n = ReadLe32(buf_.data() + p);
    Status s = CheckPrefix(n);
    if (!s.ok()) {
      failed_ = true;
      bad_at_ = p;
      refusal_ = s;
      return s;
    }
    if (buf_.size() - p - 4 < n) break;
    p += 4 + static_cast<size_t>(n);
  }
  checked_ = p;
  return Status::Ok();
}

void FrameDecoder::Consume(size_t n) {
  pos_ += n;
  if (pos_ == buf_.size()) {
    buf_.clear();
    checked_ = 0;
    pos_ = 0;
  } else if (pos_ >= (64u << 10) && pos_ * 2 >= buf_.size()) {
    buf_.erase(0, pos_);
    checked_ = checked_ > pos_ ? checked_ - pos_ : 0;
    if (bad_at_ != SIZE_MAX) bad_at_ -= pos_;
    pos_ = 0;
  }
}

Result<std::optional<DecodedMessage>> FrameDecoder::NextMessage() {
  for (;;) {
    if (ahead_ && pos_ >= bad_at_) return std::optional<DecodedMessage>();
    if (buffered() < 4) return std::optional<DecodedMessage>();
    if (!ahead_) WSUP_RETURN_IF_ERROR(CheckHeader());
    uint32_t len = ReadLe32(buf_.data() + pos_);
    if (buffered() < 4 + static_cast<size_t>(len)) return std::optional<DecodedMessage>();
    std::string_view body(buf_.data() + pos_ + 4, len);
    if (pending_) {
      DecodedMessage m{std::move(*pending_), {}};
      pending_.reset();
      pending_blob_ = 0;
      if (pos_ == 0 && buf_.size() == 4 + static_cast<size_t>(len)) {
        // The usual case: the binary part fills the buffer. Take the buffer
        // itself (moving the bytes down) instead of copying into fresh memory.
        m.blob = std::move(buf_);
        m.blob.erase(0, 4);
        buf_.clear();
        pos_ = 0;
      } else {
        m.blob.assign(body.data(), body.size());
        Consume(4 + static_cast<size_t>(len));
      }
      WSUP_RETURN_IF_ERROR(CheckHeader());
      return std::optional<DecodedMessage>(std::move(m));
    }
    auto parsed = ParseFrameBody(body, dialect_);
    Consume(4 + static_cast<size_t>(len));
    if (!parsed.ok()) return parsed.error();
    if (dialect_.max_blob_bytes > 0) {
      auto it = parsed->find("blob");
      if (it != parsed->end()) {
        if (!it->is_number_unsigned() || it->get<uint64_t>() == 0 ||
            it->get<uint64_t>() > dialect_.max_blob_bytes) {
          return Error(dialect_.code, "a message announces a binary part of " + it->dump().substr(0, 40) +
                                          " bytes; this side accepts 1 to " +
                                          std::to_string(dialect_.max_blob_bytes) +
                                          "; the peer does not speak this version of the holder protocol or "
                                          "sent a corrupt frame");
        }
        pending_blob_ = static_cast<uint32_t>(it->get<uint64_t>());
        pending_ = std::move(parsed).value();
        // Its prefix is checked as soon as it is there, like any other.
        WSUP_RETURN_IF_ERROR(CheckHeader());
        continue;
      }
    }
    // Check the next prefix now too, so a bad one is refused before its body.
    if (!ahead_) WSUP_RETURN_IF_ERROR(CheckHeader());
    return std::optional<DecodedMessage>(DecodedMessage{std::move(parsed).value(), {}});
  }
}

Result<std::optional<json>> FrameDecoder::Next() {
  WSUP_ASSIGN_OR_RETURN(std::optional<DecodedMessage> m, NextMessage());
  if (!m) return std::optional<json>();
  return std::optional<json>(std::move(m->msg));
}

}  // namespace wsup
