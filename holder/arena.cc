#include "holder/arena.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <limits>
#include <memory>

#include "gpu/cuda_driver.h"
#include "gpu/vmm.h"
#include "holder/loader.h"
#include "wire/manifest_fds.h"

namespace wsup {
namespace {

constexpr uint64_t kHostGranularity = 4096;
constexpr int kSealsAll = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL;

uint64_t RoundUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

double Since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

Status CheckOptions(const LoadOptions& o) {
  if (o.backend != "host" && o.backend != "cuda") {
    return InvalidArgument("arena: backend '" + o.backend + "' is unknown: use 'host' or 'cuda'");
  }
  if (o.read_threads < 1 || o.read_threads > 64) {
    return InvalidArgument("arena: read_threads = " + std::to_string(o.read_threads) + ": use 1..64");
  }
  if (o.staging_buffers < 1 || o.staging_buffers > 64) {
    return InvalidArgument("arena: staging_buffers = " + std::to_string(o.staging_buffers) + ": use 1..64");
  }
  if (o.staging_bytes < (1ull << 20) || o.staging_bytes > (4ull << 30)) {
    return InvalidArgument("arena: staging_bytes = " + std::to_string(o.staging_bytes) +
                           ": use 1 MiB..4 GiB (64 MiB reads keep a disk busy)");
  }
  if (o.backend == "cuda" && o.device < 0) {
    return InvalidArgument("arena: device = " + std::to_string(o.device) + ": use a cuda ordinal >= 0");
  }
  return {};
}

std::string AllocName(size_t i) { return "arena allocation " + std::to_string(i); }

}  // namespace

// A freshly allocated arena, writable until Finish(). On destruction before
// Finish() every resource is released (the load failed).
class ArenaBuilder {
 public:
  ArenaBuilder() = default;
  ArenaBuilder(const ArenaBuilder&) = delete;
  ArenaBuilder& operator=(const ArenaBuilder&) = delete;
  ~ArenaBuilder() { Release(); }

  static Result<std::unique_ptr<ArenaBuilder>> Create(Manifest m, const LoadOptions& opts) {
    auto b = std::make_unique<ArenaBuilder>();
    b->m_ = std::move(m);
    if (b->m_.backend == "host") {
      WSUP_RETURN_IF_ERROR(b->CreateHost());
    } else {
      WSUP_RETURN_IF_ERROR(b->CreateCuda(opts.device));
    }
    return b;
  }

  const Manifest& manifest() const { return m_; }

  FillDest dest() const {
    FillDest d;
    d.cuda = m_.backend == "cuda";
    if (d.cuda) {
      uint64_t off = 0;
      for (const auto& a : m_.allocations) {
        d.device_bases.push_back(range_.base() + off);
        off += a.size;
      }
      d.context = &ctx_;
    } else {
      d.host_bases.push_back(host_map_);
    }
    return d;
  }

  // Makes the arena immutable and hands its fds to an Arena.
  Result<Arena> Finish() {
    if (m_.backend == "host") {
      // F_SEAL_WRITE needs every writable shared mapping gone first.
      ::munmap(host_map_, m_.allocations[0].size);
      host_map_ = nullptr;
      if (::fcntl(fds_[0].get(), F_ADD_SEALS, kSealsAll) != 0) {
        return ErrnoError("arena: sealing the host memfd read-only (needs Linux >= 3.17 memfd sealing)",
                          errno);
      }
    } else {
      WSUP_RETURN_IF_ERROR(ctx_.MakeCurrent());
      // Every fill must have landed before the temporary mapping goes away
      // (an access through an unmapped range poisons the context).
      WSUP_RETURN_IF_ERROR(cuda::ContextSynchronize());
      (void)range_.Reset();
      // The exported fds keep the memory alive from here on.
      handles_.clear();
    }
    return Arena(std::move(m_), std::move(fds_));
  }

