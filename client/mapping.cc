#include "client/mapping.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <system_error>
#include <thread>
#include <utility>

#include "wire/manifest_fds.h"

namespace wsup {
namespace {

using Clock = std::chrono::steady_clock;

std::string AllocName(size_t i) { return "arena allocation " + std::to_string(i); }

double Ms(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

uint64_t RoundUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

// A host arena's fd must be a memfd sealed against writes and shrinking, of
// at least the allocation's size (the check the holder makes when it adopts).
Status CheckHostFd(size_t i, int fd, uint64_t size) {
  return CheckSealedMemfd(i, fd, size, MemfdSize::kAtLeast,
                          "attach again, to an arena a holder has finished loading");
}

// `device` (this process's ordinal) must be the GPU named by `uuid`.
Status CheckDeviceIs(int device, const std::string& uuid, const std::string& what) {
  WSUP_ASSIGN_OR_RETURN(cuda::DeviceInfo info, cuda::GetDeviceInfo(device));
  if (info.uuid == uuid) return {};
  auto other = cuda::FindDeviceByUuid(uuid);
  if (other.ok()) {
    return Mismatch(what + ": it lives on GPU " + uuid + ", which is device " + std::to_string(*other) +
                    " in this process, not device " + std::to_string(device) + " (" + info.uuid +
                    "): map it on device " + std::to_string(*other));
  }
  return Mismatch(what + ": it lives on GPU " + uuid + ", which this process cannot see (device " +
                  std::to_string(device) + " is " + info.uuid +
                  "): run on the holder's node and make that GPU visible (CUDA_VISIBLE_DEVICES)");
}

}  // namespace

// ---------------------------------------------------------------- GrantMapping

Result<std::shared_ptr<GrantMapping>> GrantMapping::Create(const std::string& backend, int device,
                                                           const std::string& device_uuid) {
  std::shared_ptr<GrantMapping> g(new GrantMapping());
  if (backend == "host") return g;
  if (backend != "cuda") {
    return InvalidArgument("layout grants of backend '" + backend.substr(0, 32) + "': expected host or cuda");
  }
  g->cuda_ = true;
  WSUP_RETURN_IF_ERROR(cuda::Init());
  WSUP_RETURN_IF_ERROR(CheckDeviceIs(device, device_uuid, "the lease's memory"));
  WSUP_ASSIGN_OR_RETURN(cuda::DeviceInfo info, cuda::GetDeviceInfo(device));
  WSUP_ASSIGN_OR_RETURN(g->ctx_, cuda::PrimaryContext::Retain(device));
  g->device_ = device;
  WSUP_ASSIGN_OR_RETURN(g->granularity_, cuda::VmmGranularity(device));
  cuda::ContextScope scope;
  WSUP_RETURN_IF_ERROR(scope.Enter(g->ctx_));
  // The grants of one lease can never hold more than the device's memory,
  // so a range of that size takes them all, one after the other.
  const uint64_t size = RoundUp(info.total_memory, g->granularity_);
  WSUP_ASSIGN_OR_RETURN(g->range_, cuda::VmmRange::Reserve(size, g->granularity_));
  return g;
}

GrantMapping::~GrantMapping() {
  if (!cuda_) {
    for (size_t i = 0; i < bases_.size(); ++i) ::munmap(bases_[i], sizes_[i]);
    return;
  }
  if (!ctx_.valid()) return;
  cuda::ContextScope scope;
  if (scope.Enter(ctx_).ok()) {
    // Work still using the memory must finish before it is unmapped, or it
    // faults and poisons the context.
    (void)cuda::ContextSynchronize();
  }
  (void)range_.Reset();
  handles_.clear();
}

Result<void*> GrantMapping::Map(int fd, uint64_t size) {
  const std::string what = "layout grant " + std::to_string(bases_.size());
  if (!cuda_) {
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      return ErrnoError(what + ": mapping " + std::to_string(size) +
                            " bytes read-write (check ulimit -v and vm.max_map_count)",
                        errno);
    }
    bases_.push_back(p);
    sizes_.push_back(size);
    return p;
  }
  if (size == 0 || size % granularity_ != 0) {
    return Corrupt(what + ": " + std::to_string(size) + " bytes is not a multiple of this device's VMM granularity (" +
                   std::to_string(granularity_) + "); the holder is not a cuda holder of this GPU: restart it");
  }
  if (size > range_.size() - va_used_) {
    return Unavailable(what + ": " + std::to_string(size) + " more bytes would make the lease's grants (" +
                       std::to_string(va_used_) + " bytes so far) larger than the device's memory (" +
                       std::to_string(range_.size()) + " bytes); ask for less");
  }
  cuda::ContextScope scope;
  WSUP_RETURN_IF_ERROR(scope.Enter(ctx_));
  auto h = cuda::VmmHandle::Import(fd);
  if (!h.ok()) return h.error().With(what);
  const cuda::DevicePtr at = range_.base() + va_used_;
  Status st = [&]() -> Status {
    WSUP_ASSIGN_OR_RETURN(cuda::VmmProperties props, cuda::VmmGetProperties(h->get()));
    if (props.device != device_) {
      return Mismatch(what + ": the granted memory lives on device " + std::to_string(props.device) + ", not on device " +
                      std::to_string(device_) + " as the lease says; restart the holder");
    }
    WSUP_RETURN_IF_ERROR(range_.Map(va_used_, size, h->get()));
    Status access = range_.SetAccess(va_used_, size, device_);
    if (!access.ok()) (void)range_.Unmap(va_used_, size);
    return access;
  }();
  if (!st.ok()) return st.error().With(what);
  handles_.push_back(std::move(*h));
  bases_.push_back(reinterpret_cast<void*>(at));
  sizes_.push_back(size);
  va_used_ += size;
  return bases_.back();
}

Status GrantMapping::Park() {
  if (cuda_) return {};
  for (size_t i = 0; i < bases_.size(); ++i) {
    // MAP_FIXED replaces the shared mapping in one step: the address range
    // is never free for another mapping to take.
    void* p = ::mmap(bases_[i], sizes_[i], PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      return ErrnoError("layout grant " + std::to_string(i) + ": replacing its writable mapping before the commit",
                        errno);
    }
  }
  return {};
}

Status GrantMapping::MapFixed(size_t i, int fd, int prot) {
  if (cuda_ || i >= bases_.size()) {
    return Internal("GrantMapping::MapFixed of allocation " + std::to_string(i) + ": this is a wsup bug");
  }
  void* p = ::mmap(bases_[i], sizes_[i], prot, MAP_SHARED | MAP_FIXED, fd, 0);
  if (p == MAP_FAILED) {
    return ErrnoError("layout grant " + std::to_string(i) + ": mapping it again at its address", errno);
  }
  return {};
}

Status GrantMapping::MapWritable(size_t i, int fd) { return MapFixed(i, fd, PROT_READ | PROT_WRITE); }

Status GrantMapping::MapSealed(size_t i, int fd) { return MapFixed(i, fd, PROT_READ); }

bool GrantMapping::Locate(const void* p, uint32_t* alloc, uint64_t* offset) const {
  const auto addr = reinterpret_cast<uintptr_t>(p);
  for (size_t i = 0; i < bases_.size(); ++i) {
    const auto base = reinterpret_cast<uintptr_t>(bases_[i]);
    if (addr >= base && addr - base < sizes_[i]) {
      *alloc = static_cast<uint32_t>(i);
      *offset = addr - base;
      return true;
    }
  }
  return false;
}

// ---------------------------------------------------------------- MappedArena

MappedArena::MappedArena(MappedArena&& o) noexcept { *this = std::move(o); }

MappedArena& MappedArena::operator=(MappedArena&& o) noexcept {
  if (this != &o) {
    Unmap();
    manifest_ = std::move(o.manifest_);
    bases_ = std::exchange(o.bases_, {});
    cuda_range_ = std::move(o.cuda_range_);
    cuda_handles_ = std::exchange(o.cuda_handles_, {});
    device_ = std::exchange(o.device_, -1);
    ctx_ = std::move(o.ctx_);
    writer_ = std::move(o.writer_);
    // The index holds positions into the entries, which moved along.
    index_ = std::exchange(o.index_, {});
    o.manifest_ = Manifest();
  }
  return *this;
}

MappedArena::~MappedArena() { Unmap(); }

void MappedArena::Unmap() {
  if (writer_) {
    // The writer's mapping unmaps itself once its last owner lets it go.
    bases_.clear();
    writer_.reset();
    ctx_ = cuda::PrimaryContext();
    device_ = -1;
    index_.Clear();
    return;
  }
  if (manifest_.backend == "cuda") {
    if (ctx_.valid() && !bases_.empty()) {
      // Work still reading the range must finish before it is unmapped, or
      // it faults and poisons the context.
      (void)ctx_.MakeCurrent();
      (void)cuda::ContextSynchronize();
    }
    (void)cuda_range_.Reset();
    cuda_handles_.clear();
  } else {
    for (size_t i = 0; i < bases_.size(); ++i) {
      if (bases_[i]) ::munmap(bases_[i], manifest_.allocations[i].size);
    }
  }
  bases_.clear();
  cuda_handles_.clear();
  ctx_ = cuda::PrimaryContext();
  device_ = -1;
  index_.Clear();
}

Status MappedArena::MapHost(const std::vector<UniqueFd>& fds) {
  const auto& allocs = manifest_.allocations;
  for (size_t i = 0; i < fds.size(); ++i) {
    int fd = fds[i].get();
    uint64_t size = allocs[i].size;
    WSUP_RETURN_IF_ERROR(CheckHostFd(i, fd, size));
    void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      return ErrnoError(AllocName(i) + ": mmap of " + std::to_string(size) +
                            " bytes read-only (check ulimit -v and vm.max_map_count)",
                        errno);
    }
    bases_.push_back(p);
  }
  return {};
}

