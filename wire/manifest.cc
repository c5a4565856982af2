#include "wire/manifest.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string_view>

#include "checkpoint/checkpoint.h"
#include "wire/manifest_detail.h"

namespace wsup {

namespace manifest_detail {

std::string EntryName(size_t i, const std::string& name) {
  std::string shown = name.size() > 80 ? name.substr(0, 80) + "..." : name;
  return "manifest entry " + std::to_string(i) + " ('" + shown + "')";
}

Error Bad(const std::string& what, std::string_view fix) {
  constexpr const char* kFix =
      ": the sender is broken or not a wsup holder of this version; restart the holder that sent "
      "it, and run the same wsup version on both sides";
  return Corrupt(what + (fix.empty() ? std::string(kFix) : std::string(fix)));
}

// Strides equal to the contiguous ones are dropped: one layout, one spelling.
void Canonicalize(ManifestEntry* e) {
  if (!e->strides.empty() && e->strides == ContiguousStrides(e->shape)) e->strides.clear();
}

bool AnyStrided(const std::vector<ManifestEntry>& entries) {
  return std::any_of(entries.begin(), entries.end(), [](const ManifestEntry& e) { return !e.strides.empty(); });
}

}  // namespace manifest_detail

using namespace manifest_detail;

namespace {

// Bounds well past any real model, so that a hostile manifest cannot make a
// client reserve absurd address ranges or loop for long.
constexpr int kManifestVersion = 1;
constexpr uint64_t kMaxAllocations = 4096;
constexpr uint64_t kMaxAllocationBytes = 1ull << 40;  // 1 TiB
constexpr size_t kMaxNameBytes = 1024;
constexpr uint64_t kPageBytes = 4096;
constexpr int kMaxDevice = 1023;
constexpr const char* kEntryFields[] = {"name", "dtype", "shape", "alloc", "offset", "nbytes"};
// With strides (an engine-made layout that stores some tensor strided).
constexpr const char* kEntryFieldsStrided[] = {"name", "dtype", "shape", "alloc", "offset", "nbytes", "strides"};
constexpr const char* kTableFormat = "wsup-tensor-table";

bool PrintableName(const std::string& s) {
  for (unsigned char c : s) {
    if (c < 0x20 || c == 0x7f) return false;
  }
  return true;
}

bool IsUuidChar(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F') || c == '-';
}

Status ValidateDevice(const Manifest& m, std::string_view fix) {
  if (m.backend == "host") {
    if (m.device != -1) {
      return Bad("manifest: field 'device' is " + std::to_string(m.device) +
                 " but a host arena has device -1", fix);
    }
    if (m.device_uuid != "host") {
      return Bad("manifest: field 'device_uuid' is '" + m.device_uuid.substr(0, 64) +
                 "' but a host arena has 'host'", fix);
    }
    return {};
  }
  if (m.backend == "cuda") {
    if (m.device < 0 || m.device > kMaxDevice) {
      return Bad("manifest: field 'device' is " + std::to_string(m.device) + ", not a cuda ordinal in 0.." +
                 std::to_string(kMaxDevice), fix);
    }
    const std::string& u = m.device_uuid;
    bool ok = u.size() > 4 && u.size() <= 128 && (u.rfind("GPU-", 0) == 0 || u.rfind("MIG-", 0) == 0) &&
              std::all_of(u.begin() + 4, u.end(), IsUuidChar);
    if (!ok) {
      return Bad("manifest: field 'device_uuid' is '" + u.substr(0, 64) +
                 "', not a GPU uuid like GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", fix);
    }
    return {};
  }
  return Bad("manifest: field 'backend' is '" + m.backend.substr(0, 64) + "', expected 'host' or 'cuda'", fix);
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

std::vector<int64_t> ContiguousStrides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> out(shape.size(), 1);
  for (size_t d = shape.size(); d-- > 1;) out[d - 1] = out[d] * std::max<int64_t>(shape[d], 1);
  return out;
}

// ---------------------------------------------------------------- TensorIndex

namespace {

constexpr uint64_t kTagMask = 0xffffffff00000000ull;

uint64_t HashName(std::string_view name) { return std::hash<std::string_view>{}(name); }

}  // namespace

void TensorIndex::Clear() {
  slots_.clear();
  by_name_.clear();
  mask_ = 0;
}

bool TensorIndex::Build(const std::vector<ManifestEntry>& entries, size_t* earlier, size_t* later,
                        uint64_t probe_budget) {
  Clear();
  const size_t n = entries.size();
  if (n == 0) return true;
  size_t capacity = 16;
  while (capacity < 2 * n) capacity <<= 1;  // load at most 1/2: short probes, always an empty slot
  slots_.assign(capacity, 0);
  mask_ = capacity - 1;
  // Linear probing at load 1/2 takes about 2.5 probes per insert; names that
  // collide on purpose blow through this budget long before it gets slow.
  const uint64_t budget = probe_budget == kScaledBudget ? 8 * static_cast<uint64_t>(n) + 1024 : probe_budget;
  uint64_t probes = 0;
  for (size_t i = 0; i < n; ++i) {
    const std::string& name = entries[i].name;
    const uint64_t h = HashName(name);
    const uint64_t tag = h & kTagMask;
    for (uint64_t s = h & mask_;; s = (s + 1) & mask_) {
      if (probes++ >= budget) return BuildSorted(entries, earlier, later);
      const uint64_t v = slots_[s];
      if (v == 0) {
        slots_[s] = tag | (static_cast<uint64_t>(i) + 1);
        break;
      }
      if ((v & kTagMask) == tag) {
        const size_t j = static_cast<size_t>((v & ~kTagMask) - 1);
        if (entries[j].name == name) {
          *earlier = j;
          *later = i;
          Clear();
          return false;
        }
      }
    }
  }
  return true;
}

bool TensorIndex::BuildSorted(const std::vector<ManifestEntry>& entries, size_t* earlier, size_t* later) {
  // O(n log n) whatever the names.
  const size_t n = entries.size();
  slots_.clear();
  mask_ = 0;
  by_name_.resize(n);
  std::iota(by_name_.begin(), by_name_.end(), 0u);
  std::sort(by_name_.begin(), by_name_.end(), [&](uint32_t a, uint32_t b) {
    int c = entries[a].name.compare(entries[b].name);
    return c < 0 || (c == 0 && a < b);
  });
  for (size_t k = 1; k < n; ++k) {
    if (entries[by_name_[k - 1]].name == entries[by_name_[k]].name) {
      *earlier = by_name_[k - 1];
      *later = by_name_[k];
      Clear();
      return false;
    }
  }
  return true;
}

size_t TensorIndex::Find(std::string_view name, const std::vector<ManifestEntry>& entries) const {
  if (!by_name_.empty()) {
    auto it = std::lower_bound(by_name_.begin(), by_name_.end(), name,
                               [&](uint32_t a, std::string_view n) { return entries[a].name < n; });
    if (it != by_name_.end() && entries[*it].name == name) return *it;
    return npos;
  }
  if (slots_.empty()) return npos;
  const uint64_t h = HashName(name);
  const uint64_t tag = h & kTagMask;
  for (uint64_t s = h & mask_;; s = (s + 1) & mask_) {
    const uint64_t v = slots_[s];
    if (v == 0) return npos;
    if ((v & kTagMask) == tag) {
      const size_t j = static_cast<size_t>((v & ~kTagMask) - 1);
      if (j < entries.size() && entries[j].name == name) return j;
    }
  }
}

// ---------------------------------------------------------------- Validate

Status Manifest::Validate(TensorIndex* index, std::string_view fix) const {
  WSUP_RETURN_IF_ERROR(ValidateLayout(fix));
  TensorIndex local;
  return CheckUniqueNames(index != nullptr ? index : &local, fix);
}

Status Manifest::CheckUniqueNames(TensorIndex* index, std::string_view fix) const {
  if (entries.size() > kMaxEntries) {
    return Bad("manifest: " + std::to_string(entries.size()) + " entries, more than the " +
               std::to_string(kMaxEntries) + " wsup accepts", fix);
  }
  size_t earlier = 0, later = 0;
  if (!index->Build(entries, &earlier, &later)) {
    return Bad(EntryName(later, entries[later].name) + ": field 'name' is a duplicate of entry " +
               std::to_string(earlier), fix);
  }
  return {};
}

Status Manifest::ValidateHeader(std::string_view fix) const {
  WSUP_RETURN_IF_ERROR(ValidateDevice(*this, fix));

  if (allocations.empty()) return Bad("manifest: no allocations", fix);
  if (allocations.size() > kMaxAllocations) {
    return Bad("manifest: " + std::to_string(allocations.size()) + " allocations, more than the " +
               std::to_string(kMaxAllocations) + " wsup accepts", fix);
  }
  for (size_t i = 0; i < allocations.size(); ++i) {
    uint64_t size = allocations[i].size;
    if (size != 0 && size % kPageBytes == 0 && size <= kMaxAllocationBytes) continue;
    std::string what =
        "manifest allocation " + std::to_string(i) + ": field 'size' = " + std::to_string(size);
    if (size == 0) return Bad(what + " is empty", fix);
    if (size % kPageBytes != 0)
      return Bad(what + " is not a multiple of the " + std::to_string(kPageBytes) + "-byte page", fix);
    return Bad(what + " exceeds the 1 TiB limit on one allocation", fix);
  }
  return {};
}

Status Manifest::ValidateLayout(std::string_view fix) const {
  WSUP_RETURN_IF_ERROR(ValidateHeader(fix));
  if (entries.size() > kMaxEntries) {
    return Bad("manifest: " + std::to_string(entries.size()) + " entries, more than the " +
               std::to_string(kMaxEntries) + " wsup accepts", fix);
  }

  // Holders lay entries out in (allocation, offset) order, so overlaps are
  // found in the same pass by comparing each entry with the previous
  // non-empty one. Entries in any other order are sorted afterwards.
  bool in_layout_order = true;
  size_t prev = TensorIndex::npos;  // the previous non-empty entry
  const std::string* dtype_spelling = nullptr;
  uint64_t esize = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    const ManifestEntry& e = entries[i];
    if (e.name.empty()) return Bad("manifest entry " + std::to_string(i) + ": field 'name' is empty", fix);
    auto who = [&] { return EntryName(i, e.name); };  // built only for a message
    if (e.name.size() > kMaxNameBytes) {
      return Bad(who() + ": field 'name' is " + std::to_string(e.name.size()) + " bytes, more than " +
                 std::to_string(kMaxNameBytes), fix);
    }
    if (!PrintableName(e.name)) return Bad(who() + ": field 'name' has control characters", fix);

    // Most entries share a dtype: parse each spelling once.
    if (dtype_spelling == nullptr || e.dtype != *dtype_spelling) {
      auto dtype = ParseDType(e.dtype);
      if (!dtype.ok()) {
        return Bad(who() + ": field 'dtype' = '" + e.dtype.substr(0, 32) +
                   "' is not a known safetensors dtype", fix);
      }
      esize = DTypeSize(*dtype);
      dtype_spelling = &e.dtype;
    }
    if (e.shape.size() > kMaxRank) {
      return Bad(who() + ": field 'shape' has rank " + std::to_string(e.shape.size()) + ", more than " +
                 std::to_string(kMaxRank), fix);
    }
    uint64_t expect = esize;
    bool empty = false;  // some dimension is 0: the tensor has no element
    for (size_t d = 0; d < e.shape.size(); ++d) {
      if (e.shape[d] < 0) {
        return Bad(who() + ": field 'shape' dimension " + std::to_string(d) + " is negative (" +
                   std::to_string(e.shape[d]) + ")", fix);
      }
      if (e.shape[d] == 0) empty = true;
      if (__builtin_mul_overflow(expect, static_cast<uint64_t>(e.shape[d]), &expect) ||
          expect > kMaxAllocationBytes) {
        return Bad(who() + ": field 'shape' describes more than 1 TiB", fix);
      }
    }
    if (!e.strides.empty()) {
      // The span the strides reach: 1 + sum (shape[d] - 1) x strides[d]
      // elements; a contiguous tensor's span is its element count.
      if (e.strides.size() != e.shape.size()) {
        return Bad(who() + ": field 'strides' has " + std::to_string(e.strides.size()) +
                   " values for a shape of rank " + std::to_string(e.shape.size()), fix);
      }
      uint64_t span = 1;
      for (size_t d = 0; d < e.strides.size() && !empty; ++d) {
        if (e.strides[d] < 0) {
          return Bad(who() + ": field 'strides' dimension " + std::to_string(d) + " is negative (" +
                     std::to_string(e.strides[d]) + ")", fix);
        }
        uint64_t reach = 0;
        if (__builtin_mul_overflow(static_cast<uint64_t>(e.shape[d] - 1), static_cast<uint64_t>(e.strides[d]),
                                   &reach) ||
            __builtin_add_overflow(span, reach, &span) || span > kMaxAllocationBytes) {
          return Bad(who() + ": field 'strides' reaches more than 1 TiB", fix);
        }
      }
      expect = empty ? 0 : span * esize;
      if (e.nbytes != expect) {
        return Bad(who() + ": field 'nbytes' = " + std::to_string(e.nbytes) + " but shape and strides x dtype size (" +
                   e.dtype + ") span " + std::to_string(expect), fix);
      }
    } else if (e.nbytes != expect) {
      return Bad(who() + ": field 'nbytes' = " + std::to_string(e.nbytes) + " but shape x dtype size (" +
                 e.dtype + ") = " + std::to_string(expect), fix);
    }
    if (e.alloc >= allocations.size()) {
      return Bad(who() + ": field 'alloc' = " + std::to_string(e.alloc) + " but there are only " +
                 std::to_string(allocations.size()) + " allocations", fix);
    }
    if (e.offset % kTensorAlignment != 0) {
      return Bad(who() + ": field 'offset' = " + std::to_string(e.offset) + " is not a multiple of " +
                 std::to_string(kTensorAlignment), fix);
    }
    uint64_t size = allocations[e.alloc].size;
    if (e.offset > size || e.nbytes > size - e.offset) {
      return Bad(who() + ": field 'offset' = " + std::to_string(e.offset) + " plus " +
                 std::to_string(e.nbytes) + " bytes ends past allocation " + std::to_string(e.alloc) +
                 " of " + std::to_string(size) + " bytes", fix);
    }
    if (e.nbytes == 0) continue;
    if (in_layout_order && prev != TensorIndex::npos) {
      const ManifestEntry& p = entries[prev];
      if (e.alloc < p.alloc || (e.alloc == p.alloc && e.offset < p.offset)) {
        in_layout_order = false;
      } else if (e.alloc == p.alloc && e.offset < p.offset + p.nbytes) {
        // Ends only grow while nothing overlaps, so the previous entry's end
        // is the furthest any earlier entry reaches.
        return Bad(who() + ": field 'offset' = " + std::to_string(e.offset) + " overlaps " +
                   EntryName(prev, p.name) + ", which ends at " + std::to_string(p.offset + p.nbytes) +
                   " in allocation " + std::to_string(e.alloc), fix);
      }
    }
    prev = i;
  }
  if (in_layout_order) return {};