 private:
  Status CreateHost() {
    const uint64_t size = m_.allocations[0].size;
    int fd = ::memfd_create("wsup-arena", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) return ErrnoError("arena: memfd_create (needs Linux >= 3.17)", errno);
    fds_.emplace_back(fd);
    if (::ftruncate(fd, static_cast<off_t>(size)) != 0) {
      return ErrnoError("arena: sizing the host memfd to " + std::to_string(size) + " bytes", errno);
    }
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      return ErrnoError("arena: mapping the host memfd of " + std::to_string(size) +
                            " bytes (check free memory and ulimit -v)",
                        errno);
    }
    host_map_ = static_cast<uint8_t*>(p);
    return {};
  }

  Status CreateCuda(int device) {
    WSUP_ASSIGN_OR_RETURN(cuda::DeviceInfo info, cuda::GetDeviceInfo(device));
    if (!info.vmm_supported || !info.posix_fd_supported) {
      return Unavailable(
          "arena: CUDA device " + std::to_string(device) + " (" + info.name +
          ") does not support VMM allocations exportable as POSIX fds: use backend "
          "host, or a GPU and driver that do (compute capability >= 6.0, Linux driver >= 450)");
    }
    m_.device = device;
    m_.device_uuid = info.uuid;
    WSUP_ASSIGN_OR_RETURN(ctx_, cuda::PrimaryContext::Retain(device));
    WSUP_RETURN_IF_ERROR(ctx_.MakeCurrent());
    WSUP_ASSIGN_OR_RETURN(uint64_t gran, cuda::VmmGranularity(device));
    std::vector<uint64_t> sizes;
    std::vector<cuda::MemHandle> handles;
    for (size_t i = 0; i < m_.allocations.size(); ++i) {
      auto h = cuda::VmmHandle::Create(device, m_.allocations[i].size);
      if (!h.ok()) return h.error().With(AllocName(i));
      auto fd = h->Export();
      if (!fd.ok()) return fd.error().With(AllocName(i));
      fds_.push_back(std::move(*fd));
      sizes.push_back(m_.allocations[i].size);
      handles.push_back(h->get());
      handles_.push_back(std::move(*h));
    }
    // A temporary mapping of the whole arena, only for filling it.
    const uint64_t total = m_.arena_bytes();
    WSUP_ASSIGN_OR_RETURN(range_, cuda::VmmRange::MapAll(sizes, handles, gran, device, "arena allocation"));
    // New device memory holds whatever was there before; zero it so that
    // padding between tensors is deterministic. The memset runs on the
    // legacy stream, which the loader's non-blocking streams do not wait
    // for: finish it before any copy starts.
    WSUP_RETURN_IF_ERROR(cuda::MemsetD8(range_.base(), 0, total));
    WSUP_RETURN_IF_ERROR(cuda::ContextSynchronize());
    return {};
  }

  void Release() {
    if (host_map_) ::munmap(host_map_, m_.allocations[0].size);
    host_map_ = nullptr;
    if (ctx_.valid()) {
      (void)ctx_.MakeCurrent();
      (void)cuda::ContextSynchronize();
      (void)range_.Reset();
      handles_.clear();
    }
    fds_.clear();
  }

  Manifest m_;
  std::vector<UniqueFd> fds_;
  uint8_t* host_map_ = nullptr;
  cuda::PrimaryContext ctx_;
  std::vector<cuda::VmmHandle> handles_;  // until Finish(): the exported fds keep the memory after
  cuda::VmmRange range_;                   // the temporary mapping for filling
};

