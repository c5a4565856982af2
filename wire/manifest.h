// Manifest: what an arena holds and where. Sent by the holder with the arena
// fds (one fd per allocation, in allocation order) and kept by anyone who
// keeps those fds (the supervisor, a restarted holder).
//
// Cost of attaching grows with the number of allocations, not of tensors:
// a client imports and maps each allocation once, then builds a
// name -> (allocation, offset) table.
//
// Two encodings of the same manifest:
//   JSON (ManifestToJson): the whole manifest, one array per entry. The arena
//     record a keeper writes uses it, and so do clients that do not ask for
//     the binary table.
//   JSON header + binary tensor table (ManifestHeaderToJson +
//     EncodeTensorTable): the header names the backend, the device and the
//     allocations and announces the table; the table holds the entries as
//     fixed-size little-endian records plus one string area. An attach
//     reply to a client that asks for it carries the table beside its JSON
//     (wire/protocol.h), because 20,000 entries decode from it in a small
//     fraction of the time JSON takes.
// Both decoders check every size and bound before reading, and then
// Validate() the result.
//
// Tensor table, version 1 (all integers little-endian):
//   header, 64 bytes:  "wsupTTBL", u32 version, u32 header bytes (64),
//                      u32 record bytes (32), u32 flags (0, or 1 when
//                      some entry has strides), u64 entries,
//                      u64 dims, u64 string bytes, u64 total bytes, u64 0
//   records, 32 bytes each, in entry order:
//                      u64 offset, u64 nbytes, u32 alloc, u32 name offset,
//                      u16 name length, u8 dtype length, u8 rank,
//                      u32 dtype offset
//   dims, i64 each:    the shapes, entry after entry (rank dims each); with
//                      header flag 1 (kTableFlagStrides), each entry's
//                      shape is followed by its strides (2 x rank dims)
//   strings:           names and dtype spellings, referred to by offset
// total bytes = 64 + 32 x entries + 8 x dims + string bytes, exactly.
//
// Thread-safety: values; TensorIndex is immutable once built.
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace wsup {

struct ManifestEntry {
  std::string name;
  std::string dtype;            // safetensors spelling: "F32", "BF16", "F8_E4M3", ...
  std::vector<int64_t> shape;   // the rank's local shape
  uint32_t alloc = 0;           // index into Manifest::allocations
  uint64_t offset = 0;          // byte offset in that allocation, aligned to kTensorAlignment
  uint64_t nbytes = 0;
  // Element strides, one per dimension; empty: contiguous row-major (what
  // every checkpoint arena holds). Engine-made layouts may store a tensor
  // strided (a transposed or padded matrix); nbytes is then the span its
  // shape and strides reach: (1 + sum (shape[d] - 1) x strides[d]) x dtype
  // size. Decoders leave strides empty when they equal the contiguous ones,
  // so one layout has one spelling.
  std::vector<int64_t> strides;
};

struct ManifestAllocation {
  uint64_t size = 0;  // bytes, a multiple of the backend's granularity
};

// Name -> position in a vector of entries. One open-addressing array (no
// allocation per entry), so building it is linear and a lookup is O(1). A
// set of names made to collide cannot make it quadratic: past a fixed probe
// budget the build gives up on hashing and sorts instead (O(n log n) to
// build, O(log n) per lookup). Positions only: the entries it was built over
// must be passed to Find() and must not change in between.
class TensorIndex {
 public:
  static constexpr size_t npos = static_cast<size_t>(-1);
  // The default probe budget: 8 probes per entry (plus a little), where
  // about 2.5 are expected.
  static constexpr uint64_t kScaledBudget = static_cast<uint64_t>(-1);

  // Indexes `entries` (at most 2^32 - 2) by name. Returns false when two
  // entries share a name, with their positions in *earlier < *later; the
  // index is then empty. `probe_budget` is how many slot probes hashing may
  // take before it gives up and sorts (tests pass 0 to force sorting).
  bool Build(const std::vector<ManifestEntry>& entries, size_t* earlier, size_t* later,
             uint64_t probe_budget = kScaledBudget);
  // The position of the entry named `name`, or npos.
  size_t Find(std::string_view name, const std::vector<ManifestEntry>& entries) const;
  void Clear();
  // True when the build fell back to sorting (names that collide).
  bool sorted() const { return !by_name_.empty(); }

 private:
  bool BuildSorted(const std::vector<ManifestEntry>& entries, size_t* earlier, size_t* later);
  std::vector<uint64_t> slots_;    // 0: empty; else (hash >> 32) << 32 | (position + 1)
  std::vector<uint32_t> by_name_;  // the fallback: positions ordered by name
  uint64_t mask_ = 0;
};

struct Manifest {
  static constexpr uint64_t kTensorAlignment = 256;

  std::string backend;      // "host" or "cuda"
  int device = -1;          // cuda ordinal on the holder's machine; -1 for host
  std::string device_uuid;  // "GPU-..." for cuda, "host" for host
  std::vector<ManifestAllocation> allocations;
  std::vector<ManifestEntry> entries;

  uint64_t total_bytes() const;  // sum of entries' nbytes
  uint64_t arena_bytes() const;  // sum of allocations' sizes

  // Checks internal consistency (entries inside their allocation, aligned,
  // no overlaps, unique names, a known dtype, nbytes == the span of shape
  // and strides x dtype size) so that a manifest from a socket or a file
  // can be trusted before any mapping. O(n) for entries in layout order (as
  // holders write them), O(n log n) otherwise; no allocation per entry.
  // With `index`, the name index built for the uniqueness check is kept
  // there. Errors are kCorrupt and end with `fix`; empty: the words for a
  // manifest a holder sent ("the sender is broken ..."). A holder checking
  // a writer's commit passes its own.
  Status Validate(TensorIndex* index = nullptr, std::string_view fix = {}) const;
  // Everything Validate() checks except that names are unique, which
  // TensorIndex::Build() finds (see CheckUniqueNames).
  Status ValidateLayout(std::string_view fix = {}) const;
  // The part of ValidateLayout() that does not look at entries: backend,
  // device and allocations; enough to map the allocations safely.
  Status ValidateHeader(std::string_view fix = {}) const;
  // Builds `index` over the entries; a duplicate name is an error that names
  // both entries.
  Status CheckUniqueNames(TensorIndex* index, std::string_view fix = {}) const;
};

nlohmann::json ManifestToJson(const Manifest& m);

// How much of a manifest ManifestFromJson() decodes and checks.
enum class ManifestDecoding {
  kValidated,    // everything, then Validate()
  kUnvalidated,  // everything; the caller validates (MappedArena::Map() does)
  // Everything but the entries of an announced tensor table: the
  // announcement is checked against the table's own header (size, count),
  // and the entries are left to MappedArena::Map(manifest, fds, device,
  // stats, table), which decodes them while it maps. JSON entries are
  // decoded, unvalidated.
  kHeaderOnly,
};

// Parses a manifest; errors name the entry and the field. The entries come
// from the JSON's "entries", or, when it announces a "tensor_table", from
// `table` (DecodeTensorTable).
Result<Manifest> ManifestFromJson(const nlohmann::json& j, std::string_view table = {},
                                  ManifestDecoding how = ManifestDecoding::kValidated);

// The manifest without its entries, announcing a binary tensor table of
// `table_bytes` bytes for them (the output of EncodeTensorTable(m)).
nlohmann::json ManifestHeaderToJson(const Manifest& m, uint64_t table_bytes);

inline constexpr uint32_t kTensorTableVersion = 1;
// Header flag: every entry's dims are its shape followed by its strides.
inline constexpr uint32_t kTableFlagStrides = 1;
// The contiguous row-major strides of a shape (in elements).
std::vector<int64_t> ContiguousStrides(const std::vector<int64_t>& shape);
// The entries as a binary tensor table (format at the top of this file).
// Fails only for entries no manifest may hold (a name over 64 KiB).
Result<std::string> EncodeTensorTable(const std::vector<ManifestEntry>& entries);
// Checks a tensor table's header against its size and returns how many
// entries it holds (the records themselves are checked by DecodeTensorTable).
Result<uint64_t> TensorTableEntries(std::string_view table);
// Decodes a tensor table into *entries, checking the header, every size and
// every reference into the string area; a short, oversized or garbled table
// is an error naming what is wrong. Does not Validate(): the caller does.
Status DecodeTensorTable(std::string_view table, std::vector<ManifestEntry>* entries);

}  // namespace wsup
