// Arena: the holder's resident copy of one rank's weights, in as few
// allocations as the backend allows, each exported as a file descriptor.
//
// Backends:
//   host: one memfd (sealed read-only once loaded); clients mmap it read-only.
//   cuda: CUDA VMM allocations (cuMemCreate with POSIX fd handles), chunks only
//         as large as the driver requires; clients import, reserve, map.
//
// Ownership: the Arena owns its fds. Whoever holds a dup of an fd keeps the
// memory alive, with or without a CUDA context, so the weights can outlive
// the holder (the supervisor keeps dups; a new holder is Adopt()ed from them).
//
// Load() reads shard files in parallel and overlaps reads with copies into
// the arena through a bounded set of (pinned, for cuda) staging buffers: its
// host memory stays bounded by those buffers whatever the model's size.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "client/manifest.h"
#include "common/status.h"
#include "common/unique_fd.h"
#include "holder/checkpoint.h"
#include "holder/sharding.h"

namespace wsup {

struct LoadOptions {
  std::string backend = "host";  // "host" or "cuda"
  int device = 0;                // cuda ordinal
  int read_threads = 4;          // parallel file readers
  uint64_t staging_bytes = 64ull << 20;  // size of each staging buffer
  int staging_buffers = 4;               // how many are in flight
};

struct LoadStats {
  uint64_t bytes_read = 0;  // from disk
  double seconds = 0;
  double read_gbps = 0;
  uint64_t peak_staging_bytes = 0;
};

class Arena {
 public:
  Arena() = default;
  Arena(Arena&&) noexcept;
  Arena& operator=(Arena&&) noexcept;
  ~Arena();

  // Plans the layout (manifest), allocates and fills it from the checkpoint.
  static Result<Arena> Load(const Checkpoint& ckpt, const std::vector<ShardedTensor>& shards,
                            const LoadOptions& opts, LoadStats* stats = nullptr);

  // Builds an arena from fds someone kept and the manifest that describes
  // them, without reading the checkpoint. Checks each fd's size.
  static Result<Arena> Adopt(Manifest manifest, std::vector<UniqueFd> fds);

  const Manifest& manifest() const { return manifest_; }
  const std::vector<UniqueFd>& fds() const { return fds_; }
  // Fresh dups of every fd, in allocation order (for sending or keeping).
  Result<std::vector<UniqueFd>> DupFds() const;

 private:
  Manifest manifest_;
  std::vector<UniqueFd> fds_;
};

// The layout both Load() and tests use: entries in checkpoint order, each
// aligned to Manifest::kTensorAlignment, packed into allocations of at most
// max_alloc_bytes (a tensor larger than that gets an allocation of its own),
// each allocation rounded up to `granularity`.
Manifest PlanLayout(const std::vector<ShardedTensor>& shards, const std::string& backend,
                    uint64_t granularity, uint64_t max_alloc_bytes);

}  // namespace wsup