namespace {

// Granularity and allocation cap for a backend.
Status LayoutParams(const LoadOptions& opts, uint64_t* gran, uint64_t* max_alloc) {
  if (opts.backend == "host") {
    *gran = kHostGranularity;
    *max_alloc = std::numeric_limits<uint64_t>::max();
    return {};
  }
  WSUP_RETURN_IF_ERROR(cuda::Init());
  WSUP_ASSIGN_OR_RETURN(*gran, cuda::VmmGranularity(opts.device));
  *max_alloc = RoundUp(opts.max_alloc_bytes ? opts.max_alloc_bytes : kDefaultCudaMaxAlloc, *gran);
  return {};
}

// The options checked, the tensors laid out for the backend, and the
// allocations made, empty: what loading and synthesizing both start with.
Result<std::unique_ptr<ArenaBuilder>> EmptyArena(const std::vector<ShardedTensor>& tensors,
                                                 const LoadOptions& opts) {
  WSUP_RETURN_IF_ERROR(CheckOptions(opts));
  uint64_t gran = 0, max_alloc = 0;
  WSUP_RETURN_IF_ERROR(LayoutParams(opts, &gran, &max_alloc));
  return ArenaBuilder::Create(PlanLayout(tensors, opts.backend, gran, max_alloc), opts);
}

}  // namespace

Arena::Arena(Arena&&) noexcept = default;
Arena& Arena::operator=(Arena&&) noexcept = default;
Arena::~Arena() = default;

Result<Arena> Arena::Load(const Checkpoint& ckpt, const std::vector<ShardedTensor>& shards,
                          const LoadOptions& opts, LoadStats* stats) {
  const auto t0 = std::chrono::steady_clock::now();
  WSUP_ASSIGN_OR_RETURN(auto builder, EmptyArena(shards, opts));
  LoadStats local;
  local.alloc_seconds = Since(t0);
  Status filled = FillArena(ckpt, shards, builder->manifest(), builder->dest(), opts, &local);
  if (!filled.ok()) return filled.error().With("loading " + ckpt.dir());
  WSUP_ASSIGN_OR_RETURN(Arena arena, builder->Finish());
  local.seconds = Since(t0);
  local.arena_bytes = arena.manifest().arena_bytes();
  local.read_gbps = local.seconds > 0 ? static_cast<double>(local.bytes_read) / local.seconds / 1e9 : 0;
  if (stats) *stats = local;
  return arena;
}

Result<Arena> Arena::Synthesize(const std::vector<ShardedTensor>& tensors, const LoadOptions& opts,
                                LoadStats* stats) {
  const auto t0 = std::chrono::steady_clock::now();
  WSUP_ASSIGN_OR_RETURN(auto builder, EmptyArena(tensors, opts));
  LoadStats local;
  local.alloc_seconds = Since(t0);
  const FillDest dest = builder->dest();
  const auto& entries = builder->manifest().entries;
  for (size_t i = 0; i < entries.size(); ++i) {
    const auto& e = entries[i];
    if (e.nbytes == 0) continue;
    if (dest.cuda) {
      WSUP_RETURN_IF_ERROR(cuda::MemsetD8(dest.device_bases[e.alloc] + e.offset, SyntheticByte(i), e.nbytes));
    } else {
      std::memset(dest.host_bases[e.alloc] + e.offset, SyntheticByte(i), e.nbytes);
    }
  }
  WSUP_ASSIGN_OR_RETURN(Arena arena, builder->Finish());
  local.seconds = Since(t0);
  local.arena_bytes = arena.manifest().arena_bytes();
  if (stats) *stats = local;
  return arena;
}

