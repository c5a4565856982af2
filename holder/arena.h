// Arena: the holder's resident copy of one rank's weights, in as few
// allocations as the backend allows, each exported as a file descriptor.
//
// Backends:
//   host: one memfd (sealed read-only once loaded); clients mmap it read-only.
//   cuda: CUDA VMM allocations (cuMemCreate on the device with POSIX fd
//         handles), each rounded up to the driver's granularity; one
//         allocation up to kDefaultCudaMaxAlloc, a few beyond; zeroed before
//         filling so padding is deterministic; clients import, reserve, map.
//
// Ownership: the Arena owns its fds. Whoever holds a dup of an fd keeps the
// memory alive, with or without a CUDA context, so the weights can outlive
// the holder (the supervisor keeps dups; a new holder is Adopt()ed from them).
// A cuda Load() retains the device's primary context only while it runs: a
// loaded Arena holds no handle, mapping or context, only fds.
//
// Load() reads shard files in parallel and overlaps reads with copies into
// the arena through a bounded set of (pinned, for cuda) staging buffers: its
// host memory stays bounded by those buffers whatever the model's size.
// holder/loader.h describes the pipeline.
//
// Thread-safety: the static constructors may be called from any thread (a
// load starts its own reader threads); an Arena's const methods may be
// called from several threads at once.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/sharding.h"
#include "common/status.h"
#include "common/unique_fd.h"
#include "wire/manifest.h"

namespace wsup {

// Largest cuda allocation a load makes unless told otherwise. One allocation
// is cheapest to attach (one import, one map), so a rank's weights go into
// one allocation up to this size; past it they split into a few. The cap
// keeps any single cuMemCreate (which must find that much free memory at
// once) and any single fd's pinned memory to a size that still fits beside
// another engine's working set on a 141 GB GPU.
inline constexpr uint64_t kDefaultCudaMaxAlloc = 64ull << 30;

struct LoadOptions {
  std::string backend = "host";  // "host" or "cuda"
  int device = 0;                // cuda ordinal
  int read_threads = 4;          // parallel file readers (1..64)
  uint64_t staging_bytes = 64ull << 20;  // size of each staging buffer (1 MiB..4 GiB)
  int staging_buffers = 4;               // how many are in flight (1..64)
  // cuda: largest allocation, 0 for kDefaultCudaMaxAlloc. The host backend
  // always makes one allocation (a memfd has no such limit).
  uint64_t max_alloc_bytes = 0;
  // Read with O_DIRECT where the file system allows it (bypasses the page
  // cache: a model read once should not evict everything else).
  bool direct_io = true;
};

struct LoadStats {
  uint64_t bytes_read = 0;  // from disk
  double seconds = 0;       // the whole load: plan, allocate, read, copy, seal
  double read_gbps = 0;     // bytes_read / seconds, in 1e9 bytes per second
  uint64_t peak_staging_bytes = 0;
  uint64_t direct_bytes = 0;   // of bytes_read, read with O_DIRECT
  uint64_t arena_bytes = 0;    // sum of the allocations' sizes
  double alloc_seconds = 0;    // allocating (and for cuda exporting and zeroing)
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
  // them, without reading the checkpoint. Checks the manifest and each fd:
  // host, a sealed memfd of exactly the allocation's size; cuda, an
  // importable allocation on the GPU the manifest names (found by uuid, so
  // the ordinal may differ in this process; manifest().device is updated)
  // that maps at the allocation's size.
  static Result<Arena> Adopt(Manifest manifest, std::vector<UniqueFd> fds);

  // An arena of `tensors` (name, dtype, shape, nbytes; the source fields are
  // ignored) laid out like Load() would, without any checkpoint: every byte
  // of tensor i is SyntheticByte(i). For benchmarks and tests of attach.
  static Result<Arena> Synthesize(const std::vector<ShardedTensor>& tensors, const LoadOptions& opts,
                                  LoadStats* stats = nullptr);
  static uint8_t SyntheticByte(size_t tensor_index) { return static_cast<uint8_t>(tensor_index * 131 + 7); }

  const Manifest& manifest() const { return manifest_; }
  const std::vector<UniqueFd>& fds() const { return fds_; }
  // Fresh dups of every fd, in allocation order (for sending or keeping).
  Result<std::vector<UniqueFd>> DupFds() const;

 private:
  friend class ArenaBuilder;
  Arena(Manifest manifest, std::vector<UniqueFd> fds) : manifest_(std::move(manifest)), fds_(std::move(fds)) {}
  Manifest manifest_;
  std::vector<UniqueFd> fds_;
};

// The layout both Load() and tests use: entries in checkpoint order, each
// aligned to Manifest::kTensorAlignment, packed into allocations of at most
// max_alloc_bytes (a tensor larger than that gets an allocation of its own),
// each allocation rounded up to `granularity` (a power of two; at least one
// 4 KiB page is used). device is -1 and device_uuid "host" for host, left for
// the caller to fill for cuda.
Manifest PlanLayout(const std::vector<ShardedTensor>& shards, const std::string& backend,
                    uint64_t granularity, uint64_t max_alloc_bytes);

// Fresh dups of each of `fds`, in order: what an arena or a KV pool sends or
// keeps while it holds its own.
Result<std::vector<UniqueFd>> DupEach(const std::vector<UniqueFd>& fds);

}  // namespace wsup
