#include "wire/kv_pool_record.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "common/fs.h"
#include "wire/message_fields.h"
#include "wire/protocol.h"

namespace wsup {

using nlohmann::json;
using namespace wsup::fields;

namespace {

constexpr const char* kFormat = "wsup-kv-pool-record";
// A pool of kMaxKvPoolAllocations entries is well under this.
constexpr size_t kMaxRecordFileBytes = 1u << 20;

Error Damaged(const std::string& why) {
  return Corrupt("the KV pool record " + why + "; it is damaged or from another wsup version");
}

bool IsFdNumber(const json& v) {
  return v.is_number_integer() && v.get<int64_t>() >= 3 && v.get<int64_t>() <= (1 << 30);
}

}  // namespace

json KvPoolRecordToJson(const KvPoolRecord& r) {
  json pool = EncodeKvPool(r.pool);
  pool.erase("type");
  return {{"format", kFormat}, {"version", kKvPoolRecordVersion}, {"pool", std::move(pool)}, {"fds", r.fds}};
}

Result<KvPoolRecord> KvPoolRecordFromJson(const json& j) {
  if (!j.is_object() || GetStringOr(j, "format", "") != kFormat) {
    return Corrupt(std::string("not a wsup KV pool record (no \"format\": \"") + kFormat +
                   "\"); pass the file the supervisor wrote for --adopt-kv-pool");
  }
  auto version = j.find("version");
  if (version == j.end() || !version->is_number_integer() ||
      version->get<int64_t>() != kKvPoolRecordVersion) {
    return Corrupt("a KV pool record of version " +
                   (version == j.end() ? std::string("(none)") : version->dump()) +
                   ", this holder reads version " + std::to_string(kKvPoolRecordVersion) +
                   "; run the same wsup version for the supervisor and the holder");
  }
  auto pool = j.find("pool");
  if (pool == j.end() || !pool->is_object()) return Damaged("has no 'pool' object");
  KvPoolRecord r;
  auto msg = DecodeKvPool(*pool);
  if (!msg.ok()) return msg.error().With("the KV pool record's 'pool'");
  r.pool = std::move(msg).value();
  auto fds = j.find("fds");
  if (fds == j.end() || !fds->is_array()) return Damaged("has no 'fds' array");
  for (const auto& v : *fds) {
    if (!IsFdNumber(v)) {
      return Damaged("names " + v.dump().substr(0, 32) + " in 'fds', not an inherited fd number (3 or more)");
    }
    int fd = static_cast<int>(v.get<int64_t>());
    if (std::find(r.fds.begin(), r.fds.end(), fd) != r.fds.end()) {
      return Damaged("names fd " + std::to_string(fd) + " twice; each allocation needs its own inherited fd");
    }
    r.fds.push_back(fd);
  }
  if (r.fds.size() != r.pool.allocations.size()) {
    return Damaged("names " + std::to_string(r.fds.size()) + " fds for " +
                   std::to_string(r.pool.allocations.size()) +
                   " allocations; a pool needs one fd per allocation, in allocation order");
  }
  return r;
}

std::vector<int> KvPoolRecordNamedFds(const json& j) {
  std::vector<int> out;
  if (!j.is_object()) return out;
  auto it = j.find("fds");
  if (it == j.end() || !it->is_array()) return out;
  for (const auto& v : *it) {
    if (!IsFdNumber(v)) continue;
    int fd = static_cast<int>(v.get<int64_t>());
    if (std::find(out.begin(), out.end(), fd) == out.end()) out.push_back(fd);
  }
  return out;
}

Status WriteKvPoolRecord(const std::string& path, const KvPoolRecord& r) {
  std::string text;
  try {
    text = KvPoolRecordToJson(r).dump(-1, ' ', false, json::error_handler_t::replace);
  } catch (const std::exception& e) {
    return Internal(path + ": cannot serialize the KV pool record: " + e.what());
  }
  return WriteFileAtomic(path, text + "\n", 0600);
}

Result<KvPoolRecord> ReadKvPoolRecord(const std::string& path) {
  WSUP_ASSIGN_OR_RETURN(std::string text, ReadFile(path, kMaxRecordFileBytes));
  auto j = ParseMessageBody(text, path);
  if (!j.ok()) return j.error();
  auto r = KvPoolRecordFromJson(*j);
  if (!r.ok()) return r.error().With(path);
  return r;
}

std::vector<int> ReadKvPoolRecordNamedFds(const std::string& path) {
  auto text = ReadFile(path, kMaxRecordFileBytes);
  if (!text.ok()) return {};
  auto j = ParseMessageBody(*text, path);
  if (!j.ok()) return {};
  return KvPoolRecordNamedFds(*j);
}

}  // namespace wsup
