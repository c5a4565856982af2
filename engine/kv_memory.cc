#include "engine/kv_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>

#include "gpu/cuda_driver.h"
#include "gpu/vmm.h"

namespace wsup::engine {

namespace {

uint64_t RoundUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

std::string MiB(uint64_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

using Clock = std::chrono::steady_clock;
double MsSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

}  // namespace

Result<KvLayout> KvLayout::Private(uint64_t block_bytes, int block_size, uint64_t bytes) {
  if (block_bytes == 0 || block_size <= 0) return InvalidArgument("KV cache: no block size");
  const uint64_t blocks = bytes / block_bytes;
  if (blocks == 0) {
    return InvalidArgument("--kv-cache-mib gives each rank " + std::to_string(bytes) +
                           " bytes, less than one KV block (" + std::to_string(block_bytes) +
                           " bytes); raise --kv-cache-mib");
  }
  if (blocks > (1u << 30)) return InvalidArgument("KV cache: more than 2^30 blocks; lower --kv-cache-mib");
  KvLayout l;
  l.block_size = block_size;
  l.block_bytes = block_bytes;
  l.scratch_blocks = static_cast<int>(blocks);
  return l;
}

Result<KvLayout> KvLayout::Pooled(uint64_t block_bytes, int block_size, const std::vector<uint64_t>& pool_allocations,
                                  uint64_t scratch_bytes) {
  if (block_bytes == 0 || block_size <= 0) return InvalidArgument("KV cache: no block size");
  KvLayout l;
  l.block_size = block_size;
  l.block_bytes = block_bytes;
  l.pool_allocations = pool_allocations;
  for (uint64_t a : pool_allocations) l.pool_span += a;
  if (l.pool_span == 0) return InvalidArgument("KV pool: it has no memory; give the holders --kv-pool-mib");
  const uint64_t pool_blocks = l.pool_span / block_bytes;
  if (pool_blocks == 0) {
    return InvalidArgument("the KV pool has " + std::to_string(l.pool_span) + " bytes, less than one KV block (" +
                           std::to_string(block_bytes) + " bytes) of this model; raise [kv] pool_mib");
  }
  const uint64_t scratch_blocks = scratch_bytes / block_bytes;
  if (scratch_blocks == 0) {
    return InvalidArgument("--kv-scratch-mib gives each rank " + std::to_string(scratch_bytes) +
                           " bytes, less than one KV block (" + std::to_string(block_bytes) +
                           " bytes); raise --kv-scratch-mib ([kv] scratch_mib)");
  }
  const uint64_t first = (l.pool_span + block_bytes - 1) / block_bytes;
  if (first + scratch_blocks > (1u << 30)) return InvalidArgument("KV cache: more than 2^30 blocks; lower the pool");
  l.pool_blocks = static_cast<int>(pool_blocks);
  l.scratch_first = static_cast<int>(first);
  l.scratch_blocks = static_cast<int>(scratch_blocks);
  return l;
}

// ---------------------------------------------------------------- host

namespace {

class HostKvMemory : public KvMemory {
 public:
  ~HostKvMemory() override {
    if (base_) ::munmap(base_, size_);
  }
  uint8_t* base() const override { return base_; }

  Status Init(const KvLayout& layout) {
    layout_ = layout;
    const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
    for (size_t i = 0; i < layout.pool_allocations.size(); ++i) {
      if (layout.pool_allocations[i] % page != 0) {
        return InvalidArgument("KV pool allocation " + std::to_string(i) + " of " +
                               std::to_string(layout.pool_allocations[i]) +
                               " bytes is not a whole number of pages; the pool was not made by a wsup holder");
      }
    }
    size_ = RoundUp(layout.span(), page);
    // The whole range is reserved, never backed: the pool's part stays
    // inaccessible until MapPool(), the scratch is opened below.
    void* p = ::mmap(nullptr, size_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      return Unavailable("KV cache: cannot reserve " + MiB(size_) + " of address space: " + strerror(errno));
    }
    base_ = static_cast<uint8_t*>(p);
    uint8_t* scratch = base_ + layout.pool_span;
    const size_t scratch_len = size_ - layout.pool_span;
    if (::mprotect(scratch, scratch_len, PROT_READ | PROT_WRITE) != 0) {
      return Unavailable("KV cache: cannot allocate " + MiB(scratch_len) + ": " + strerror(errno) +
                         "; lower --kv-cache-mib (or --kv-scratch-mib) or free memory");
    }
    ::madvise(scratch, scratch_len, MADV_HUGEPAGE);  // a hint: without huge pages it still works
    // Touch every page now: the memory is really there from startup on.
    auto* bytes = reinterpret_cast<volatile char*>(scratch);
    for (size_t off = 0; off < scratch_len; off += page) bytes[off] = 0;
    return Status::Ok();
  }

