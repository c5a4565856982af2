#include "client/manifest.h"

#include <algorithm>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <string_view>
#include <tuple>
#include <unordered_set>

#include "holder/checkpoint.h"

namespace wsup {
namespace {

// Bounds well past any real model, so that a hostile manifest cannot make a
// client reserve absurd address ranges or loop for long.
constexpr int kManifestVersion = 1;
constexpr uint64_t kMaxAllocations = 4096;
constexpr uint64_t kMaxAllocationBytes = 1ull << 40;  // 1 TiB
constexpr uint64_t kMaxEntries = 4'000'000;
constexpr size_t kMaxNameBytes = 1024;
constexpr size_t kMaxRank = 8;
constexpr uint64_t kPageBytes = 4096;
constexpr int kMaxDevice = 1023;
constexpr const char* kEntryFields[] = {"name", "dtype", "shape", "alloc", "offset", "nbytes"};

constexpr const char* kFix =
    ": the sender is broken or not a wsup holder of this version; restart the holder that sent "
    "it, and run the same wsup version on both sides";

std::string EntryName(size_t i, const std::string& name) {
  std::string shown = name.size() > 80 ? name.substr(0, 80) + "..." : name;
  return "manifest entry " + std::to_string(i) + " ('" + shown + "')";
}

Error Bad(const std::string& what) { return Corrupt(what + kFix); }

bool PrintableName(const std::string& s) {
  for (unsigned char c : s) {
    if (c < 0x20 || c == 0x7f) return false;
  }
  return true;
}

bool IsUuidChar(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F') || c == '-';
}

Status ValidateDevice(const Manifest& m) {
  if (m.backend == "host") {
    if (m.device != -1) {
      return Bad("manifest: field 'device' is " + std::to_string(m.device) +
                 " but a host arena has device -1");
    }
    if (m.device_uuid != "host") {
      return Bad("manifest: field 'device_uuid' is '" + m.device_uuid.substr(0, 64) +
                 "' but a host arena has 'host'");
    }
    return {};
  }
  if (m.backend == "cuda") {
    if (m.device < 0 || m.device > kMaxDevice) {
      return Bad("manifest: field 'device' is " + std::to_string(m.device) + ", not a cuda ordinal in 0.." +
                 std::to_string(kMaxDevice));
    }
    const std::string& u = m.device_uuid;
    bool ok = u.size() > 4 && u.size() <= 128 && (u.rfind("GPU-", 0) == 0 || u.rfind("MIG-", 0) == 0) &&
              std::all_of(u.begin() + 4, u.end(), IsUuidChar);
    if (!ok) {
      return Bad("manifest: field 'device_uuid' is '" + u.substr(0, 64) +
                 "', not a GPU uuid like GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx");
    }
    return {};
  }
  return Bad("manifest: field 'backend' is '" + m.backend.substr(0, 64) + "', expected 'host' or 'cuda'");
}

}  // namespace

uint64_t Manifest::total_bytes() const {
  uint64_t sum = 0;
  for (const auto& e : entries) sum += e.nbytes;
  return sum;
}

uint64_t Manifest::arena_bytes() const {
  uint64_t sum = 0;
  for (const auto& a : allocations) sum += a.size;
  return sum;
}

Status Manifest::Validate() const {
  WSUP_RETURN_IF_ERROR(ValidateDevice(*this));

  if (allocations.empty()) return Bad("manifest: no allocations");
  if (allocations.size() > kMaxAllocations) {
    return Bad("manifest: " + std::to_string(allocations.size()) + " allocations, more than the " +
               std::to_string(kMaxAllocations) + " wsup accepts");
  }
  uint64_t total = 0;
  for (size_t i = 0; i < allocations.size(); ++i) {
    uint64_t size = allocations[i].size;
    std::string what =
        "manifest allocation " + std::to_string(i) + ": field 'size' = " + std::to_string(size);
    if (size == 0) return Bad(what + " is empty");
    if (size % kPageBytes != 0)
      return Bad(what + " is not a multiple of the " + std::to_string(kPageBytes) + "-byte page");
    if (size > kMaxAllocationBytes) return Bad(what + " exceeds the 1 TiB limit on one allocation");
    total += size;  // cannot overflow: at most 4096 x 2^40
  }
  (void)total;

  if (entries.size() > kMaxEntries) {
    return Bad("manifest: " + std::to_string(entries.size()) + " entries, more than the " +
               std::to_string(kMaxEntries) + " wsup accepts");
  }

  std::unordered_set<std::string_view> names;
  names.reserve(entries.size());
  // (offset, end, entry index) of every non-empty entry, per allocation.
  std::vector<std::vector<std::tuple<uint64_t, uint64_t, size_t>>> spans(allocations.size());
  uint64_t esize = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    const ManifestEntry& e = entries[i];
    if (e.name.empty()) return Bad("manifest entry " + std::to_string(i) + ": field 'name' is empty");
    auto who = [&] { return EntryName(i, e.name); };  // built only for a message
    if (e.name.size() > kMaxNameBytes) {
      return Bad(who() + ": field 'name' is " + std::to_string(e.name.size()) + " bytes, more than " +
                 std::to_string(kMaxNameBytes));
    }
    if (!PrintableName(e.name)) return Bad(who() + ": field 'name' has control characters");
    if (!names.insert(e.name).second) return Bad(who() + ": field 'name' is a duplicate of an earlier entry");

    // Most entries share a dtype: parse each spelling once.
    if (i == 0 || e.dtype != entries[i - 1].dtype) {
      auto dtype = ParseDType(e.dtype);
      if (!dtype.ok()) {
        return Bad(who() + ": field 'dtype' = '" + e.dtype.substr(0, 32) +
                   "' is not a known safetensors dtype");
      }
      esize = DTypeSize(*dtype);
    }
    if (e.shape.size() > kMaxRank) {
      return Bad(who() + ": field 'shape' has rank " + std::to_string(e.shape.size()) + ", more than " +
                 std::to_string(kMaxRank));
    }
    uint64_t expect = esize;
    for (size_t d = 0; d < e.shape.size(); ++d) {
      if (e.shape[d] < 0) {
        return Bad(who() + ": field 'shape' dimension " + std::to_string(d) + " is negative (" +
                   std::to_string(e.shape[d]) + ")");
      }
      if (__builtin_mul_overflow(expect, static_cast<uint64_t>(e.shape[d]), &expect) ||
          expect > kMaxAllocationBytes) {
        return Bad(who() + ": field 'shape' describes more than 1 TiB");
      }
    }
    if (e.nbytes != expect) {
      return Bad(who() + ": field 'nbytes' = " + std::to_string(e.nbytes) + " but shape x dtype size (" +
                 e.dtype + ") = " + std::to_string(expect));
    }
    if (e.alloc >= allocations.size()) {
      return Bad(who() + ": field 'alloc' = " + std::to_string(e.alloc) + " but there are only " +
                 std::to_string(allocations.size()) + " allocations");
    }
    if (e.offset % kTensorAlignment != 0) {
      return Bad(who() + ": field 'offset' = " + std::to_string(e.offset) + " is not a multiple of " +
                 std::to_string(kTensorAlignment));
    }
    uint64_t size = allocations[e.alloc].size;
    if (e.offset > size || e.nbytes > size - e.offset) {
      return Bad(who() + ": field 'offset' = " + std::to_string(e.offset) + " plus " +
                 std::to_string(e.nbytes) + " bytes ends past allocation " + std::to_string(e.alloc) +
                 " of " + std::to_string(size) + " bytes");
    }
    if (e.nbytes > 0) spans[e.alloc].emplace_back(e.offset, e.offset + e.nbytes, i);
  }

