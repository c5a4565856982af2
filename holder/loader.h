// Loader: the cold path that fills an arena's memory from checkpoint files.
//
// A load is planned before any byte moves: every tensor becomes one copy
// piece (a contiguous run of source bytes, or for a column split one run per
// row, expressed as a strided piece), pieces are sorted by file and offset,
// neighbouring pieces are merged into extents (gaps of up to kMergeGap are
// read through: one large read beats many small ones), and extents are cut
// into read chunks of at most one staging buffer each, aligned to 4 KiB so
// that they can be read with O_DIRECT.
//
// Then read_threads threads each take the next chunk, read it into a free
// staging buffer (pread with O_DIRECT when the file system allows it, else
// buffered; large reads, several in flight), and scatter the pieces it holds
// into the arena: host, memcpy into the memfd's writable mapping; cuda, async
// host-to-device copies from pinned staging memory on the thread's stream,
// after which the buffer is fenced with an event and reused only once that
// event has completed. Reads of one chunk overlap copies of others, and host
// memory stays bounded by staging_buffers x staging_bytes whatever the
// model's size.
//
// Ownership: FillArena borrows everything it is given; it owns its threads,
// file descriptors and staging buffers and releases all of them before it
// returns, also on error. Called from one thread; it starts its own.
#pragma once

#include <cstdint>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/sharding.h"
#include "common/status.h"
#include "gpu/cuda_driver.h"
#include "holder/arena.h"
#include "wire/manifest.h"

namespace wsup {

// Source bytes for one tensor: `rows` runs of `row_bytes`, `src_stride` apart
// in the file, landing back to back at (alloc, dst_offset).
struct CopyPiece {
  int file = 0;
  uint64_t src_offset = 0;  // absolute byte offset in the file
  uint64_t row_bytes = 0;
  uint64_t src_stride = 0;
  uint64_t rows = 1;
  uint32_t alloc = 0;
  uint64_t dst_offset = 0;
  size_t tensor = 0;  // index into the shards / manifest entries
  uint64_t src_end() const { return src_offset + (rows - 1) * src_stride + row_bytes; }
};

// Where each planned tensor's bytes come from. Entry i of the manifest must
// be shard i (PlanLayout keeps the order). An Internal error names a tensor
// whose slice does not fit its source tensor.
Result<std::vector<CopyPiece>> PlanCopies(const Checkpoint& ckpt, const std::vector<ShardedTensor>& shards,
                                          const Manifest& manifest);

// One read: [offset, offset + len) of a file, len a multiple of kIoAlign;
// `valid` bytes of it exist (the rest is past the end of the file).
struct ReadChunk {
  int file = 0;
  uint64_t offset = 0;
  uint64_t len = 0;
  uint64_t valid = 0;
  std::vector<uint32_t> pieces;  // indexes into the pieces that intersect it
};

inline constexpr uint64_t kIoAlign = 4096;         // O_DIRECT alignment used for offsets, sizes, buffers
inline constexpr uint64_t kMergeGap = 1ull << 20;  // gaps read through rather than seeking

// Sorts `pieces` by (file, offset) in place and plans the reads that cover
// them. max_chunk is a multiple of kIoAlign.
std::vector<ReadChunk> PlanReads(std::vector<CopyPiece>& pieces, const std::vector<uint64_t>& file_sizes,
                                 uint64_t max_chunk);

// Where the bytes go: a writable view of every allocation.
struct FillDest {
  bool cuda = false;
  std::vector<uint8_t*> host_bases;               // host: writable mapping per allocation
  std::vector<cuda::DevicePtr> device_bases;      // cuda: mapped device address per allocation
  const cuda::PrimaryContext* context = nullptr;  // cuda: made current on every reader thread
};

// Reads every shard's bytes into dest. `stats` gets bytes_read,
// direct_bytes and peak_staging_bytes (the caller times the whole load).
Status FillArena(const Checkpoint& ckpt, const std::vector<ShardedTensor>& shards, const Manifest& manifest,
                 const FillDest& dest, const LoadOptions& opts, LoadStats* stats);

}  // namespace wsup