  Status MapPool(const std::vector<UniqueFd>& fds) override {
    if (pool_mapped_) return Status::Ok();
    WSUP_RETURN_IF_ERROR(CheckFds(fds));
    const auto t0 = Clock::now();
    uint64_t off = 0;
    for (size_t i = 0; i < fds.size(); ++i) {
      const uint64_t len = layout_.pool_allocations[i];
      void* want = base_ + off;
      void* got = ::mmap(want, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fds[i].get(), 0);
      if (got == MAP_FAILED) {
        int err = errno;
        (void)Reserve();  // what was mapped goes back to the reservation
        return ErrnoError("KV pool: mapping allocation " + std::to_string(i) + " (" + MiB(len) + ")", err);
      }
      off += len;
    }
    times_ = MapTimes{};
    times_.map_ms = MsSince(t0);
    pool_mapped_ = true;
    return Status::Ok();
  }

  Status UnmapPool() override {
    if (!pool_mapped_) return Status::Ok();
    WSUP_RETURN_IF_ERROR(Reserve());
    pool_mapped_ = false;
    return Status::Ok();
  }

 private:
  Status CheckFds(const std::vector<UniqueFd>& fds) const {
    if (fds.size() != layout_.pool_allocations.size()) {
      return InvalidArgument("KV pool: " + std::to_string(fds.size()) + " fds for " +
                             std::to_string(layout_.pool_allocations.size()) + " allocations");
    }
    return Status::Ok();
  }
  // The pool span back to an inaccessible reservation (MAP_FIXED replaces
  // the shared mappings in one step, so no other mapping can land there).
  Status Reserve() {
    if (layout_.pool_span == 0) return Status::Ok();
    void* p = ::mmap(base_, layout_.pool_span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE,
                     -1, 0);
    if (p == MAP_FAILED) return ErrnoError("KV pool: unmapping it", errno);
    return Status::Ok();
  }

  Status WritePool(uint64_t offset, const void* data, size_t n) override {
    WSUP_RETURN_IF_ERROR(CheckPoolRange(offset, n));
    std::memcpy(base_ + offset, data, n);
    return Status::Ok();
  }
  Status ReadPool(uint64_t offset, void* out, size_t n) override {
    WSUP_RETURN_IF_ERROR(CheckPoolRange(offset, n));
    std::memcpy(out, base_ + offset, n);
    return Status::Ok();
  }

  uint8_t* base_ = nullptr;
  size_t size_ = 0;
};

// ---------------------------------------------------------------- cuda

class CudaKvMemory : public KvMemory {
 public:
  ~CudaKvMemory() override {
    DropPrepared();
    (void)range_.Reset();  // the pool's and the scratch's mappings, then the range
  }
  uint8_t* base() const override { return reinterpret_cast<uint8_t*>(static_cast<uintptr_t>(base_)); }