  for (size_t a = 0; a < spans.size(); ++a) {
    auto& s = spans[a];
    std::sort(s.begin(), s.end());
    for (size_t k = 1; k < s.size(); ++k) {
      const auto& [prev_off, prev_end, prev_i] = s[k - 1];
      const auto& [off, end, i] = s[k];
      (void)prev_off;
      (void)end;
      if (off < prev_end) {
        return Bad(EntryName(i, entries[i].name) + ": field 'offset' = " + std::to_string(off) +
                   " overlaps " + EntryName(prev_i, entries[prev_i].name) + ", which ends at " +
                   std::to_string(prev_end) + " in allocation " + std::to_string(a));
      }
    }
  }
  return {};
}

nlohmann::json ManifestToJson(const Manifest& m) {
  nlohmann::json j = nlohmann::json::object();
  j["version"] = kManifestVersion;
  j["backend"] = m.backend;
  j["device"] = m.device;
  j["device_uuid"] = m.device_uuid;
  nlohmann::json allocs = nlohmann::json::array();
  for (const auto& a : m.allocations) {
    nlohmann::json o = nlohmann::json::object();
    o["size"] = a.size;
    allocs.push_back(std::move(o));
  }
  j["allocations"] = std::move(allocs);
  // Entries are arrays in the order entry_fields names: a 20,000-tensor
  // manifest parses several times faster than with one object per entry,
  // and stays readable with the field names beside it.
  nlohmann::json fields = nlohmann::json::array();
  for (const char* f : kEntryFields) fields.push_back(f);
  j["entry_fields"] = std::move(fields);
  nlohmann::json entries = nlohmann::json::array();
  entries.get_ref<nlohmann::json::array_t&>().reserve(m.entries.size());
  for (const auto& e : m.entries) {
    nlohmann::json row = nlohmann::json::array();
    auto& r = row.get_ref<nlohmann::json::array_t&>();
    r.reserve(6);
    r.emplace_back(e.name);
    r.emplace_back(e.dtype);
    nlohmann::json shape = nlohmann::json::array();
    for (int64_t d : e.shape) shape.get_ref<nlohmann::json::array_t&>().emplace_back(d);
    r.emplace_back(std::move(shape));
    r.emplace_back(e.alloc);
    r.emplace_back(e.offset);
    r.emplace_back(e.nbytes);
    entries.get_ref<nlohmann::json::array_t&>().push_back(std::move(row));
  }
  j["entries"] = std::move(entries);
  return j;
}

