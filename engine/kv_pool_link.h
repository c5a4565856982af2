// KvPoolLink: an engine's side of the node's KV pool (wire/kv_pool.h):
// the holders that make it (one per rank), what it looked like when the
// engine started (its allocations, which fix the engine's block ids:
// engine/kv_memory.h), and the role the supervisor last gave the engine.
//
// The engine holds no pool fd while it does not map the pool, or wait to:
// Describe() closes the fds it was sent, and Take() asks the holders again
// when the pool is to be mapped, so a standby pins no memory of the node's
// and a holder restarted with a new pool is never kept from freeing the
// old one. A promoted engine told to serve from its scratch until the old
// active is gone (role active, kv scratch) calls Prefetch(): the holders'
// round trip and the import (engine/kv_memory.h PreparePool) are then done
// before the grant, which only maps. Nothing can write the pool through
// an import, so this changes nothing of who may write it.
//
// The role contract (POST /wsup/role, JSON body):
//   {"role": "active", "kv": "pool"}     map the pool (once the supervisor
//                                        knows no other engine can write it)
//   {"role": "active", "kv": "scratch"}  serve, from the scratch for now
//   {"role": "standby"}                  let the pool go (after the
//                                        sequences that use it end); probes
//                                        are served from the scratch
// and the answer, once done, is the engine's `kv` status. An engine that
// keeps a private cache answers the same with source "private".
//
// Thread-safety: Describe(), Fetch() and Take() are blocking holder calls
// (the startup thread, the mapping thread); Prefetch() and Discard() from
// the event loop (they do not block on the holders: the fetch runs on a
// thread the link owns); pool_id() from any thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "common/unique_fd.h"

namespace wsup::engine {

struct RoleRequest {
  std::string role;  // "active" | "standby"
  bool pool = false; // map the pool (active only)
};
// Parses a POST /wsup/role body; errors name the field and the values.
Result<RoleRequest> ParseRoleRequest(const std::string& body);

using PoolFds = std::vector<std::vector<UniqueFd>>;

// The pool's fds fetched ahead of a mapping, and imported by `prepare`.
class PoolPrefetch {
 public:
  using Fetch = std::function<Result<PoolFds>()>;
  // Imports fetched fds ahead of a mapping (ModelRunner::PrepareKvPool);
  // drops such an import (ModelRunner::DropPreparedKvPool).
  using Prepare = std::function<Status(const PoolFds&)>;
  using Drop = std::function<void()>;

  explicit PoolPrefetch(Fetch fetch) : fetch_(std::move(fetch)) {}
  ~PoolPrefetch();  // waits for a prefetch in flight
  PoolPrefetch(const PoolPrefetch&) = delete;
  PoolPrefetch& operator=(const PoolPrefetch&) = delete;

  // Fetches the fds on a thread of its own and hands them to `prepare`;
  // they are kept for the next Take(). Does nothing while one is in
  // flight or kept. A failure is logged and forgotten (Take() fetches).
  void Start(Prepare prepare);
  // The kept fds (waiting for a prefetch in flight), else a fetch now.
  // `prefetched` says which.
  Result<PoolFds> Take(bool* prefetched);
  // Forgets kept fds and calls `drop`, under the lock that a prefetch
  // prepares under: a prefetch in flight then finishes unprepared.
  void Discard(const Drop& drop);

 private:
  Fetch fetch_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::thread thread_;
  bool in_flight_ = false;
  uint64_t generation_ = 0;  // Discard() moves it on
  std::optional<PoolFds> kept_;
};

class KvPoolLink {
 public:
  using Prepare = PoolPrefetch::Prepare;
  using Drop = PoolPrefetch::Drop;

  KvPoolLink(std::vector<std::string> sockets, int timeout_ms)
      : sockets_(std::move(sockets)), timeout_ms_(timeout_ms), prefetch_([this] { return Fetch(); }) {}

  // Every rank's pool allocation sizes, from its holder (fds not kept).
  Result<std::vector<std::vector<uint64_t>>> Describe();
  // Every rank's pool fds, refused unless laid out as Describe() found it.
  Result<PoolFds> Fetch();

  // PoolPrefetch over Fetch(): a promoted engine waiting for its grant
  // Prefetch()es, the mapping Take()s, a standby Discard()s (it keeps
  // nothing of the pool).
  void Prefetch(Prepare prepare) { prefetch_.Start(std::move(prepare)); }
  Result<PoolFds> Take(bool* prefetched) { return prefetch_.Take(prefetched); }
  void Discard(const Drop& drop) { prefetch_.Discard(drop); }

  // Rank 0's pool id, as last described or fetched.
  std::string pool_id() const;

 private:
  std::vector<std::string> sockets_;
  int timeout_ms_;
  std::vector<std::vector<uint64_t>> allocations_;
  mutable std::mutex mu_;
  std::string pool_id_;
  PoolPrefetch prefetch_;  // last: its thread calls Fetch()
};

}  // namespace wsup::engine