Status MappedArena::MapDevice(const std::vector<UniqueFd>& fds, int device) {
  const auto& allocs = manifest_.allocations;
  WSUP_RETURN_IF_ERROR(cuda::Init());
  WSUP_RETURN_IF_ERROR(CheckDeviceIs(device, manifest_.device_uuid, "arena"));
  WSUP_ASSIGN_OR_RETURN(ctx_, cuda::PrimaryContext::Retain(device));
  WSUP_RETURN_IF_ERROR(ctx_.MakeCurrent());
  device_ = device;
  WSUP_ASSIGN_OR_RETURN(uint64_t gran, cuda::VmmGranularity(device));
  // One import per allocation, ONE virtual range for all of them, one map
  // per allocation into it, and ONE access grant over the whole range.
  std::vector<uint64_t> sizes;
  std::vector<cuda::MemHandle> handles;
  for (size_t i = 0; i < fds.size(); ++i) {
    if (allocs[i].size % gran != 0) {
      return Corrupt(AllocName(i) + ": size " + std::to_string(allocs[i].size) +
                     " is not a multiple of this device's VMM granularity (" + std::to_string(gran) +
                     "): the manifest does not describe a cuda arena of this GPU; attach again");
    }
    auto h = cuda::VmmHandle::Import(fds[i].get());
    if (!h.ok()) return h.error().With(AllocName(i));
    handles.push_back(h->get());
    cuda_handles_.push_back(std::move(*h));
    WSUP_ASSIGN_OR_RETURN(cuda::VmmProperties props, cuda::VmmGetProperties(handles.back()));
    if (props.device != device) {
      return Mismatch(AllocName(i) + ": the imported memory lives on device " + std::to_string(props.device) +
                      ", not device " + std::to_string(device) +
                      " as the manifest says: the fds and the manifest come from different "
                      "arenas; attach again");
    }
    sizes.push_back(allocs[i].size);
  }
  // On an error MapAll leaves nothing mapped; the handles go with Unmap().
  WSUP_ASSIGN_OR_RETURN(cuda_range_, cuda::VmmRange::MapAll(sizes, handles, gran, device, "arena allocation"));
  uint64_t off = 0;
  for (uint64_t size : sizes) {
    bases_.push_back(reinterpret_cast<void*>(cuda_range_.base() + off));
    off += size;
  }
  return {};
}

