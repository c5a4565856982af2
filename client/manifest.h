// Manifest: what an arena holds and where. Sent by the holder with the arena
// fds (one fd per allocation, in allocation order) and kept by anyone who
// keeps those fds (the supervisor, a restarted holder).
//
// Cost of attaching grows with the number of allocations, not of tensors:
// a client imports and maps each allocation once, then builds a
// name -> (allocation, offset) table.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "common/status.h"

namespace wsup {

struct ManifestEntry {
  std::string name;
  std::string dtype;            // safetensors spelling: "F32", "BF16", "F8_E4M3", ...
  std::vector<int64_t> shape;   // the rank's local shape
  uint32_t alloc = 0;           // index into Manifest::allocations
  uint64_t offset = 0;          // byte offset in that allocation, aligned to kTensorAlignment
  uint64_t nbytes = 0;
};

struct ManifestAllocation {
  uint64_t size = 0;  // bytes, a multiple of the backend's granularity
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
  // no overlaps, unique names, nbytes == shape x dtype size) so that a
  // manifest from a socket or a file can be trusted before any mapping.
  Status Validate() const;
};

nlohmann::json ManifestToJson(const Manifest& m);
// Parses and Validate()s; errors name the entry and the field.
Result<Manifest> ManifestFromJson(const nlohmann::json& j);

}  // namespace wsup
