#include "holder/kv_pool.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>

#include "gpu/cuda_driver.h"
#include "holder/arena.h"

namespace wsup {

namespace {

std::string AllocName(size_t i) { return "KV pool allocation " + std::to_string(i); }

uint64_t RoundUp(uint64_t n, uint64_t to) { return (n + to - 1) / to * to; }

// Host: every page now, so that a pool the machine cannot hold fails the
// holder's start (ftruncate alone promises memory it may not have).
Status Populate(int fd, uint64_t size) {
  for (;;) {
    if (::fallocate(fd, 0, 0, static_cast<off_t>(size)) == 0) return Status::Ok();
    if (errno != EINTR) break;
  }
  return ErrnoError("allocating the " + std::to_string(size) + " bytes of a KV pool memfd", errno);
}

// Maps an imported allocation once at `size`, which fails when the memory
// is smaller or lives elsewhere; maps nothing afterwards.
Status TryMap(cuda::MemHandle h, uint64_t size, uint64_t gran, int device, const std::string& what) {
  WSUP_ASSIGN_OR_RETURN(cuda::VmmProperties props, cuda::VmmGetProperties(h));
  if (props.device != device) {
    return Mismatch(what + ": the kept memory is on device " + std::to_string(props.device) +
                    ", not on device " + std::to_string(device) + ", the holder's");
  }
  WSUP_ASSIGN_OR_RETURN(cuda::DevicePtr va, cuda::VmmReserve(size, gran));
  Status mapped = cuda::VmmMap(va, size, h);
  Status unmapped = mapped.ok() ? cuda::VmmUnmap(va, size) : Status::Ok();
  Status freed = cuda::VmmFree(va, size);
  if (!mapped.ok())
    return mapped.error().With(what + ": mapping it at its " + std::to_string(size) + " bytes");
  if (!unmapped.ok()) return unmapped;
  return freed;
}

Status CheckCudaFds(const LayoutMemory& memory, const KvPoolMsg& pool, const std::vector<UniqueFd>& fds) {
  WSUP_RETURN_IF_ERROR(cuda::Init());
  WSUP_ASSIGN_OR_RETURN(cuda::PrimaryContext ctx, cuda::PrimaryContext::Retain(memory.device()));
  cuda::ContextScope scope;
  WSUP_RETURN_IF_ERROR(scope.Enter(ctx));
  const uint64_t gran = memory.granularity();
  for (size_t i = 0; i < fds.size(); ++i) {
    const uint64_t size = pool.allocations[i];
    if (size % gran != 0) {
      return Mismatch(AllocName(i) + ": " + std::to_string(size) +
                      " bytes is not a multiple of the device's " + std::to_string(gran) +
                      "-byte granularity, so it is no VMM allocation of this GPU");
    }
    WSUP_RETURN_IF_ERROR(memory.CheckAdopted(fds[i].get(), static_cast<uint32_t>(i), size));
    auto h = cuda::VmmImport(fds[i].get());
    if (!h.ok()) return h.error().With(AllocName(i) + ": importing the kept fd");
    Status st = TryMap(*h, size, gran, memory.device(), AllocName(i));
    Status released = cuda::VmmRelease(*h);
    if (!st.ok()) return st;
    if (!released.ok()) return released.error().With(AllocName(i));
  }
  return Status::Ok();
}

Status CheckHostFds(const KvPoolMsg& pool, const std::vector<UniqueFd>& fds) {
  for (size_t i = 0; i < fds.size(); ++i) {
    // Its seals; the size is checked below, exactly (CheckKvPoolFd allows
    // more): a kept fd must be what was kept.
    WSUP_RETURN_IF_ERROR(CheckKvPoolFd(pool.backend, i, fds[i].get(), 0));
    struct stat st {};
    if (::fstat(fds[i].get(), &st) != 0) return ErrnoError(AllocName(i) + ": fstat", errno);
    if (static_cast<uint64_t>(st.st_size) != pool.allocations[i]) {
      return Mismatch(AllocName(i) + ": the kept memfd holds " + std::to_string(st.st_size) +
                      " bytes but the record says " + std::to_string(pool.allocations[i]));
    }
  }
  return Status::Ok();
}

}  // namespace

Result<std::vector<UniqueFd>> KvPool::DupFds() const { return DupEach(fds); }

KvPoolInfo KvPool::Info() const { return KvPoolInfo{msg.id, msg.bytes(), msg.allocations.size(), adopted}; }

uint64_t KvPoolSize(const LayoutMemory& memory, uint64_t bytes) {
  return RoundUp(bytes, memory.granularity());
}

Result<KvPool> MakeKvPool(LayoutMemory& memory, uint64_t bytes) {
  if (bytes == 0 || bytes > kMaxKvPoolBytes) {
    return InvalidArgument("a KV pool of " + std::to_string(bytes) + " bytes; a pool has 1 byte to " +
                           std::to_string(kMaxKvPoolBytes));
  }
  KvPool pool;
  pool.msg.id = MakeKvPoolId();
  pool.msg.backend = memory.backend();
  pool.msg.device = memory.device();
  pool.msg.device_uuid = memory.device_uuid();
  const bool host = pool.msg.backend == "host";
  // A memfd has no size limit; one cuMemCreate must find its size free at
  // once, so cuda pools come in pieces (holder/arena.h).
  const uint64_t piece = host ? bytes : kDefaultCudaMaxAlloc;
  Status made = [&]() -> Status {
    for (uint64_t left = bytes; left > 0;) {
      const uint64_t ask = std::min(left, piece);
      uint64_t size = 0;
      auto fd = memory.Allocate(ask, &size);
      if (!fd.ok())
        return fd.error().With(AllocName(pool.fds.size()) + " (" + std::to_string(ask) + " bytes)");
      if (host) WSUP_RETURN_IF_ERROR(Populate(fd->get(), size));
      pool.msg.allocations.push_back(size);
      pool.fds.push_back(std::move(fd).value());
      left -= ask;
    }
    return Status::Ok();
  }();
  // The pool is made: what only making needed (a device context) goes.
  memory.Idle();
  if (!made.ok()) return made.error();
  return pool;
}

Result<KvPool> AdoptKvPool(const LayoutMemory& memory, KvPoolMsg pool, std::vector<UniqueFd> fds) {
  if (pool.backend != memory.backend() || pool.device_uuid != memory.device_uuid()) {
    return Mismatch("the kept pool lives on backend " + pool.backend + ", device " +
                    pool.device_uuid.substr(0, 64) + ", but this holder keeps its memory on backend " +
                    memory.backend() + ", device " + memory.device_uuid());
  }
  if (fds.size() != pool.allocations.size()) {
    return Mismatch(std::to_string(fds.size()) + " fds for the " + std::to_string(pool.allocations.size()) +
                    " allocations of the kept pool; a pool needs one fd per allocation, in order");
  }
  for (size_t i = 0; i < fds.size(); ++i) {
    if (!fds[i].valid()) return InvalidArgument(AllocName(i) + ": no fd");
  }
  if (pool.backend == "host") {
    WSUP_RETURN_IF_ERROR(CheckHostFds(pool, fds));
  } else {
    WSUP_RETURN_IF_ERROR(CheckCudaFds(memory, pool, fds));
  }
  pool.device = memory.device();  // the ordinal in this process; the uuid named the GPU
  KvPool out;
  out.msg = std::move(pool);
  out.fds = std::move(fds);
  out.adopted = true;
  return out;
}

}  // namespace wsup