  Status Init(const KvLayout& layout, int device) {
    layout_ = layout;
    device_ = device;
    WSUP_ASSIGN_OR_RETURN(uint64_t gran, cuda::VmmGranularity(device));
    for (size_t i = 0; i < layout.pool_allocations.size(); ++i) {
      if (layout.pool_allocations[i] % gran != 0) {
        return InvalidArgument("KV pool allocation " + std::to_string(i) + " of " +
                               std::to_string(layout.pool_allocations[i]) + " bytes is not a multiple of cuda:" +
                               std::to_string(device) + "'s granularity (" + std::to_string(gran) +
                               "); the pool was not made by a wsup holder on this GPU");
      }
    }
    size_ = RoundUp(layout.span(), gran);
    const uint64_t scratch_len = size_ - layout.pool_span;
    WSUP_ASSIGN_OR_RETURN(range_, cuda::VmmRange::Reserve(size_, gran));
    base_ = range_.base();
    auto h = cuda::VmmHandle::Create(device, scratch_len);
    if (!h.ok()) {
      return h.error().With("KV cache: allocating " + MiB(scratch_len) + " on cuda:" + std::to_string(device) +
                            "; lower --kv-cache-mib (or --kv-scratch-mib) or free GPU memory");
    }
    // The mapping keeps the memory; the handle goes at the end of the scope.
    WSUP_RETURN_IF_ERROR(range_.Map(layout.pool_span, scratch_len, h->get()));
    WSUP_RETURN_IF_ERROR(range_.SetAccess(layout.pool_span, scratch_len, device));
    WSUP_ASSIGN_OR_RETURN(ctx_, cuda::PrimaryContext::Retain(device));
    cuda::ContextScope scope;
    WSUP_RETURN_IF_ERROR(scope.Enter(ctx_));
    WSUP_RETURN_IF_ERROR(cuda::MemsetD8(base_ + layout.pool_span, 0, scratch_len));
    return cuda::ContextSynchronize();
  }

  Status WritePool(uint64_t offset, const void* data, size_t n) override {
    WSUP_RETURN_IF_ERROR(CheckPoolRange(offset, n));
    cuda::ContextScope scope;
    WSUP_RETURN_IF_ERROR(scope.Enter(ctx_));
    return cuda::CopyHtoD(base_ + offset, data, n);
  }
  Status ReadPool(uint64_t offset, void* out, size_t n) override {
    WSUP_RETURN_IF_ERROR(CheckPoolRange(offset, n));
    cuda::ContextScope scope;
    WSUP_RETURN_IF_ERROR(scope.Enter(ctx_));
    return cuda::CopyDtoH(out, base_ + offset, n);
  }

  Status PreparePool(const std::vector<UniqueFd>& fds) override {
    std::vector<cuda::VmmHandle> handles;
    Status st = Import(fds, &handles);
    std::lock_guard<std::mutex> lk(prepared_mu_);
    ReleaseLocked();
    if (!st.ok()) return st;
    prepared_ = std::move(handles);
    prepared_from_ = FdNumbers(fds);
    return Status::Ok();
  }

  void DropPrepared() override {
    std::lock_guard<std::mutex> lk(prepared_mu_);
    ReleaseLocked();
  }

  Status MapPool(const std::vector<UniqueFd>& fds) override {
    if (pool_mapped_) return Status::Ok();
    MapTimes t;
    std::vector<cuda::VmmHandle> handles;
    {
      // A preparation of these very fds is used up here; any other goes.
      std::lock_guard<std::mutex> lk(prepared_mu_);
      if (!prepared_.empty() && prepared_from_ == FdNumbers(fds)) {
        handles = std::move(prepared_);
        prepared_.clear();
        prepared_from_.clear();
        t.prepared = true;
      }
      ReleaseLocked();
    }
    if (!t.prepared) {
      const auto t0 = Clock::now();
      Status imported = Import(fds, &handles);
      t.import_ms = MsSince(t0);
      if (!imported.ok()) return imported;
    }
    uint64_t off = 0;
    Status st;
    const auto t1 = Clock::now();
    for (size_t i = 0; i < handles.size() && st.ok(); ++i) {
      const uint64_t len = layout_.pool_allocations[i];
      st = range_.Map(off, len, handles[i].get());
      if (st.ok()) mapped_ += len;
      off += len;
    }
    // The mappings keep the memory; the handles are not needed again.
    handles.clear();
    t.map_ms = MsSince(t1);
    const auto t2 = Clock::now();
    if (st.ok()) st = range_.SetAccess(0, layout_.pool_span, device_);
    t.access_ms = MsSince(t2);
    if (!st.ok()) {
      UnmapPrefix();
      return st;
    }
    times_ = t;
    pool_mapped_ = true;
    return Status::Ok();
  }