  // Out of layout order: sort the non-empty entries' positions by
  // (allocation, offset) and compare neighbours.
  std::vector<uint32_t> order;
  order.reserve(entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    if (entries[i].nbytes > 0) order.push_back(static_cast<uint32_t>(i));
  }
  std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    const ManifestEntry& x = entries[a];
    const ManifestEntry& y = entries[b];
    if (x.alloc != y.alloc) return x.alloc < y.alloc;
    if (x.offset != y.offset) return x.offset < y.offset;
    return a < b;
  });
  for (size_t k = 1; k < order.size(); ++k) {
    const ManifestEntry& p = entries[order[k - 1]];
    const ManifestEntry& e = entries[order[k]];
    if (e.alloc == p.alloc && e.offset < p.offset + p.nbytes) {
      return Bad(EntryName(order[k], e.name) + ": field 'offset' = " + std::to_string(e.offset) +
                 " overlaps " + EntryName(order[k - 1], p.name) + ", which ends at " +
                 std::to_string(p.offset + p.nbytes) + " in allocation " + std::to_string(e.alloc), fix);
    }
  }
  return {};
}

namespace {

// Everything but the entries.
nlohmann::json HeaderJson(const Manifest& m) {
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
  return j;
}

}  // namespace

nlohmann::json ManifestHeaderToJson(const Manifest& m, uint64_t table_bytes) {
  nlohmann::json j = HeaderJson(m);
  j["tensor_table"] = {{"format", kTableFormat},
                       {"version", kTensorTableVersion},
                       {"entries", m.entries.size()},
                       {"bytes", table_bytes}};
  return j;
}