Status MappedArena::MapOverWriter(const std::vector<UniqueFd>& fds, std::shared_ptr<GrantMapping> writer) {
  const auto& allocs = manifest_.allocations;
  const bool cuda = manifest_.backend == "cuda";
  bool same = writer->is_cuda() == cuda && writer->size() == allocs.size();
  for (size_t i = 0; same && i < allocs.size(); ++i) same = writer->bytes(i) == allocs[i].size;
  if (!same) {
    return Internal("arena: the committed layout's allocations (" + std::to_string(allocs.size()) + ", backend " +
                    manifest_.backend + ") are not the writer's grants (" + std::to_string(writer->size()) +
                    "); this is a holder bug: restart the holder");
  }
  if (cuda) {
    WSUP_ASSIGN_OR_RETURN(ctx_, cuda::PrimaryContext::Retain(writer->device()));
    device_ = writer->device();
  } else {
    for (size_t i = 0; i < fds.size(); ++i) {
      WSUP_RETURN_IF_ERROR(CheckHostFd(i, fds[i].get(), allocs[i].size));
      WSUP_RETURN_IF_ERROR(writer->MapSealed(i, fds[i].get()));
    }
  }
  for (size_t i = 0; i < allocs.size(); ++i) bases_.push_back(writer->base(i));
  writer_ = std::move(writer);
  return {};
}

