// Fetching the node's KV pool from a holder (wire/kv_pool.h): its
// description and one fd per allocation, checked, nothing mapped. The
// engine maps them when the supervisor makes it the pool's owner
// (engine/kv_memory.h); the supervisor's keeper keeps them so that a
// holder restarted after a crash adopts the same pool.
//
// Thread-safety: a blocking call; any thread.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "common/unique_fd.h"
#include "wire/kv_pool.h"

namespace wsup {

struct KvPoolFds {
  KvPoolMsg pool;
  std::vector<UniqueFd> fds;  // one per pool.allocations entry, in order
};

// Asks the holder at socket_path for its pool. A holder without one is
// Code::kNotFound naming the flag that makes one; a reply whose fds do not
// match its allocations (count; host: a memfd of at least that size,
// sealed against shrinking) is Code::kCorrupt or kMismatch.
Result<KvPoolFds> FetchKvPool(const std::string& socket_path, int timeout_ms);

// The checks FetchKvPool() makes on each fd are CheckKvPoolFd() in
// wire/kv_pool.h, where a holder adopting kept fds finds them too.

}  // namespace wsup
