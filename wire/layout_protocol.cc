#include "wire/layout_protocol.h"

#include <nlohmann/json.hpp>

#include "common/sha256.h"
#include "wire/message_fields.h"

namespace wsup {

using nlohmann::json;
using namespace wsup::fields;

namespace {

constexpr uint64_t kMaxReasonBytes = 1024;

Error Bad(const char* type, const std::string& what) {
  return Corrupt(std::string("'") + type + "' message: " + what +
                 "; the peer does not speak this version of the holder protocol: run the same wsup version on "
                 "both sides");
}

}  // namespace

const char* HolderLayoutName(HolderLayout layout) {
  return layout == HolderLayout::kEngine ? "engine" : "checkpoint";
}

Result<HolderLayout> ParseHolderLayout(std::string_view name) {
  if (name == "checkpoint") return HolderLayout::kCheckpoint;
  if (name == "engine") return HolderLayout::kEngine;
  return InvalidArgument("layout '" + std::string(name.substr(0, 64)) +
                         "' is not one of checkpoint (the checkpoint's own tensors, loaded by the holder) and "
                         "engine (layouts that engines publish)");
}

// ---------------------------------------------------------------- encode

json EncodeLease(const LeaseMsg& m) {
  return {{"type", "lease"},
          {"layout", m.layout},
          {"fingerprint", m.fingerprint.ToJson()},
          {"backend", m.backend},
          {"device", m.device},
          {"device_uuid", m.device_uuid},
          {"alignment", m.alignment},
          {"granularity", m.granularity},
          {"max_allocations", m.max_allocations}};
}

json EncodeAlloc(const AllocMsg& m) { return {{"type", "alloc"}, {"bytes", m.bytes}}; }

json EncodeGrant(const GrantMsg& m) {
  return {{"type", "grant"}, {"alloc", m.alloc}, {"size", m.size}, {"handle", m.handle}};
}

json EncodeCommit(const std::string& layout_hash, json manifest) {
  return {{"type", "commit"}, {"layout_hash", layout_hash}, {"manifest", std::move(manifest)}};
}

json EncodeAbort(const AbortMsg& m) { return {{"type", "abort"}, {"reason", m.reason}}; }

json EncodeAborted(const AbortedMsg& m) { return {{"type", "aborted"}, {"layout", m.layout}}; }

json LayoutInfoToJson(const LayoutInfo& l) {
  json j = {{"id", l.id},
            {"state", l.state},
            {"fingerprint", l.fingerprint.ToJson()},
            {"tensors", l.tensors},
            {"bytes", l.bytes},
            {"arena_bytes", l.arena_bytes},
            {"allocations", l.allocations},
            {"waiters", l.waiters},
            {"attaches", l.attaches},
            {"age_ms", l.age_ms}};
  if (!l.layout_hash.empty()) j["layout_hash"] = l.layout_hash;
  if (l.state == "writing") {
    j["writer"] = l.writer;
    j["writer_pid"] = l.writer_pid;
  }
  if (l.adopted) j["adopted"] = true;
  return j;
}

json EncodeCommitted(const CommittedMsg& m) {
  json list = json::array();
  for (const CommittedLayout& l : m.layouts) {
    list.push_back({{"id", l.id}, {"layout_hash", l.layout_hash}, {"allocations", l.allocations}});
  }
  return {{"type", "committed"}, {"layouts", std::move(list)}};
}

json EncodeKeep(const KeepMsg& m) { return {{"type", "keep"}, {"layout", m.layout}}; }

json EncodeKept(const LayoutRecord& r) { return {{"type", "kept"}, {"record", LayoutRecordToJson(r, false)}}; }

// ---------------------------------------------------------------- decode

Result<LeaseMsg> DecodeLease(const json& j) {
  LeaseMsg m;
  WSUP_ASSIGN_OR_RETURN(m.layout, GetU64(j, "lease", "layout"));
  WSUP_ASSIGN_OR_RETURN(m.fingerprint, GetFingerprint(j, "lease", "fingerprint"));
  WSUP_ASSIGN_OR_RETURN(m.backend, GetString(j, "lease", "backend"));
  if (m.backend != "host" && m.backend != "cuda") {
    return Bad("lease", "field 'backend' is '" + m.backend.substr(0, 32) + "', expected host or cuda");
  }
  WSUP_ASSIGN_OR_RETURN(int64_t device, GetI64(j, "lease", "device"));
  if (device < -1 || device > 1023) return Bad("lease", "field 'device' = " + std::to_string(device) + " is out of range");
  m.device = static_cast<int>(device);
  WSUP_ASSIGN_OR_RETURN(m.device_uuid, GetString(j, "lease", "device_uuid"));
  WSUP_ASSIGN_OR_RETURN(m.alignment, GetU64(j, "lease", "alignment"));
  WSUP_ASSIGN_OR_RETURN(m.granularity, GetU64(j, "lease", "granularity"));
  WSUP_ASSIGN_OR_RETURN(m.max_allocations, GetU64(j, "lease", "max_allocations"));
  auto power_of_two = [](uint64_t v) { return v != 0 && (v & (v - 1)) == 0 && v <= (1ull << 30); };
  if (!power_of_two(m.alignment) || !power_of_two(m.granularity)) {
    return Bad("lease", "fields 'alignment' (" + std::to_string(m.alignment) + ") and 'granularity' (" +
                            std::to_string(m.granularity) + ") must be powers of two up to 1 GiB");
  }
  if (m.max_allocations == 0) return Bad("lease", "field 'max_allocations' is 0");
  return m;
}

Result<AllocMsg> DecodeAlloc(const json& j) {
  AllocMsg m;
  WSUP_ASSIGN_OR_RETURN(m.bytes, GetU64(j, "alloc", "bytes"));
  if (m.bytes == 0) return Bad("alloc", "field 'bytes' is 0; ask for the bytes the tensors need");
  return m;
}

Result<GrantMsg> DecodeGrant(const json& j) {
  GrantMsg m;
  WSUP_ASSIGN_OR_RETURN(uint64_t alloc, GetU64(j, "grant", "alloc"));
  if (alloc > 0xffffffffull) return Bad("grant", "field 'alloc' = " + std::to_string(alloc) + " is out of range");
  m.alloc = static_cast<uint32_t>(alloc);
  WSUP_ASSIGN_OR_RETURN(m.size, GetU64(j, "grant", "size"));
  if (m.size == 0) return Bad("grant", "field 'size' is 0");
  WSUP_ASSIGN_OR_RETURN(m.handle, GetString(j, "grant", "handle"));
  if (m.handle != "memfd" && m.handle != "cuda_vmm") {
    return Bad("grant", "field 'handle' is '" + m.handle.substr(0, 32) + "', expected memfd or cuda_vmm");
  }
  return m;
}

Result<CommitMsg> DecodeCommit(const json& j, std::string_view table) {
  CommitMsg m;
  WSUP_ASSIGN_OR_RETURN(m.layout_hash, GetString(j, "commit", "layout_hash"));
  if (m.layout_hash.size() != 64 || m.layout_hash.find_first_not_of("0123456789abcdef") != std::string::npos) {
    return Bad("commit", "field 'layout_hash' is not 64 lower-case hex digits (LayoutHash() of the entries)");
  }
  auto it = j.find("manifest");
  if (it == j.end() || !it->is_object()) return FieldError("commit", "manifest", "an object");
  try {
    auto manifest = ManifestFromJson(*it, table, ManifestDecoding::kUnvalidated);
    if (!manifest.ok()) return manifest.error().With("'commit' message: manifest");
    m.manifest = std::move(manifest).value();
  } catch (const std::exception& e) {
    return Corrupt(std::string("'commit' message: manifest: ") + e.what());
  }
  return m;
}

Result<AbortMsg> DecodeAbort(const json& j) {
  AbortMsg m;
  m.reason = GetStringOr(j, "reason", "");
  if (m.reason.size() > kMaxReasonBytes) m.reason.resize(kMaxReasonBytes);
  if (HasControlChars(m.reason)) {
    return Bad("abort", "field 'reason' holds control characters; give a short printable reason");
  }
  return m;
}

Result<AbortedMsg> DecodeAborted(const json& j) {
  AbortedMsg m;
  WSUP_ASSIGN_OR_RETURN(m.layout, GetU64(j, "aborted", "layout"));
  return m;
}

Result<LayoutInfo> LayoutInfoFromJson(const json& j) {
  constexpr const char* kType = "info layouts[]";
  if (!j.is_object()) return FieldError("info", "layouts[]", "an object");
  LayoutInfo l;
  WSUP_ASSIGN_OR_RETURN(l.id, GetU64(j, kType, "id"));
  WSUP_ASSIGN_OR_RETURN(l.state, GetString(j, kType, "state"));
  if (l.state != "writing" && l.state != "committed") {
    return Bad(kType, "field 'state' is '" + l.state.substr(0, 32) + "', expected writing or committed");
  }
  WSUP_ASSIGN_OR_RETURN(l.fingerprint, GetFingerprint(j, kType, "fingerprint"));
  WSUP_ASSIGN_OR_RETURN(l.tensors, GetU64(j, kType, "tensors"));
  WSUP_ASSIGN_OR_RETURN(l.bytes, GetU64(j, kType, "bytes"));
  WSUP_ASSIGN_OR_RETURN(l.arena_bytes, GetU64(j, kType, "arena_bytes"));
  WSUP_ASSIGN_OR_RETURN(l.allocations, GetU64(j, kType, "allocations"));
  WSUP_ASSIGN_OR_RETURN(l.waiters, GetU64Or(j, kType, "waiters", 0));
  WSUP_ASSIGN_OR_RETURN(l.attaches, GetU64Or(j, kType, "attaches", 0));
  WSUP_ASSIGN_OR_RETURN(l.age_ms, GetU64Or(j, kType, "age_ms", 0));
  l.layout_hash = GetStringOr(j, "layout_hash", "");
  l.writer = GetStringOr(j, "writer", "");
  if (j.contains("writer_pid")) {
    WSUP_ASSIGN_OR_RETURN(l.writer_pid, GetI64(j, kType, "writer_pid"));
  }
  if (j.contains("adopted")) {
    WSUP_ASSIGN_OR_RETURN(l.adopted, GetBool(j, kType, "adopted"));
  }
  return l;
}

Result<CommittedMsg> DecodeCommitted(const json& j) {
  constexpr const char* kType = "committed";
  auto it = j.find("layouts");
  if (it == j.end() || !it->is_array()) return FieldError(kType, "layouts", "an array");
  CommittedMsg m;
  for (const json& l : *it) {
    if (!l.is_object()) return FieldError(kType, "layouts[]", "an object");
    CommittedLayout c;
    WSUP_ASSIGN_OR_RETURN(c.id, GetU64(l, kType, "id"));
    WSUP_ASSIGN_OR_RETURN(c.layout_hash, GetString(l, kType, "layout_hash"));
    WSUP_ASSIGN_OR_RETURN(c.allocations, GetU64(l, kType, "allocations"));
    if (c.id == 0) return Bad(kType, "a layout with id 0");
    if (c.allocations == 0 || c.allocations > kMaxLayoutAllocations) {
      return Bad(kType, "layout " + std::to_string(c.id) + " has " + std::to_string(c.allocations) +
                            " allocations, expected 1 to " + std::to_string(kMaxLayoutAllocations));
    }
    m.layouts.push_back(std::move(c));
  }
  return m;
}

Result<KeepMsg> DecodeKeep(const json& j) {
  KeepMsg m;
  WSUP_ASSIGN_OR_RETURN(m.layout, GetU64(j, "keep", "layout"));
  if (m.layout == 0) return Bad("keep", "field 'layout' is 0; name a committed layout's id");
  return m;
}

Result<LayoutRecord> DecodeKept(const json& j) {
  auto it = j.find("record");
  if (it == j.end() || !it->is_object()) return FieldError("kept", "record", "an object");
  auto r = LayoutRecordFromJson(*it, false, "'kept' message: record");
  if (!r.ok()) return r.error();
  if (r->manifest.allocations.size() > kMaxLayoutAllocations) {
    return Bad("kept", "the record has " + std::to_string(r->manifest.allocations.size()) +
                           " allocations, more than a layout may have (" + std::to_string(kMaxLayoutAllocations) +
                           ")");
  }
  return r;
}

std::string LayoutHash(const std::vector<ManifestEntry>& entries) {
  Sha256 h;
  const std::string head = "wsup-layout-v1\n";
  h.Update(head.data(), head.size());
  std::string line;
  for (const ManifestEntry& e : entries) {
    line.clear();
    line += e.name;
    line += '\0';
    line += e.dtype;
    line += '\0';
    for (int64_t d : e.shape) line += std::to_string(d) + ',';
    line += '\0';
    // Contiguous strides, spelled out or not, hash the same.
    if (!e.strides.empty() && e.strides != ContiguousStrides(e.shape)) {
      for (int64_t d : e.strides) line += std::to_string(d) + ',';
    }
    line += '\0';
    line += std::to_string(e.alloc) + '\0' + std::to_string(e.offset) + '\0' + std::to_string(e.nbytes) + '\n';
    h.Update(line.data(), line.size());
  }
  return h.FinishHex();
}

}  // namespace wsup