namespace {

// Who a message is about, formatted only when there is an error.
struct Who {
  const char* kind;  // "manifest", "manifest allocation", "manifest entry"
  size_t index = 0;
  const std::string* name = nullptr;
  std::string str() const {
    if (name) return EntryName(index, *name);
    if (std::string(kind) == "manifest") return kind;
    return std::string(kind) + " " + std::to_string(index);
  }
};

Error FieldError(const Who& who, const char* key, const nlohmann::json& v, const char* expected) {
  return Bad(who.str() + ": field '" + key + "' is " + v.dump().substr(0, 40) + ", expected " + expected);
}

bool IsU64(const nlohmann::json& v) {
  // A non-negative integer built in code (not parsed from text) is stored signed.
  return v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0);
}

bool IsI64(const nlohmann::json& v) {
  return v.is_number_integer() &&
         !(v.is_number_unsigned() &&
           v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()));
}

Result<const nlohmann::json*> Field(const nlohmann::json& obj, const char* key, const Who& who) {
  auto it = obj.find(key);
  if (it == obj.end()) return Bad(who.str() + ": field '" + key + "' is missing");
  return &*it;
}

Result<uint64_t> GetU64(const nlohmann::json& obj, const char* key, const Who& who) {
  WSUP_ASSIGN_OR_RETURN(const nlohmann::json* v, Field(obj, key, who));
  if (!IsU64(*v)) return FieldError(who, key, *v, "an unsigned integer");
  return v->get<uint64_t>();
}

Result<int64_t> GetI64(const nlohmann::json& obj, const char* key, const Who& who) {
  WSUP_ASSIGN_OR_RETURN(const nlohmann::json* v, Field(obj, key, who));
  if (!IsI64(*v)) return FieldError(who, key, *v, "an integer");
  return v->get<int64_t>();
}

Result<std::string> GetString(const nlohmann::json& obj, const char* key, const Who& who) {
  WSUP_ASSIGN_OR_RETURN(const nlohmann::json* v, Field(obj, key, who));
  if (!v->is_string()) return FieldError(who, key, *v, "a string");
  return v->get<std::string>();
}

