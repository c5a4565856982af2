// Random identifiers: 16 bytes from the kernel's random source, as 32
// lower-case hex digits. Unguessable by another process on the node, which
// is what a start's nonce (supervisor/engines.cc) and a KV pool's id
// (wire/kv_pool.h) need.
//
// Thread-safety: any thread.
#pragma once

#include <string>

namespace wsup {

std::string RandomHexId();

}  // namespace wsup