nlohmann::json ManifestToJson(const Manifest& m) {
  nlohmann::json j = HeaderJson(m);
  // Entries are arrays in the order entry_fields names: a 20,000-tensor
  // manifest parses several times faster than with one object per entry,
  // and stays readable with the field names beside it.
  // Strides only when some entry has them, so a checkpoint arena's manifest
  // reads as it always did.
  const bool strided = AnyStrided(m.entries);
  nlohmann::json fields = nlohmann::json::array();
  if (strided) {
    for (const char* f : kEntryFieldsStrided) fields.push_back(f);
  } else {
    for (const char* f : kEntryFields) fields.push_back(f);
  }
  j["entry_fields"] = std::move(fields);
  nlohmann::json entries = nlohmann::json::array();
  entries.get_ref<nlohmann::json::array_t&>().reserve(m.entries.size());
  for (const auto& e : m.entries) {
    nlohmann::json row = nlohmann::json::array();
    auto& r = row.get_ref<nlohmann::json::array_t&>();
    r.reserve(strided ? 7 : 6);
    r.emplace_back(e.name);
    r.emplace_back(e.dtype);
    nlohmann::json shape = nlohmann::json::array();
    for (int64_t d : e.shape) shape.get_ref<nlohmann::json::array_t&>().emplace_back(d);
    r.emplace_back(std::move(shape));
    r.emplace_back(e.alloc);
    r.emplace_back(e.offset);
    r.emplace_back(e.nbytes);
    if (strided) {
      nlohmann::json strides = nlohmann::json::array();
      for (int64_t d : e.strides) strides.get_ref<nlohmann::json::array_t&>().emplace_back(d);
      r.emplace_back(std::move(strides));
    }
    entries.get_ref<nlohmann::json::array_t&>().push_back(std::move(row));
  }
  j["entries"] = std::move(entries);
  return j;
}

