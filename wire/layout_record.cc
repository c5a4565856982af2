#include "wire/layout_record.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>

#include "common/fs.h"
#include "wire/layout_protocol.h"
#include "wire/message_fields.h"
#include "wire/protocol.h"

namespace wsup {

using nlohmann::json;
using namespace wsup::fields;

namespace {

constexpr const char* kFormat = "wsup-layouts-record";
constexpr size_t kMaxRecordFileBytes = 256u << 20;

Error Damaged(const std::string& what, const std::string& why) {
  return Corrupt(what + ": " + why + "; the record is damaged or from another wsup version");
}

// The fd numbers an entry names, read leniently (for closing them when the
// entry itself is refused).
std::vector<int> NamedFds(const json& j) {
  std::vector<int> out;
  if (!j.is_object()) return out;
  auto it = j.find("fds");
  if (it == j.end() || !it->is_array()) return out;
  for (const auto& v : *it) {
    if (v.is_number_integer() && v.get<int64_t>() >= 3 && v.get<int64_t>() <= (1 << 30)) {
      out.push_back(static_cast<int>(v.get<int64_t>()));
    }
  }
  return out;
}

}  // namespace

std::string DescribeLayout(uint64_t id, const std::string& layout_hash) {
  return "layout " + std::to_string(id) + " (hash " + layout_hash.substr(0, 16) + ")";
}

json LayoutRecordToJson(const LayoutRecord& r, bool with_fds) {
  json j = {{"id", r.id},
            {"layout_hash", r.layout_hash},
            {"fingerprint", r.fingerprint.ToJson()},
            {"manifest", ManifestToJson(r.manifest)}};
  if (with_fds) j["fds"] = r.fds;
  return j;
}

Result<LayoutRecord> LayoutRecordFromJson(const json& j, bool with_fds, const std::string& what) {
  if (!j.is_object()) return Damaged(what, "not an object");
  LayoutRecord r;
  auto id = j.find("id");
  if (id == j.end() || !id->is_number_unsigned() || id->get<uint64_t>() == 0) {
    return Damaged(what, "field 'id' is missing or not an integer of 1 or more");
  }
  r.id = id->get<uint64_t>();
  const std::string named = what + " (layout " + std::to_string(r.id) + ")";
  auto hash = j.find("layout_hash");
  if (hash == j.end() || !hash->is_string() || hash->get<std::string>().size() != 64 ||
      hash->get<std::string>().find_first_not_of("0123456789abcdef") != std::string::npos) {
    return Damaged(named, "field 'layout_hash' is not 64 lower-case hex digits");
  }
  r.layout_hash = hash->get<std::string>();
  auto fp = GetFingerprint(j, "layout record", "fingerprint");
  if (!fp.ok()) return fp.error().With(named);
  r.fingerprint = std::move(fp).value();
  if (!IsEngineLayout(r.fingerprint)) {
    return Damaged(named, "its fingerprint names no engine-made layout (no field layout = engine)");
  }
  auto m = j.find("manifest");
  if (m == j.end() || !m->is_object()) return Damaged(named, "field 'manifest' is missing or not an object");
  try {
    auto manifest = ManifestFromJson(*m);
    if (!manifest.ok()) return manifest.error().With(named + ": manifest");
    r.manifest = std::move(manifest).value();
  } catch (const std::exception& e) {
    return Damaged(named, std::string("manifest: ") + e.what());
  }
  if (r.manifest.entries.empty()) return Damaged(named, "its manifest names no tensors");
  if (r.manifest.allocations.empty()) return Damaged(named, "its manifest has no allocations");
  std::string computed = LayoutHash(r.manifest.entries);
  if (computed != r.layout_hash) {
    return Damaged(named, "its layout_hash " + r.layout_hash.substr(0, 16) + "... is not the hash of its entries (" +
                              computed.substr(0, 16) + "...)");
  }
  if (with_fds) {
    auto fds = j.find("fds");
    if (fds == j.end() || !fds->is_array()) return Damaged(named, "field 'fds' is missing or not an array");
    for (const auto& v : *fds) {
      if (!v.is_number_integer() || v.get<int64_t>() < 3 || v.get<int64_t>() > (1 << 30)) {
        return Damaged(named, "field 'fds' holds " + v.dump().substr(0, 32) +
                                  ", not an inherited fd number (3 or more)");
      }
      r.fds.push_back(static_cast<int>(v.get<int64_t>()));
    }
    if (r.fds.size() != r.manifest.allocations.size()) {
      return Damaged(named, "it names " + std::to_string(r.fds.size()) + " fds for " +
                                std::to_string(r.manifest.allocations.size()) +
                                " allocations; a layout needs one fd per allocation, in allocation order");
    }
  }
  return r;
}

json LayoutsRecordToJson(const std::vector<LayoutRecord>& layouts) {
  json list = json::array();
  for (const LayoutRecord& r : layouts) list.push_back(LayoutRecordToJson(r, true));
  return {{"format", kFormat}, {"version", kLayoutsRecordVersion}, {"layouts", std::move(list)}};
}

Result<LayoutsRecord> LayoutsRecordFromJson(const json& j) {
  if (!j.is_object() || GetStringOr(j, "format", "") != kFormat) {
    return Corrupt(std::string("not a wsup layouts record (no \"format\": \"") + kFormat +
                   "\"); pass the file the supervisor wrote for --adopt-layouts");
  }
  auto version = j.find("version");
  if (version == j.end() || !version->is_number_integer() || version->get<int64_t>() != kLayoutsRecordVersion) {
    return Corrupt("a layouts record of version " + (version == j.end() ? std::string("(none)") : version->dump()) +
                   ", this holder reads version " + std::to_string(kLayoutsRecordVersion) +
                   "; run the same wsup version for the supervisor and the holder");
  }
  auto list = j.find("layouts");
  if (list == j.end() || !list->is_array()) {
    return Corrupt("a layouts record without a 'layouts' array; the record is damaged");
  }
  LayoutsRecord out;
  std::set<int> taken;
  for (size_t i = 0; i < list->size(); ++i) {
    const json& entry = (*list)[i];
    auto refuse = [&](Error e) {
      RefusedLayout r;
      r.error = std::move(e);
      if (entry.is_object() && entry.contains("id") && entry["id"].is_number_unsigned()) {
        r.id = entry["id"].get<uint64_t>();
      }
      // Only fds no earlier layout took: those are someone else's.
      for (int fd : NamedFds(entry)) {
        if (taken.insert(fd).second) r.fds.push_back(fd);
      }
      out.refused.push_back(std::move(r));
    };
    auto rec = LayoutRecordFromJson(entry, true, "layouts[" + std::to_string(i) + "]");
    if (!rec.ok()) {
      refuse(rec.error());
      continue;
    }
    int twice = -1;
    for (int fd : rec->fds) {
      if (taken.count(fd) != 0 || std::count(rec->fds.begin(), rec->fds.end(), fd) > 1) twice = fd;
    }
    if (twice >= 0) {
      refuse(Corrupt(DescribeLayout(rec->id, rec->layout_hash) + ": fd " + std::to_string(twice) +
                     " is named twice in the record; each allocation needs its own inherited fd"));
      continue;
    }
    for (int fd : rec->fds) taken.insert(fd);
    out.layouts.push_back(std::move(rec).value());
  }
  return out;
}

Status WriteLayoutsRecord(const std::string& path, const std::vector<LayoutRecord>& layouts) {
  std::string text;
  try {
    text = LayoutsRecordToJson(layouts).dump(-1, ' ', false, json::error_handler_t::replace);
  } catch (const std::exception& e) {
    return Internal(path + ": cannot serialize the layouts record: " + e.what());
  }
  return WriteFileAtomic(path, text + "\n", 0600);
}

Result<LayoutsRecord> ReadLayoutsRecord(const std::string& path) {
  WSUP_ASSIGN_OR_RETURN(std::string text, ReadFile(path, kMaxRecordFileBytes));
  auto j = ParseMessageBody(text, path);
  if (!j.ok()) return j.error();
  auto r = LayoutsRecordFromJson(*j);
  if (!r.ok()) return r.error().With(path);
  return r;
}

}  // namespace wsup