Result<MappedArena> MappedArena::Map(Manifest manifest, std::vector<UniqueFd> fds, int device,
                                     MapStats* stats, std::string_view table,
                                     std::shared_ptr<GrantMapping> writer) {
  MapStats local;
  MapStats& st = stats != nullptr ? *stats : local;
  st = MapStats{};
  if (!table.empty() && !manifest.entries.empty()) {
    return InvalidArgument(
        "arena: a manifest with entries and a tensor table besides; pass the entries one way");
  }
  // Enough to map safely; the entries are checked below.
  WSUP_RETURN_IF_ERROR(manifest.ValidateHeader());
  WSUP_RETURN_IF_ERROR(
      CheckAllocationFds(manifest, fds, "the sender must pass one fd per allocation, in allocation order"));

  MappedArena m;
  m.manifest_ = std::move(manifest);
  const bool cuda = m.manifest_.backend == "cuda";  // ValidateHeader() admits only host and cuda
  // The two sides touch different members: the entries side writes the
  // entries and the index, the allocations side the mapping; both only read
  // the header. So they may run at once.
  auto entries_side = [&]() -> Status {
    auto t0 = Clock::now();
    if (!table.empty()) WSUP_RETURN_IF_ERROR(DecodeTensorTable(table, &m.manifest_.entries));
    auto t1 = Clock::now();
    st.decode_ms = Ms(t0, t1);
    WSUP_RETURN_IF_ERROR(m.manifest_.ValidateLayout());
    auto t2 = Clock::now();
    st.checks_ms = Ms(t1, t2);
    // The name index is the uniqueness check; it is kept for Find().
    Status unique = m.manifest_.CheckUniqueNames(&m.index_);
    st.index_ms = Ms(t2, Clock::now());
    return unique;
  };
  auto allocations_side = [&]() -> Status {
    auto t0 = Clock::now();
    Status s = writer ? m.MapOverWriter(fds, writer) : cuda ? m.MapDevice(fds, device) : m.MapHost(fds);
    st.map_ms = Ms(t0, Clock::now());
    return s;
  };
  Status entries_status, allocations_status;
  // Mapping a cuda arena takes milliseconds of driver calls, and so does
  // decoding and checking thousands of entries: with many entries, map on a
  // second thread meanwhile. A host mmap gains little from it but takes the
  // same path, so that the path the GPU relies on is the one tests run.
  const bool many = table.size() >= kOverlapTableBytes || m.manifest_.entries.size() >= kOverlapEntries;
  std::thread mapper;
  if (many) {
    try {
      mapper = std::thread([&] { allocations_status = allocations_side(); });
    } catch (const std::system_error&) {
      // No thread to be had: do both here, one after the other.
    }
  }
  if (mapper.joinable()) {
    entries_status = entries_side();
    mapper.join();
    st.overlapped = true;
  } else {
    // Entries first: a manifest that does not hold together maps nothing.
    entries_status = entries_side();
    if (entries_status.ok()) allocations_status = allocations_side();
  }
  // On an error, m's destructor undoes whatever was mapped.
  if (!entries_status.ok()) return entries_status.error();
  if (!allocations_status.ok()) return allocations_status.error();
  // The caller's thread gets the context current, as with a mapping made on it.
  if (cuda) WSUP_RETURN_IF_ERROR(m.ctx_.MakeCurrent());
  // fds close here: the mappings (and, for cuda, the imported handles) keep
  // the memory alive.
  return m;
}

TensorView MappedArena::Find(std::string_view name) const {
  size_t i = index_.Find(name, manifest_.entries);
  if (i == TensorIndex::npos) return {};
  const ManifestEntry& e = manifest_.entries[i];
  return {&e, static_cast<const uint8_t*>(bases_[e.alloc]) + e.offset};
}

TensorView MappedArena::At(size_t i) const {
  if (i >= manifest_.entries.size()) return {};
  const ManifestEntry& e = manifest_.entries[i];
  return {&e, static_cast<const uint8_t*>(bases_[e.alloc]) + e.offset};
}

Status MappedArena::CopyToHost(const ManifestEntry& e, void* dst) const {
  if (e.alloc >= bases_.size() || e.offset > manifest_.allocations[e.alloc].size ||
      e.nbytes > manifest_.allocations[e.alloc].size - e.offset) {
    return InvalidArgument("arena: tensor '" + e.name +
                           "' is not inside this mapping: pass an entry of this arena's manifest");
  }
  if (e.nbytes == 0) return {};
  const auto* src = static_cast<const uint8_t*>(bases_[e.alloc]) + e.offset;
  if (!is_cuda()) {
    std::memcpy(dst, src, e.nbytes);
    return {};
  }
  WSUP_RETURN_IF_ERROR(ctx_.MakeCurrent());
  Status st = cuda::CopyDtoH(dst, reinterpret_cast<cuda::DevicePtr>(src), e.nbytes);
  if (!st.ok()) return st.error().With("arena: tensor '" + e.name + "'");
  return {};
}

}  // namespace wsup