Result<Manifest> Parse(const nlohmann::json& j) {
  const Who top{"manifest"};
  if (!j.is_object()) return Bad("manifest: expected a JSON object, got " + std::string(j.type_name()));
  WSUP_ASSIGN_OR_RETURN(int64_t version, GetI64(j, "version", top));
  if (version != kManifestVersion) {
    return Bad("manifest: field 'version' = " + std::to_string(version) + " but this wsup reads version " +
               std::to_string(kManifestVersion));
  }
  Manifest m;
  WSUP_ASSIGN_OR_RETURN(m.backend, GetString(j, "backend", top));
  WSUP_ASSIGN_OR_RETURN(int64_t device, GetI64(j, "device", top));
  if (device < -1 || device > kMaxDevice) {
    return Bad("manifest: field 'device' = " + std::to_string(device) + " is out of range");
  }
  m.device = static_cast<int>(device);
  WSUP_ASSIGN_OR_RETURN(m.device_uuid, GetString(j, "device_uuid", top));

  WSUP_ASSIGN_OR_RETURN(const nlohmann::json* allocs, Field(j, "allocations", top));
  if (!allocs->is_array()) return Bad("manifest: field 'allocations' is not an array");
  if (allocs->size() > kMaxAllocations) {
    return Bad("manifest: " + std::to_string(allocs->size()) + " allocations, more than the " +
               std::to_string(kMaxAllocations) + " wsup accepts");
  }
  for (size_t i = 0; i < allocs->size(); ++i) {
    const auto& a = (*allocs)[i];
    const Who who{"manifest allocation", i};
    if (!a.is_object()) return Bad(who.str() + ": expected an object");
    ManifestAllocation alloc;
    WSUP_ASSIGN_OR_RETURN(alloc.size, GetU64(a, "size", who));
    m.allocations.push_back(alloc);
  }

  WSUP_ASSIGN_OR_RETURN(const nlohmann::json* fields, Field(j, "entry_fields", top));
  bool fields_ok = fields->is_array() && fields->size() == std::size(kEntryFields);
  for (size_t k = 0; fields_ok && k < std::size(kEntryFields); ++k) {
    fields_ok = (*fields)[k].is_string() && (*fields)[k].get_ref<const std::string&>() == kEntryFields[k];
  }
  if (!fields_ok) {
    return Bad("manifest: field 'entry_fields' is " + fields->dump().substr(0, 100) +
               ", expected [\"name\",\"dtype\",\"shape\",\"alloc\",\"offset\",\"nbytes\"]");
  }

  WSUP_ASSIGN_OR_RETURN(const nlohmann::json* entries, Field(j, "entries", top));
  if (!entries->is_array()) return Bad("manifest: field 'entries' is not an array");
  if (entries->size() > kMaxEntries) {
    return Bad("manifest: " + std::to_string(entries->size()) + " entries, more than the " +
               std::to_string(kMaxEntries) + " wsup accepts");
  }
  m.entries.reserve(entries->size());
  for (size_t i = 0; i < entries->size(); ++i) {
    const auto& row = (*entries)[i];
    Who who{"manifest entry", i};
    if (!row.is_array() || row.size() != std::size(kEntryFields)) {
      return Bad(who.str() + ": expected an array of " + std::to_string(std::size(kEntryFields)) +
                 " fields (entry_fields), got " + row.dump().substr(0, 60));
    }
    ManifestEntry e;
    if (!row[0].is_string()) return FieldError(who, "name", row[0], "a string");
    e.name = row[0].get<std::string>();
    who.name = &e.name;
    if (!row[1].is_string()) return FieldError(who, "dtype", row[1], "a string");
    e.dtype = row[1].get<std::string>();
    const auto& shape = row[2];
    if (!shape.is_array()) return FieldError(who, "shape", shape, "an array");
    if (shape.size() > kMaxRank) {
      return Bad(who.str() + ": field 'shape' has rank " + std::to_string(shape.size()) + ", more than " +
                 std::to_string(kMaxRank));
    }
    e.shape.reserve(shape.size());
    for (const auto& d : shape) {
      if (!IsI64(d)) return FieldError(who, "shape", shape, "an array of integers");
      e.shape.push_back(d.get<int64_t>());
    }
    if (!IsU64(row[3])) return FieldError(who, "alloc", row[3], "an unsigned integer");
    uint64_t alloc = row[3].get<uint64_t>();
    if (alloc >= m.allocations.size()) {
      return Bad(who.str() + ": field 'alloc' = " + std::to_string(alloc) + " but there are only " +
                 std::to_string(m.allocations.size()) + " allocations");
    }
    e.alloc = static_cast<uint32_t>(alloc);
    if (!IsU64(row[4])) return FieldError(who, "offset", row[4], "an unsigned integer");
    e.offset = row[4].get<uint64_t>();
    if (!IsU64(row[5])) return FieldError(who, "nbytes", row[5], "an unsigned integer");
    e.nbytes = row[5].get<uint64_t>();
    m.entries.push_back(std::move(e));
  }
  WSUP_RETURN_IF_ERROR(m.Validate());
  return m;
}

}  // namespace

Result<Manifest> ManifestFromJson(const nlohmann::json& j) {
  try {
    return Parse(j);
  } catch (const nlohmann::json::exception& e) {
    return Bad(std::string("manifest: malformed JSON value (") + e.what() + ")");
  }
}

}  // namespace wsup