namespace {

// Who a message is about, formatted only when there is an error.
struct Who {
  const char* kind;                        // "manifest", "manifest allocation", "manifest entry", ...
  size_t index = static_cast<size_t>(-1);  // none for the manifest itself
  const std::string* name = nullptr;
  std::string str() const {
    if (name) return EntryName(index, *name);
    if (index == static_cast<size_t>(-1)) return kind;
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

Result<Manifest> Parse(const nlohmann::json& j, std::string_view table, ManifestDecoding how) {
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

  auto tt = j.find("tensor_table");
  if (tt != j.end()) {
    // The entries come as a binary tensor table beside the JSON.
    if (j.contains("entries")) {
      return Bad("manifest: has both 'entries' and 'tensor_table'; a manifest carries its entries one way");
    }
    const Who tw{"manifest tensor_table"};
    if (!tt->is_object()) return Bad("manifest: field 'tensor_table' is not an object");
    WSUP_ASSIGN_OR_RETURN(std::string format, GetString(*tt, "format", tw));
    if (format != kTableFormat) {
      return Bad("manifest: field 'tensor_table' has format '" + format.substr(0, 64) + "', expected '" +
                 kTableFormat + "'");
    }
    WSUP_ASSIGN_OR_RETURN(uint64_t table_version, GetU64(*tt, "version", tw));
    if (table_version != kTensorTableVersion) {
      return Bad("manifest: the tensor table is version " + std::to_string(table_version) +
                 " but this wsup reads version " + std::to_string(kTensorTableVersion));
    }
    WSUP_ASSIGN_OR_RETURN(uint64_t count, GetU64(*tt, "entries", tw));
    WSUP_ASSIGN_OR_RETURN(uint64_t bytes, GetU64(*tt, "bytes", tw));
    if (table.size() != bytes) {
      return Bad("manifest: the tensor table has " + std::to_string(table.size()) +
                 " bytes but the manifest announces " + std::to_string(bytes) +
                 (table.empty() ? " (no table came with it)" : ""));
    }
    WSUP_ASSIGN_OR_RETURN(uint64_t held, TensorTableEntries(table));
    if (held != count) {
      return Bad("manifest: the tensor table holds " + std::to_string(held) +
                 " entries but the manifest announces " + std::to_string(count));
    }
    if (how == ManifestDecoding::kHeaderOnly) return m;
    WSUP_RETURN_IF_ERROR(DecodeTensorTable(table, &m.entries));
    if (how == ManifestDecoding::kValidated) WSUP_RETURN_IF_ERROR(m.Validate());
    return m;
  }
  if (!table.empty()) {
    return Bad("manifest: a binary tensor table of " + std::to_string(table.size()) +
               " bytes came with a manifest that announces none (no 'tensor_table')");
  }

  WSUP_ASSIGN_OR_RETURN(const nlohmann::json* fields, Field(j, "entry_fields", top));
  const bool strided = fields->is_array() && fields->size() == std::size(kEntryFieldsStrided);
  const size_t nfields = strided ? std::size(kEntryFieldsStrided) : std::size(kEntryFields);
  bool fields_ok = fields->is_array() && fields->size() == nfields;
  for (size_t k = 0; fields_ok && k < nfields; ++k) {
    fields_ok = (*fields)[k].is_string() && (*fields)[k].get_ref<const std::string&>() == kEntryFieldsStrided[k];
  }
  if (!fields_ok) {
    return Bad("manifest: field 'entry_fields' is " + fields->dump().substr(0, 100) +
               ", expected [\"name\",\"dtype\",\"shape\",\"alloc\",\"offset\",\"nbytes\"], optionally "
               "followed by \"strides\"");
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
    if (!row.is_array() || row.size() != nfields) {
      return Bad(who.str() + ": expected an array of " + std::to_string(nfields) +
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
    if (strided) {
      const auto& strides = row[6];
      if (!strides.is_array() || strides.size() > kMaxRank) {
        return FieldError(who, "strides", strides, "an array of at most 8 integers");
      }
      for (const auto& d : strides) {
        if (!IsI64(d)) return FieldError(who, "strides", strides, "an array of integers");
        e.strides.push_back(d.get<int64_t>());
      }
      Canonicalize(&e);
    }
    m.entries.push_back(std::move(e));
  }
  if (how == ManifestDecoding::kValidated) WSUP_RETURN_IF_ERROR(m.Validate());
  return m;
}

}  // namespace

Result<Manifest> ManifestFromJson(const nlohmann::json& j, std::string_view table, ManifestDecoding how) {
  try {
    return Parse(j, table, how);
  } catch (const nlohmann::json::exception& e) {
    return Bad(std::string("manifest: malformed JSON value (") + e.what() + ")");
  }
}

}  // namespace wsup
