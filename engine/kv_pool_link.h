// KvPoolLink: an engine's side of the node's KV pool (wire/kv_pool.h):
// the holders that make it (one per rank), what it looked like when the
// engine started (its allocations, which fix the engine's block ids:
// engine/kv_memory.h), and the role the supervisor last gave the engine.
//
// The engine holds no pool fd while it does not map the pool: Describe()
// closes the fds it was sent, and Fetch() asks the holders again when the
// pool is to be mapped, so a standby pins no memory of the node's and a
// holder restarted with a new pool is never kept from freeing the old one.
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
// Thread-safety: Describe() and Fetch() are blocking holder calls (the
// startup thread, the scheduler thread); pool_id() from any thread.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
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

class KvPoolLink {
 public:
  KvPoolLink(std::vector<std::string> sockets, int timeout_ms) : sockets_(std::move(sockets)), timeout_ms_(timeout_ms) {}

  // Every rank's pool allocation sizes, from its holder (fds not kept).
  Result<std::vector<std::vector<uint64_t>>> Describe();
  // Every rank's pool fds, refused unless laid out as Describe() found it.
  Result<std::vector<std::vector<UniqueFd>>> Fetch();
  // Rank 0's pool id, as last described or fetched.
  std::string pool_id() const;

 private:
  std::vector<std::string> sockets_;
  int timeout_ms_;
  std::vector<std::vector<uint64_t>> allocations_;
  mutable std::mutex mu_;
  std::string pool_id_;
};

}  // namespace wsup::engine
