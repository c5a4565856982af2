// KvPool: the node's KV pool as its holder keeps it (wire/kv_pool.h):
// memory for the active engine's KV cache, made once when the holder starts
// (wsup-holder --kv-pool-mib N) and handed to whoever asks as fds, so that
// it outlives every engine. The supervisor keeps dups of the fds, and a
// holder restarted after a crash adopts them (--adopt-kv-pool, a record of
// wire/kv_pool_record.h), so the pool also outlives its holder, under the
// same id.
//
// Memory comes from a LayoutMemory (holder/layout_store.h), as engine-made
// layouts' does, and never gets sealed against writing (the KV is written):
//   host: one memfd sealed against growing and shrinking, every page
//     allocated at once (fallocate), so that a pool the machine cannot hold
//     is a start failure and not a SIGBUS in an engine later;
//   cuda: VMM allocations on the holder's GPU of at most
//     kDefaultCudaMaxAlloc each (holder/arena.h), exported as POSIX fds; the
//     device's context is let go once they are made, so a holder keeps fds
//     and no context, as for its weights.
//
// Ownership: a KvPool owns its fds; the memory lives while any dup of them
// does (an engine's, the supervisor's). Thread-safety: values; the
// functions may be called from any thread.
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "common/unique_fd.h"
#include "holder/layout_store.h"
#include "wire/kv_pool.h"
#include "wire/protocol.h"

namespace wsup {

inline constexpr uint64_t kMiB = 1ull << 20;
// --kv-pool-mib at most: kMaxKvPoolBytes (16 TiB) in MiB.
inline constexpr int64_t kMaxKvPoolMib = static_cast<int64_t>(kMaxKvPoolBytes / kMiB);

struct KvPool {
  KvPoolMsg msg;              // what a `kv_pool` reply says
  std::vector<UniqueFd> fds;  // one per msg.allocations entry, in order
  bool adopted = false;       // the kept pool of a holder before this one

  // Fresh dups of every fd, in order (for a reply).
  Result<std::vector<UniqueFd>> DupFds() const;
  KvPoolInfo Info() const;
};

// The size a pool asked for `bytes` gets on `memory` (rounded up to its
// granularity).
uint64_t KvPoolSize(const LayoutMemory& memory, uint64_t bytes);

// A new pool of at least `bytes` (1 .. kMaxKvPoolBytes) with a new id. An
// allocation that fails (out of memory) is an error naming the size.
Result<KvPool> MakeKvPool(LayoutMemory& memory, uint64_t bytes);

// The kept pool `pool` from the fds it came with (one per allocation, in
// order), under its id. Refuses a pool of another backend or GPU than
// `memory`'s, a count of fds that is not one per allocation, and an fd that
// is not what the pool says: host, CheckKvPoolFd (a memfd sealed against
// resizing, not against writing) of exactly the allocation's size; cuda,
// no regular file, importable as VMM memory of the holder's GPU that maps
// at the allocation's size. A refusal names the allocation; the fds are
// closed with `fds`.
Result<KvPool> AdoptKvPool(const LayoutMemory& memory, KvPoolMsg pool, std::vector<UniqueFd> fds);

}  // namespace wsup
