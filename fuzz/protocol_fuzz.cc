// Feeds arbitrary bytes to the holder protocol's receiving side: the frame
// decoder (in chunks whose sizes come from the input, so every split of a
// prefix and a body is tried) and every message decoder on each complete
// message. Nothing may crash, read out of bounds, throw, or accept a frame
// longer than the bound; a decoded attach must carry a manifest that
// validates.
#include <cstdint>
#include <algorithm>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "client/protocol.h"

namespace {

constexpr uint32_t kMax = 1 << 16;

void Exercise(const nlohmann::json& msg) {
  auto hello = wsup::DecodeHello(msg);
  if (hello.ok() && hello->client.size() > wsup::kMaxClientNameBytes) std::abort();
  auto attach = wsup::DecodeAttach(msg);
  if (attach.ok() && !attach->manifest.Validate().ok()) std::abort();
  (void)wsup::DecodeMismatch(msg);
  (void)wsup::DecodeError(msg);
  (void)wsup::DecodeInfo(msg);
  auto record = wsup::ArenaRecordFromJson(msg);
  if (record.ok() && !record->manifest.Validate().ok()) std::abort();
  // What was accepted must encode again without throwing.
  if (hello.ok()) (void)wsup::EncodeFrame(wsup::EncodeHello(*hello));
  if (attach.ok()) (void)wsup::EncodeFrame(wsup::EncodeAttach(*attach));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  // The first byte picks the chunk size; the rest is the stream.
  size_t chunk = 1 + data[0] % 64;
  std::vector<uint8_t> stream(data + 1, data + size);
  wsup::FrameDecoder decoder(kMax);
  size_t pos = 0;
  while (pos < stream.size()) {
    size_t n = std::min(chunk, stream.size() - pos);
    std::vector<uint8_t> piece(stream.begin() + static_cast<long>(pos), stream.begin() + static_cast<long>(pos + n));
    pos += n;
    if (!decoder.Feed(piece.data(), piece.size()).ok()) return 0;
    if (decoder.buffered() > kMax + 4 + chunk) std::abort();  // the bound holds
    for (;;) {
      auto next = decoder.Next();
      if (!next.ok()) return 0;
      if (!next->has_value()) break;
      if (!(*next)->is_object()) std::abort();
      Exercise(**next);
    }
  }
  // The whole input as one message body too.
  std::string_view body(reinterpret_cast<const char*>(stream.data()), stream.size());
  auto j = wsup::ParseMessageBody(body, "fuzz");
  if (j.ok()) Exercise(*j);
  return 0;
}
