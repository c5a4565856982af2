#include "group/membership.h"

#include <algorithm>
#include <charconv>

#include <nlohmann/json.hpp>

namespace wsup::group {

using nlohmann::json;

std::string MembersPrefix(const std::string& group) { return "/wsup/groups/" + group + "/members/"; }

std::string MemberKey(const std::string& group, int index) { return MembersPrefix(group) + std::to_string(index); }

std::string EncodeMember(const MemberRecord& r) {
  return json{{"index", r.index}, {"epoch", r.epoch}, {"primary", r.primary}, {"standby", r.standby}}.dump();
}

Result<MemberRecord> DecodeMember(std::string_view value, int key_index, int64_t lease) {
  auto bad = [&](const std::string& what) {
    return Error(Code::kCorrupt, "the group member record of index " + std::to_string(key_index) + " (" +
                                     std::string(value.substr(0, 200)) + "): " + what +
                                     "; it is written only by wsup supervisors: remove the key if something else "
                                     "wrote it");
  };
  json j = json::parse(value, nullptr, false);
  if (!j.is_object()) return bad("not a JSON object");
  if (!j.contains("index") || !j["index"].is_number_integer() || j["index"].get<int64_t>() != key_index) {
    return bad("\"index\" is not the key's index");
  }
  if (!j.contains("epoch") || !j["epoch"].is_number_integer() || j["epoch"].get<int64_t>() < 0) {
    return bad("\"epoch\" is not an integer of 0 or more");
  }
  MemberRecord r;
  r.index = key_index;
  r.epoch = j["epoch"].get<int64_t>();
  r.primary = j.contains("primary") && j["primary"].is_string() ? j["primary"].get<std::string>() : "";
  r.standby = j.contains("standby") && j["standby"].is_string() ? j["standby"].get<std::string>() : "";
  r.lease = lease;
  return r;
}

std::optional<int> MemberIndexOf(std::string_view key, std::string_view prefix) {
  if (key.size() <= prefix.size() || key.substr(0, prefix.size()) != prefix) return std::nullopt;
  const std::string_view rest = key.substr(prefix.size());
  int index = -1;
  auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), index);
  if (ec != std::errc() || end != rest.data() + rest.size() || index < 0) return std::nullopt;
  if (std::to_string(index) != rest) return std::nullopt;  // "01", "+1": not a key a member writes
  return index;
}

void OwnLease::Granted(int64_t id, int64_t sent_ms, int64_t ttl_s) {
  id_ = id;
  Renewed(sent_ms, ttl_s);
}

void OwnLease::Renewed(int64_t sent_ms, int64_t ttl_s) {
  if (id_ == 0 || ttl_s <= 0) return;
  // etcd may have raised the TTL; never count on more than was asked for.
  const int64_t ttl = std::min(ttl_ms_, ttl_s * 1000);
  valid_until_ms_ = std::max(valid_until_ms_, sent_ms + ttl - margin_ms_);
  renewed_at_ms_ = std::max(renewed_at_ms_, sent_ms);
}

void OwnLease::Lost() {
  id_ = 0;
  valid_until_ms_ = 0;
}

const std::optional<MemberRecord>& MemberView::Record(int index) const {
  static const std::optional<MemberRecord> kNone;
  if (index < 0 || index >= size()) return kNone;
  return records_[static_cast<size_t>(index)];
}

int MemberView::alive_count() const {
  return static_cast<int>(std::count_if(records_.begin(), records_.end(), [](const auto& r) { return r.has_value(); }));
}

namespace {

Result<int> IndexIn(const std::string& key, const std::string& prefix, int size) {
  auto index = MemberIndexOf(key, prefix);
  if (!index || *index >= size) {
    return Error(Code::kCorrupt, "the group key " + key + " is not a member of this group of " + std::to_string(size) +
                                     " (" + prefix + "0 .. " + std::to_string(size - 1) +
                                     "): a member with another [group] size, or something else, wrote it; make "
                                     "every member's group.size agree (wsup check A.toml B.toml ...) and remove "
                                     "the stray key");
  }
  return *index;
}

}  // namespace

Result<std::vector<MemberView::Change>> MemberView::Reset(const std::vector<KeyValue>& kvs, const std::string& prefix,
                                                          int64_t revision) {
  std::vector<std::optional<MemberRecord>> next(records_.size());
  for (const KeyValue& kv : kvs) {
    auto index = IndexIn(kv.key, prefix, size());
    if (!index.ok()) return index.error();
    auto r = DecodeMember(kv.value, *index, kv.lease);
    if (!r.ok()) return r.error();
    next[static_cast<size_t>(*index)] = std::move(*r);
  }
  std::vector<Change> changes;
  for (size_t i = 0; i < next.size(); ++i) {
    if (next[i].has_value() != records_[i].has_value()) changes.push_back({static_cast<int>(i), next[i].has_value()});
  }
  records_ = std::move(next);
  revision_ = revision;
  return changes;
}

Result<std::vector<MemberView::Change>> MemberView::Apply(const std::vector<WatchEvent>& events,
                                                          const std::string& prefix) {
  // Decoded first, applied after: a bad event changes nothing.
  struct Step {
    int index;
    std::optional<MemberRecord> record;
    int64_t revision;
  };
  std::vector<Step> steps;
  for (const WatchEvent& e : events) {
    if (e.kv.mod_revision <= revision_) continue;  // already in the view
    auto index = IndexIn(e.kv.key, prefix, size());
    if (!index.ok()) return index.error();
    Step s{*index, std::nullopt, e.kv.mod_revision};
    if (!e.deleted) {
      auto r = DecodeMember(e.kv.value, *index, e.kv.lease);
      if (!r.ok()) return r.error();
      s.record = std::move(*r);
    }
    steps.push_back(std::move(s));
  }
  std::vector<Change> changes;
  for (Step& s : steps) {
    auto& slot = records_[static_cast<size_t>(s.index)];
    const bool was = slot.has_value();
    slot = std::move(s.record);
    if (slot.has_value() != was) changes.push_back({s.index, slot.has_value()});
    revision_ = std::max(revision_, s.revision);
  }
  return changes;
}

}  // namespace wsup::group
