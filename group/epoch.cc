#include "group/epoch.h"

#include <nlohmann/json.hpp>

namespace wsup::group {

using nlohmann::json;

const char* SideName(Side s) { return s == Side::kPrimary ? "primary" : "standby"; }

std::string EpochKey(const std::string& group) { return "/wsup/groups/" + group + "/epoch"; }

std::string EncodeEpoch(const EpochRecord& r) {
  return json{{"epoch", r.epoch}, {"active", SideName(r.active)}, {"by", r.by}, {"trigger", r.trigger}}.dump();
}

Result<EpochRecord> DecodeEpoch(std::string_view value, int64_t mod_revision) {
  auto bad = [&](const std::string& what) {
    return Error(Code::kCorrupt, "the group's epoch record " + std::string(value.substr(0, 200)) + ": " + what +
                                     "; it is written only by wsup supervisors: remove the key if something else "
                                     "wrote it");
  };
  json j = json::parse(value, nullptr, false);
  if (!j.is_object()) return bad("not a JSON object");
  if (!j.contains("epoch") || !j["epoch"].is_number_integer() || j["epoch"].get<int64_t>() < 1) {
    return bad("\"epoch\" is not a positive integer");
  }
  const std::string active = j.value("active", "");
  if (active != "primary" && active != "standby") return bad("\"active\" is neither \"primary\" nor \"standby\"");
  EpochRecord r;
  r.epoch = j["epoch"].get<int64_t>();
  r.active = active == "primary" ? Side::kPrimary : Side::kStandby;
  r.by = j.contains("by") && j["by"].is_number_integer() ? j["by"].get<int>() : -1;
  r.trigger = j.contains("trigger") && j["trigger"].is_string() ? j["trigger"].get<std::string>() : "";
  r.mod_revision = mod_revision;
  return r;
}

bool EpochTracker::Observe(const EpochRecord& record) {
  if (applied_ && record.epoch <= applied_->epoch) {
    // The same epoch seen again (its own proposal's echo): only the
    // revision may be news.
    if (record.epoch == applied_->epoch && record.mod_revision > applied_->mod_revision) {
      applied_->mod_revision = record.mod_revision;
    }
    return false;
  }
  applied_ = record;
  return true;
}

std::optional<EpochTracker::Proposal> EpochTracker::Propose(Side dead, const std::string& trigger) {
  if (!applied_ || proposing_ || dead != applied_->active) return std::nullopt;
  Proposal p;
  p.expect_mod_revision = applied_->mod_revision;
  p.next.epoch = applied_->epoch + 1;
  p.next.active = Other(dead);
  p.next.by = member_;
  p.next.trigger = trigger;
  proposing_ = true;
  return p;
}

bool EpochTracker::Proposed(const EpochRecord& current) {
  proposing_ = false;
  return Observe(current);
}

}  // namespace wsup::group