  Status UnmapPool() override {
    DropPrepared();
    if (!pool_mapped_) return Status::Ok();
    WSUP_RETURN_IF_ERROR(range_.Unmap(0, layout_.pool_span));
    pool_mapped_ = false;
    mapped_ = 0;
    return Status::Ok();
  }

 private:
  // After a failed MapPool(): what was mapped goes back.
  void UnmapPrefix() {
    if (mapped_ > 0) (void)range_.Unmap(0, mapped_);
    mapped_ = 0;
  }

  static std::vector<int> FdNumbers(const std::vector<UniqueFd>& fds) {
    std::vector<int> out;
    for (const UniqueFd& fd : fds) out.push_back(fd.get());
    return out;
  }

  // One handle per fd, each checked to live on this rank's device; on an
  // error none is kept.
  Status Import(const std::vector<UniqueFd>& fds, std::vector<cuda::VmmHandle>* out) const {
    if (fds.size() != layout_.pool_allocations.size()) {
      return InvalidArgument("KV pool: " + std::to_string(fds.size()) + " fds for " +
                             std::to_string(layout_.pool_allocations.size()) + " allocations");
    }
    Status st;
    for (size_t i = 0; i < fds.size() && st.ok(); ++i) {
      auto h = cuda::VmmHandle::Import(fds[i].get());
      if (!h.ok()) {
        st = h.error().With("KV pool: importing allocation " + std::to_string(i));
        break;
      }
      auto props = cuda::VmmGetProperties(h->get());
      out->push_back(std::move(*h));
      if (!props.ok() || props->device != device_) {
        st = Mismatch("KV pool: allocation " + std::to_string(i) + " lives on " +
                      (props.ok() ? "cuda:" + std::to_string(props->device) : std::string("an unknown device")) +
                      ", not on this rank's cuda:" + std::to_string(device_) +
                      "; give each rank's holder the rank's GPU (parallel.devices)");
      }
    }
    if (!st.ok()) out->clear();
    return st;
  }

  void ReleaseLocked() {
    prepared_.clear();
    prepared_from_.clear();
  }

  // PreparePool()'s handles, and the fd numbers they came from.
  std::mutex prepared_mu_;
  std::vector<cuda::VmmHandle> prepared_;
  std::vector<int> prepared_from_;

  int device_ = -1;
  cuda::VmmRange range_;  // the pool span, then the scratch
  cuda::DevicePtr base_ = 0;  // range_.base()
  uint64_t size_ = 0;
  uint64_t mapped_ = 0;  // of the pool span, during MapPool()
  cuda::PrimaryContext ctx_;
};

}  // namespace

Status KvMemory::CheckPoolRange(uint64_t offset, size_t n) const {
  if (!pool_mapped_) return Unavailable("KV pool: not mapped here; its bytes are not this engine's to touch");
  if (offset > layout_.pool_span || n > layout_.pool_span - offset) {
    return InvalidArgument("KV pool: bytes " + std::to_string(offset) + " + " + std::to_string(n) +
                           " run past its " + std::to_string(layout_.pool_span) + " bytes");
  }
  return Status::Ok();
}

Result<std::unique_ptr<KvMemory>> KvMemory::CreateHost(const KvLayout& layout) {
  auto m = std::make_unique<HostKvMemory>();
  WSUP_RETURN_IF_ERROR(m->Init(layout));
  return std::unique_ptr<KvMemory>(std::move(m));
}

Result<std::unique_ptr<KvMemory>> KvMemory::CreateCuda(const KvLayout& layout, int device) {
  auto m = std::make_unique<CudaKvMemory>();
  WSUP_RETURN_IF_ERROR(m->Init(layout, device));
  return std::unique_ptr<KvMemory>(std::move(m));
}

}  // namespace wsup::engine
