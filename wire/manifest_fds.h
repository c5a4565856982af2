// The checks of the fds that carry an arena's allocations, made the same
// way by the holder (adopting fds kept across its restart) and by clients
// (attaching): one open fd per allocation of the manifest, in allocation
// order, and for the host backend a memfd sealed against writes and
// shrinking that holds the allocation's bytes. The cuda backend's fds are
// checked by importing them (gpu/vmm.h).
//
// Pure functions of their arguments and the fds' state; any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "common/unique_fd.h"
#include "wire/manifest.h"

namespace wsup {

// One open fd per allocation of `m`. `fix` ends the messages: what the
// sender (or the keeper of the fds) must do instead.
Status CheckAllocationFds(const Manifest& m, const std::vector<UniqueFd>& fds, std::string_view fix);

// How the size of a host allocation's memfd must compare with the manifest's.
enum class MemfdSize {
  kExact,    // the holder adopting its own arena: anything else is another arena
  kAtLeast,  // a client mapping `size` bytes of it
};

// Allocation `alloc`'s fd is a memfd sealed against writes and shrinking
// (so its bytes cannot change or vanish under a reader), of `size` bytes.
// `fix` ends the messages, as above.
Status CheckSealedMemfd(size_t alloc, int fd, uint64_t size, MemfdSize rule, std::string_view fix);

}  // namespace wsup
