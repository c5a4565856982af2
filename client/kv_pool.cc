#include "client/kv_pool.h"

#include "wire/protocol.h"

namespace wsup {

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
