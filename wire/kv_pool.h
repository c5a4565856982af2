// The node's KV pool in the holder protocol (wire/protocol.h): memory for
// the active engine's KV cache that the holder of each rank makes at its
// start (wsup-holder --kv-pool-mib N; host memfds, or VMM allocations on
// the holder's GPU) and keeps for the node, so that a promoted engine maps
// it instead of allocating, and it outlives every engine (and, kept by the
// supervisor, the holder itself).
//
// Conversation (any connection, no hello needed, like `info`):
//   kv_pool -> kv_pool {id, backend, device, device_uuid, allocations: [bytes, ...], fds: N}
//                                 (+ N fds, one per allocation, in order)
//            | error {code: not_found, message}   the holder has no pool
// Host: each fd is a memfd of its allocation's size, sealed against growing
// and shrinking (never against writing: the KV is written); the engine maps
// them shared read-write, one after the other. Cuda: each fd is a POSIX fd
// of a VMM allocation on the holder's GPU (named by device_uuid; `device`
// is the holder's ordinal), rounded to the allocation granularity, which
// the engine imports and maps read-write into one range, one after the
// other.
//
// Who may write the pool is not the holder's business: it hands the fds
// to whoever asks (the socket is the node user's alone, holder/server.h),
// and the supervisor decides which engine maps them and when: only the
// active engine, and only once the engine that held them before has
// released them or exited (supervisor/kv_handover.h).
//
// `id` names this pool for as long as its memory lives: a new holder that
// adopts the kept fds keeps it, a holder that makes a new pool makes a new
// one, so an engine can tell whether the fds it holds are the node's pool.
//
// Thread-safety: values and pure functions.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "common/status.h"

namespace wsup {

// The most allocations one pool may have, and the largest pool.
inline constexpr uint64_t kMaxKvPoolAllocations = 4096;
inline constexpr uint64_t kMaxKvPoolBytes = 1ull << 44;  // 16 TiB

struct KvPoolMsg {
  std::string id;  // 32 lower-case hex digits
  std::string backend = "host";
  int device = -1;
  std::string device_uuid = "host";
  std::vector<uint64_t> allocations;  // sizes, in mapping order
  uint64_t bytes() const;             // their sum
};

// A new pool id: 16 random bytes as hex.
std::string MakeKvPoolId();

nlohmann::json EncodeKvPoolRequest();
// The reply; the fds go to OutgoingFrame::Make.
nlohmann::json EncodeKvPool(const KvPoolMsg& m);
// Checks every field (id, backend, device, 1..kMaxKvPoolAllocations sizes,
// none 0, the sum at most kMaxKvPoolBytes); the caller compares the fds
// that came with it against its allocations.
Result<KvPoolMsg> DecodeKvPool(const nlohmann::json& j);

// The checks a client makes on each fd of a `kv_pool` reply
// (client/kv_pool.h FetchKvPool), and a holder on each kept fd it adopts
// (holder/kv_pool.h): host, a memfd of at least `size` bytes sealed against
// shrinking and growing and not against writing; cuda, only that an fd is
// there (a VMM handle is checked when it is imported).
Status CheckKvPoolFd(const std::string& backend, size_t index, int fd, uint64_t size);

}  // namespace wsup
