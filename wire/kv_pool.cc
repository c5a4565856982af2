#include "wire/kv_pool.h"

#include <nlohmann/json.hpp>
#include <fstream>

#include "wire/message_fields.h"

namespace wsup {

using nlohmann::json;
using namespace wsup::fields;

namespace {

Error Bad(const std::string& what) {
  return Corrupt("'kv_pool' message: " + what +
                 "; the peer does not speak this version of the holder protocol: run the same wsup version on "
                 "both sides");
}

bool IsPoolId(const std::string& s) {
  if (s.size() != 32) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

}  // namespace

uint64_t KvPoolMsg::bytes() const {
  uint64_t n = 0;
  for (uint64_t a : allocations) n += a;
  return n;
}

std::string MakeKvPoolId() {
  unsigned char b[16] = {};
  std::ifstream in("/dev/urandom", std::ios::binary);
  in.read(reinterpret_cast<char*>(b), sizeof b);
  static const char* kHex = "0123456789abcdef";
  std::string s;
  for (unsigned char c : b) {
    s += kHex[c >> 4];
    s += kHex[c & 15];
  }
  return s;
}

json EncodeKvPoolRequest() { return {{"type", "kv_pool"}}; }

json EncodeKvPool(const KvPoolMsg& m) {
  return {{"type", "kv_pool"},       {"id", m.id},
          {"backend", m.backend},    {"device", m.device},
          {"device_uuid", m.device_uuid}, {"allocations", m.allocations}};
}

Result<KvPoolMsg> DecodeKvPool(const json& j) {
  KvPoolMsg m;
  WSUP_ASSIGN_OR_RETURN(m.id, GetString(j, "kv_pool", "id"));
  if (!IsPoolId(m.id)) return Bad("field 'id' is not 32 lower-case hex digits");
  WSUP_ASSIGN_OR_RETURN(m.backend, GetString(j, "kv_pool", "backend"));
  if (m.backend != "host" && m.backend != "cuda") {
    return Bad("field 'backend' is '" + m.backend.substr(0, 32) + "', expected host or cuda");
  }
  WSUP_ASSIGN_OR_RETURN(int64_t device, GetI64(j, "kv_pool", "device"));
  if (device < -1 || device > 1023) return Bad("field 'device' = " + std::to_string(device) + " is out of range");
  if ((m.backend == "host") != (device == -1)) {
    return Bad("field 'device' = " + std::to_string(device) + " does not go with backend " + m.backend);
  }
  m.device = static_cast<int>(device);
  WSUP_ASSIGN_OR_RETURN(m.device_uuid, GetString(j, "kv_pool", "device_uuid"));
  if (m.device_uuid.empty() || m.device_uuid.size() > 64 || HasControlChars(m.device_uuid)) {
    return Bad("field 'device_uuid' is empty, longer than 64 bytes or has control characters");
  }
  auto it = j.find("allocations");
  if (it == j.end() || !it->is_array()) return FieldError("kv_pool", "allocations", "an array");
  if (it->empty() || it->size() > kMaxKvPoolAllocations) {
    return Bad("field 'allocations' has " + std::to_string(it->size()) + " entries; a pool has 1 to " +
               std::to_string(kMaxKvPoolAllocations));
  }
  uint64_t total = 0;
  for (const auto& a : *it) {
    if (!a.is_number_unsigned() || a.get<uint64_t>() == 0 || a.get<uint64_t>() > kMaxKvPoolBytes) {
      return Bad("an allocation size is not an integer from 1 to " + std::to_string(kMaxKvPoolBytes));
    }
    total += a.get<uint64_t>();
    if (total > kMaxKvPoolBytes) {
      return Bad("the allocations add up to more than " + std::to_string(kMaxKvPoolBytes) + " bytes");
    }
    m.allocations.push_back(a.get<uint64_t>());
  }
  return m;
}

}  // namespace wsup
