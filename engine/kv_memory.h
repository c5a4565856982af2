// KvMemory: one rank's KV cache memory, and where the node's KV pool goes
// in it.
//
// A KV block is addressed as base + id * block_bytes everywhere (the CPU
// model's KvStorage, the CUDA kernels' DevKvLayout), so that a block table
// may mix blocks from anywhere. The memory is one reserved virtual range,
// laid out as
//
//   [ pool span: the node's pool, mapped only while this engine owns it ]
//   [ scratch: this engine's own memory, always mapped                  ]
//
// Pool ids are [0, pool_blocks); scratch ids start at the first block that
// lies wholly past the pool span (scratch_first) and run for
// scratch_blocks, and one spare block after them takes the writes of a
// replayed CUDA graph's padding rows. A private cache (an engine not
// started with --kv-pool) is the same with an empty pool span: its ids
// start at 0, as before. Because the range never moves, nothing that holds
// its address (captured CUDA graphs, block tables) changes when the pool
// is mapped or let go.
//
// The pool's pages belong to the node (the holders make them,
// wire/kv_pool.h); MapPool() maps them in place of the reservation and
// UnmapPool() puts the reservation back, leaving the memory to the node.
// Who may map them and when is the supervisor's call; this class only
// does it.
//
// Backends: host (an anonymous reservation; the pool's memfds mapped shared
// read-write over it; the scratch advised to use huge pages, so that a
// killed engine frees it in few page-table entries) and cuda (a VMM range
// on the rank's device: the scratch one cuMemCreate allocation, the pool's
// fds imported and mapped, access granted).
//
// Thread-safety: one thread at a time (the rank's thread), except
// PreparePool() and DropPrepared(), which may run on another thread beside
// the rest (the preparation is kept under a lock); base() may be read from
// any thread once Create() has returned.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/unique_fd.h"

namespace wsup::engine {

// The block ids of one rank's cache (the same on every rank).
struct KvLayout {
  int block_size = 0;        // positions per block
  uint64_t block_bytes = 0;  // one block's K and V, every layer
  // The pool: the bytes of address space it takes at the start of the
  // range (its allocations, back to back), and the whole blocks in them.
  uint64_t pool_span = 0;
  std::vector<uint64_t> pool_allocations;  // sizes, in mapping order
  int pool_blocks = 0;
  int scratch_first = 0;
  int scratch_blocks = 0;

  // Ids the scheduler hands out are below id_count(); spare() is extra.
  int id_count() const { return scratch_first + scratch_blocks; }
  int spare() const { return scratch_first + scratch_blocks; }
  bool pooled() const { return pool_span > 0; }
  uint64_t scratch_bytes() const { return static_cast<uint64_t>(scratch_blocks) * block_bytes; }
  uint64_t pool_bytes() const { return static_cast<uint64_t>(pool_blocks) * block_bytes; }
  // Bytes from the start of the range to the end of the spare block.
  uint64_t span() const { return static_cast<uint64_t>(spare() + 1) * block_bytes; }

  // A private cache of `bytes` (refused when it holds no block).
  static Result<KvLayout> Private(uint64_t block_bytes, int block_size, uint64_t bytes);
  // A pooled cache: the pool's allocation sizes and the scratch's bytes
  // (refused when the scratch holds no block; a pool too small for one
  // block is refused naming the sizes).
  static Result<KvLayout> Pooled(uint64_t block_bytes, int block_size, const std::vector<uint64_t>& pool_allocations,
                                 uint64_t scratch_bytes);
};

class KvMemory {
 protected:
  // Refused unless the pool is mapped and [offset, offset + n) lies in it.
  Status CheckPoolRange(uint64_t offset, size_t n) const;

 public:
  virtual ~KvMemory() = default;
  // Block id 0's address: a host pointer or a device pointer.
  virtual uint8_t* base() const = 0;
  const KvLayout& layout() const { return layout_; }
  bool pool_mapped() const { return pool_mapped_; }

  // Maps the pool's allocations (one fd each, sizes as the layout's) over
  // the pool span, read-write; the fds stay the caller's. Uses what
  // PreparePool() imported from the same fds, if anything.
  virtual Status MapPool(const std::vector<UniqueFd>& fds) = 0;
  // Puts the reservation back over the pool span (and drops a
  // preparation). The caller makes sure nothing reads or writes it any
  // more (the device is synchronized).
  virtual Status UnmapPool() = 0;

  // Imports the pool's allocations without mapping them, so that a later
  // MapPool() of the same fds only maps and grants access: a promoted
  // engine does this while the old active may still write the pool, and
  // nothing can read or write memory through an import. cuda: one handle
  // per allocation, checked to live on this rank's device; host: nothing
  // to do (mmap is the whole of it). Replaces an earlier preparation.
  virtual Status PreparePool(const std::vector<UniqueFd>& fds) { return Status::Ok(); }
  // Lets a preparation go (its handles pin the pool's memory).
  virtual void DropPrepared() {}

  // Bytes of the mapped pool at `offset` from its start, written from or
  // read into host memory: the KV journal (wire/kv_journal.h). cuda: a
  // synchronous copy, after the device work before it (a step has
  // synchronized by the time it returns its logits).
  virtual Status WritePool(uint64_t offset, const void* data, size_t n) = 0;
  virtual Status ReadPool(uint64_t offset, void* out, size_t n) = 0;

  // What the last MapPool() took, by part.
  struct MapTimes {
    bool prepared = false;  // the import was done ahead by PreparePool()
    double import_ms = 0;   // importing the fds (in MapPool(): 0 when prepared)
    double map_ms = 0;      // mapping them over the span
    double access_ms = 0;   // granting this device access
  };
  MapTimes last_map_times() const { return times_; }

  // A host cache (CPU ranks).
  static Result<std::unique_ptr<KvMemory>> CreateHost(const KvLayout& layout);
  // A cache on cuda device `device` (this process's ordinal). The scratch
  // is zeroed.
  static Result<std::unique_ptr<KvMemory>> CreateCuda(const KvLayout& layout, int device);

 protected:
  KvLayout layout_;
  bool pool_mapped_ = false;
  MapTimes times_;
};

}  // namespace wsup::engine
