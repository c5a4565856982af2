#include "wire/kv_pool.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <cerrno>
#include <nlohmann/json.hpp>

#include "common/random_id.h"
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

std::string MakeKvPoolId() { return RandomHexId(); }

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

Status CheckKvPoolFd(const std::string& backend, size_t index, int fd, uint64_t size) {
  const std::string what = "KV pool allocation " + std::to_string(index);
  if (fd < 0) return InvalidArgument(what + ": no fd");
  if (backend != "host") return {};  // a VMM handle is checked when it is imported
  int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0) {
    return ErrnoError(what + ": fd " + std::to_string(fd) +
                          " is not a memfd (F_GET_SEALS); a KV pool is made by wsup-holder --kv-pool-mib",
                      errno);
  }
  if ((seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW)) {
    return Refused(what + ": the memfd is not sealed against shrinking and growing, so a mapping of it could "
                          "fault; use the pool a wsup holder made");
  }
  if (seals & F_SEAL_WRITE) {
    return Refused(what + ": the memfd is sealed against writing, so it cannot hold a KV cache; it is a weight "
                          "arena, not a KV pool");
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoError(what + ": fstat", errno);
  if (static_cast<uint64_t>(st.st_size) < size) {
    return Mismatch(what + ": the memfd holds " + std::to_string(st.st_size) + " bytes but the pool says " +
                    std::to_string(size) + "; the fds and the description come from different pools: ask again");
  }
  return {};
}

}  // namespace wsup
