// Feeds arbitrary bytes to the holder protocol's receiving side: the frame
// decoder with binary parts accepted (in chunks whose sizes come from the
// input, so every split of a prefix and a body is tried) and every message
// decoder on each complete message, the attach decoder with the message's
// binary part as its tensor table. The whole input is also decoded as a
// tensor table on its own and indexed by name. Nothing may crash, read out
// of bounds, throw, or accept a frame longer than the bound; a decoded
// attach must carry a manifest that validates, and its entries must make a
// tensor table that decodes back to them.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "wire/protocol.h"

namespace {

constexpr uint32_t kMax = 1 << 16;

void CheckTableRoundTrip(const std::vector<wsup::ManifestEntry>& entries) {
  auto table = wsup::EncodeTensorTable(entries);
  if (!table.ok()) return;  // a name over 64 KiB: refused, fine
  std::vector<wsup::ManifestEntry> back;
  if (!wsup::DecodeTensorTable(*table, &back).ok() || back.size() != entries.size()) std::abort();
  for (size_t i = 0; i < back.size(); ++i) {
    if (back[i].name != entries[i].name || back[i].dtype != entries[i].dtype ||
        back[i].shape != entries[i].shape || back[i].alloc != entries[i].alloc ||
        back[i].offset != entries[i].offset || back[i].nbytes != entries[i].nbytes ||
        back[i].strides != entries[i].strides) {
      std::abort();
    }
  }
}

void Exercise(const wsup::DecodedMessage& m) {
  const nlohmann::json& msg = m.msg;
  auto hello = wsup::DecodeHello(msg);
  if (hello.ok() && hello->client.size() > wsup::kMaxClientNameBytes) std::abort();
  auto attach = wsup::DecodeAttach(msg, m.blob);
  if (attach.ok() && !attach->manifest.Validate().ok()) std::abort();
  // The engine's way: the header first, then the table's entries, decoded
  // and validated as MappedArena::Map() does (which adds only the mapping).
  auto header = wsup::DecodeAttach(msg, m.blob, wsup::ManifestDecoding::kHeaderOnly);
  if (header.ok()) {
    wsup::Manifest& man = header->manifest;
    wsup::TensorIndex index;
    if (man.ValidateHeader().ok() && (m.blob.empty() || wsup::DecodeTensorTable(m.blob, &man.entries).ok()) &&
        man.Validate(&index).ok()) {
      if (attach.ok() != true) std::abort();  // the two ways agree
      for (size_t i = 0; i < man.entries.size(); ++i) {
        if (index.Find(man.entries[i].name, man.entries) != i) std::abort();
      }
    }
  }
  (void)wsup::DecodeMismatch(msg);
  (void)wsup::DecodeError(msg);
  (void)wsup::DecodeInfo(msg);
  // Engine-made layouts: the writer's messages.
  auto lease = wsup::DecodeLease(msg);
  if (lease.ok()) (void)wsup::EncodeFrame(wsup::EncodeLease(*lease));
  (void)wsup::DecodeAlloc(msg);
  (void)wsup::DecodeGrant(msg);
  (void)wsup::DecodeAbort(msg);
  (void)wsup::DecodeAborted(msg);
  auto commit = wsup::DecodeCommit(msg, m.blob);
  if (commit.ok() && commit->manifest.Validate().ok()) {
    (void)wsup::LayoutHash(commit->manifest.entries);
    CheckTableRoundTrip(commit->manifest.entries);
  }
  // The keeper's messages and the kept layouts' record file.
  (void)wsup::DecodeCommitted(msg);
  (void)wsup::DecodeKeep(msg);
  auto kept = wsup::DecodeKept(msg);
  if (kept.ok() && wsup::LayoutHash(kept->manifest.entries) != kept->layout_hash) std::abort();
  auto layouts = wsup::LayoutsRecordFromJson(msg);
  if (layouts.ok()) {
    for (const auto& l : layouts->layouts) {
      if (l.fds.size() != l.manifest.allocations.size() || !l.manifest.Validate().ok()) std::abort();
    }
  }
  auto record = wsup::ArenaRecordFromJson(msg);
  if (record.ok() && !record->manifest.Validate().ok()) std::abort();
  // What was accepted must encode again without throwing.
  if (hello.ok()) (void)wsup::EncodeFrame(wsup::EncodeHello(*hello));
  if (attach.ok()) {
    (void)wsup::EncodeFrame(wsup::EncodeAttach(*attach));
    CheckTableRoundTrip(attach->manifest.entries);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  // The first byte picks the chunk size; the rest is the stream.
  size_t chunk = 1 + data[0] % 64;
  std::vector<uint8_t> stream(data + 1, data + size);

  // The rest as a tensor table on its own.
  std::vector<wsup::ManifestEntry> entries;
  if (wsup::DecodeTensorTable(std::string_view(reinterpret_cast<const char*>(stream.data()), stream.size()),
                              &entries)
          .ok()) {
    wsup::TensorIndex index;
    size_t a = 0, b = 0;
    // Tiny budgets too, so that the sorted fallback is fuzzed as well.
    if (index.Build(entries, &a, &b, data[0] % 2 ? wsup::TensorIndex::kScaledBudget : data[0] % 16)) {
      for (size_t i = 0; i < entries.size(); ++i) {
        if (index.Find(entries[i].name, entries) != i) std::abort();
      }
    } else if (a >= b || b >= entries.size() || entries[a].name != entries[b].name) {
      std::abort();
    }
    CheckTableRoundTrip(entries);
  }

  wsup::FrameDecoder decoder(kMax, kMax);
  size_t pos = 0;
  while (pos < stream.size()) {
    size_t n = std::min(chunk, stream.size() - pos);
    std::vector<uint8_t> piece(stream.begin() + static_cast<long>(pos), stream.begin() + static_cast<long>(pos + n));
    pos += n;
    if (!decoder.Feed(piece.data(), piece.size()).ok()) return 0;
    if (decoder.buffered() > kMax + 4 + chunk) std::abort();  // the bound holds
    for (;;) {
      auto next = decoder.NextMessage();
      if (!next.ok()) return 0;
      if (!next->has_value()) break;
      if (!(*next)->msg.is_object() || (*next)->blob.size() > kMax) std::abort();
      Exercise(**next);
    }
  }
  // The whole input as one message body too.
  std::string_view body(reinterpret_cast<const char*>(stream.data()), stream.size());
  auto j = wsup::ParseMessageBody(body, "fuzz");
  if (j.ok()) Exercise(wsup::DecodedMessage{*j, {}});
  return 0;
}
