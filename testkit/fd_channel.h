// A minimal message channel over a Unix socket for tests and benchmarks:
// one framed payload plus up to 253 fds (SCM_RIGHTS) per message. The real
// holder protocol lives in client/; this only moves arenas between the test
// processes that play holder, keeper and engine.
//
// Thread-safety: one sender and one receiver per socket.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/unique_fd.h"

namespace wsup::test {

// Both ends of a fresh AF_UNIX stream socketpair (close-on-exec).
Result<std::pair<UniqueFd, UniqueFd>> SocketPair();

Status SendMessage(int sock, const std::string& payload, const std::vector<int>& fds = {});
// Waits at most `limit` for each part of a message; Timeout when it passes.
Status RecvMessage(int sock, std::string* payload, std::vector<UniqueFd>* fds,
                   std::chrono::milliseconds limit = std::chrono::seconds(60));

}  // namespace wsup::test
