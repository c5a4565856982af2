#include "client/kv_pool.h"

#include <fcntl.h>
#include <sys/stat.h>

#include "wire/protocol.h"

namespace wsup {

Status CheckKvPoolFd(const std::string& backend, size_t index, int fd, uint64_t size) {
  const std::string what = "KV pool allocation " + std::to_string(index);
  if (fd < 0) return InvalidArgument(what + ": no fd");
  if (backend != "host") return {};  // a VMM handle is checked when it is imported
  int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0) {
    return ErrnoError(what + ": fd " + std::to_string(fd) +
                          " is not a memfd (F_GET_SEALS); a KV pool is made by wsup-holder --kv-pool-mib",
                      errno);
  }
  if ((seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW)) {
    return Refused(what + ": the memfd is not sealed against shrinking and growing, so a mapping of it could "
                          "fault; use the pool a wsup holder made");
  }
  if (seals & F_SEAL_WRITE) {
    return Refused(what + ": the memfd is sealed against writing, so it cannot hold a KV cache; it is a weight "
                          "arena, not a KV pool");
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoError(what + ": fstat", errno);
  if (static_cast<uint64_t>(st.st_size) < size) {
    return Mismatch(what + ": the memfd holds " + std::to_string(st.st_size) + " bytes but the pool says " +
                    std::to_string(size) + "; the fds and the description come from different pools: ask again");
  }
  return {};
}

Result<KvPoolFds> FetchKvPool(const std::string& socket_path, int timeout_ms) {
  WSUP_ASSIGN_OR_RETURN(Channel ch, Channel::Connect(socket_path, timeout_ms));
  WSUP_ASSIGN_OR_RETURN(Frame reply, ch.Call(EncodeKvPoolRequest(), timeout_ms));
  const std::string type = reply.type();
  if (type == "error") {
    WSUP_ASSIGN_OR_RETURN(ErrorMsg m, DecodeError(reply.msg));
    return ErrorFromReply(m, socket_path);
  }
  if (type != "kv_pool") {
    return Corrupt(socket_path + ": answered 'kv_pool' with '" + type.substr(0, 64) +
                   "'; the holder does not speak this version of the protocol: run the same wsup version");
  }
  auto pool = DecodeKvPool(reply.msg);
  if (!pool.ok()) return pool.error().With(socket_path);
  if (reply.fds.size() != pool->allocations.size()) {
    return Corrupt(socket_path + ": the KV pool has " + std::to_string(pool->allocations.size()) +
                   " allocations but " + std::to_string(reply.fds.size()) +
                   " fds came with it; ask again (raise the open-file limit if it is near)");
  }
  for (size_t i = 0; i < reply.fds.size(); ++i) {
    Status st = CheckKvPoolFd(pool->backend, i, reply.fds[i].get(), pool->allocations[i]);
    if (!st.ok()) return st.error().With(socket_path);
  }
  (void)ch.Send(EncodeBye(), {}, 1000);
  KvPoolFds out;
  out.pool = std::move(*pool);
  out.fds = std::move(reply.fds);
  return out;
}

}  // namespace wsup