Result<Arena> Arena::Adopt(Manifest manifest, std::vector<UniqueFd> fds) {
  WSUP_RETURN_IF_ERROR(manifest.Validate());
  WSUP_RETURN_IF_ERROR(CheckAllocationFds(manifest, fds, "keep and pass one fd per allocation, in allocation order"));
  if (manifest.backend == "host") {
    for (size_t i = 0; i < fds.size(); ++i) {
      WSUP_RETURN_IF_ERROR(CheckSealedMemfd(i, fds[i].get(), manifest.allocations[i].size, MemfdSize::kExact,
                                            "load from the checkpoint instead"));
    }
    return Arena(std::move(manifest), std::move(fds));
  }

  // cuda: import each allocation and map it at its manifest size, which
  // fails when the memory is smaller than the manifest says.
  WSUP_RETURN_IF_ERROR(cuda::Init());
  WSUP_ASSIGN_OR_RETURN(int device, cuda::FindDeviceByUuid(manifest.device_uuid));
  manifest.device = device;
  WSUP_ASSIGN_OR_RETURN(cuda::PrimaryContext ctx, cuda::PrimaryContext::Retain(device));
  WSUP_RETURN_IF_ERROR(ctx.MakeCurrent());
  WSUP_ASSIGN_OR_RETURN(uint64_t gran, cuda::VmmGranularity(device));
  for (size_t i = 0; i < fds.size(); ++i) {
    const uint64_t size = manifest.allocations[i].size;
    if (size % gran != 0) {
      return Corrupt(AllocName(i) + ": size " + std::to_string(size) + " is not a multiple of the device's " +
                     std::to_string(gran) +
                     "-byte granularity: the manifest is not of a cuda arena here; "
                     "load from the checkpoint instead");
    }
    auto h = cuda::VmmHandle::Import(fds[i].get());
    if (!h.ok()) return h.error().With(AllocName(i));
    Status st = [&]() -> Status {
      WSUP_ASSIGN_OR_RETURN(cuda::VmmProperties props, cuda::VmmGetProperties(h->get()));
      if (props.device != device) {
        return Mismatch(AllocName(i) + ": the kept memory is on device " + std::to_string(props.device) +
                        ", not on " + manifest.device_uuid + " (device " + std::to_string(device) +
                        "): the fds and the manifest belong to different arenas");
      }
      // A trial mapping, gone (with the handle) at the end of the scope.
      WSUP_ASSIGN_OR_RETURN(cuda::VmmRange trial, cuda::VmmRange::Reserve(size, gran));
      return trial.Map(0, size, h->get());
    }();
    if (!st.ok()) return st.error().With(AllocName(i) + " (adopting a kept fd)");
  }
  return Arena(std::move(manifest), std::move(fds));
}

Result<std::vector<UniqueFd>> DupEach(const std::vector<UniqueFd>& fds) {
  std::vector<UniqueFd> out;
  out.reserve(fds.size());
  for (const auto& fd : fds) {
    WSUP_ASSIGN_OR_RETURN(UniqueFd d, fd.Dup());
    out.push_back(std::move(d));
  }
  return out;
}

Result<std::vector<UniqueFd>> Arena::DupFds() const { return DupEach(fds_); }

Manifest PlanLayout(const std::vector<ShardedTensor>& shards, const std::string& backend,
                    uint64_t granularity, uint64_t max_alloc_bytes) {
  const uint64_t gran = std::max<uint64_t>(granularity, kHostGranularity);
  Manifest m;
  m.backend = backend;
  m.device = -1;
  m.device_uuid = backend == "host" ? "host" : "";
  m.entries.reserve(shards.size());
  uint64_t cursor = 0;
  bool open = false;
  auto close = [&]() {
    m.allocations.push_back({std::max(RoundUp(cursor, gran), gran)});
    cursor = 0;
    open = false;
  };
  for (const auto& t : shards) {
    uint64_t off = RoundUp(cursor, Manifest::kTensorAlignment);
    if (open && cursor > 0 && (off > max_alloc_bytes || t.nbytes > max_alloc_bytes - off)) {
      close();
      off = 0;
    }
    open = true;
    ManifestEntry e;
    e.name = t.name;
    e.dtype = DTypeName(t.dtype);
    e.shape = t.shape;
    e.alloc = static_cast<uint32_t>(m.allocations.size());
    e.offset = off;
    e.nbytes = t.nbytes;
    m.entries.push_back(std::move(e));
    cursor = off + t.nbytes;
  }
  if (open || m.allocations.empty()) close();
  return m;
}

}  // namespace wsup
