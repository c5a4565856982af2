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

namespace wsup {
namespace {

using Clock = std::chrono::steady_clock;

std::string AllocName(size_t i) { return "arena allocation " + std::to_string(i); }

double Ms(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

}  // namespace

MappedArena::MappedArena(MappedArena&& o) noexcept { *this = std::move(o); }

MappedArena& MappedArena::operator=(MappedArena&& o) noexcept {
  if (this != &o) {
    Unmap();
    manifest_ = std::move(o.manifest_);
    bases_ = std::exchange(o.bases_, {});
    cuda_reserved_ = std::exchange(o.cuda_reserved_, 0);
    cuda_base_ = std::exchange(o.cuda_base_, 0);
    cuda_handles_ = std::exchange(o.cuda_handles_, {});
    device_ = std::exchange(o.device_, -1);
    ctx_ = std::move(o.ctx_);
    // The index holds positions into the entries, which moved along.
    index_ = std::exchange(o.index_, {});
    o.manifest_ = Manifest();
  }
  return *this;
}

MappedArena::~MappedArena() { Unmap(); }

void MappedArena::Unmap() {
  if (manifest_.backend == "cuda") {
    if (ctx_.valid() && !bases_.empty()) {
      // Work still reading the range must finish before it is unmapped, or
      // it faults and poisons the context.
      (void)ctx_.MakeCurrent();
      (void)cuda::ContextSynchronize();
    }
    for (size_t i = 0; i < bases_.size(); ++i) {
      (void)cuda::VmmUnmap(reinterpret_cast<cuda::DevicePtr>(bases_[i]), manifest_.allocations[i].size);
    }
    if (cuda_base_ != 0) (void)cuda::VmmFree(cuda_base_, cuda_reserved_);
    for (uint64_t h : cuda_handles_) (void)cuda::VmmRelease(h);
  } else {
    for (size_t i = 0; i < bases_.size(); ++i) {
      if (bases_[i]) ::munmap(bases_[i], manifest_.allocations[i].size);
    }
  }
  bases_.clear();
  cuda_handles_.clear();
  cuda_base_ = 0;
  cuda_reserved_ = 0;
  ctx_ = cuda::PrimaryContext();
  device_ = -1;
  index_.Clear();
}

Status MappedArena::MapHost(const std::vector<UniqueFd>& fds) {
  const auto& allocs = manifest_.allocations;
  for (size_t i = 0; i < fds.size(); ++i) {
    int fd = fds[i].get();
    uint64_t size = allocs[i].size;
    int seals = ::fcntl(fd, F_GET_SEALS);
    if (seals < 0) {
      return ErrnoError(AllocName(i) + ": fd " + std::to_string(fd) +
                            " is not a sealable memfd (F_GET_SEALS); host arenas are memfds made "
                            "by a wsup holder: attach to the holder again",
                        errno);
    }
    if ((seals & (F_SEAL_WRITE | F_SEAL_SHRINK)) != (F_SEAL_WRITE | F_SEAL_SHRINK)) {
      return Refused(AllocName(i) +
                     ": the memfd is not sealed against writes and shrinking, so "
                     "its bytes could change or vanish under a reader: attach only to an arena "
                     "a holder has finished loading");
    }
    struct stat st;
    if (::fstat(fd, &st) != 0) return ErrnoError(AllocName(i) + ": fstat", errno);
    if (static_cast<uint64_t>(st.st_size) < size) {
      return Mismatch(AllocName(i) + ": the memfd holds " + std::to_string(st.st_size) +
                      " bytes but the manifest says " + std::to_string(size) +
                      ": the fds and the manifest come from different arenas; attach again");
    }
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
  WSUP_ASSIGN_OR_RETURN(cuda::DeviceInfo info, cuda::GetDeviceInfo(device));
  if (info.uuid != manifest_.device_uuid) {
    auto other = cuda::FindDeviceByUuid(manifest_.device_uuid);
    if (other.ok()) {
      return Mismatch("arena: it lives on GPU " + manifest_.device_uuid + ", which is device " +
                      std::to_string(*other) + " in this process, not device " + std::to_string(device) +
                      " (" + info.uuid + "): map it on device " + std::to_string(*other));
    }
    return Mismatch("arena: it lives on GPU " + manifest_.device_uuid +
                    ", which this process cannot see (device " + std::to_string(device) + " is " + info.uuid +
                    "): run on the holder's node and make that GPU visible "
                    "(CUDA_VISIBLE_DEVICES)");
  }
  WSUP_ASSIGN_OR_RETURN(ctx_, cuda::PrimaryContext::Retain(device));
  WSUP_RETURN_IF_ERROR(ctx_.MakeCurrent());
  device_ = device;
  WSUP_ASSIGN_OR_RETURN(uint64_t gran, cuda::VmmGranularity(device));
  // One import per allocation, ONE virtual range for all of them, one map
  // per allocation into it, and ONE access grant over the whole range.
  uint64_t total = 0;
  for (size_t i = 0; i < fds.size(); ++i) {
    if (allocs[i].size % gran != 0) {
      return Corrupt(AllocName(i) + ": size " + std::to_string(allocs[i].size) +
                     " is not a multiple of this device's VMM granularity (" + std::to_string(gran) +
                     "): the manifest does not describe a cuda arena of this GPU; attach again");
    }
    auto h = cuda::VmmImport(fds[i].get());
    if (!h.ok()) return h.error().With(AllocName(i));
    cuda_handles_.push_back(*h);
    WSUP_ASSIGN_OR_RETURN(cuda::VmmProperties props, cuda::VmmGetProperties(*h));
    if (props.device != device) {
      return Mismatch(AllocName(i) + ": the imported memory lives on device " + std::to_string(props.device) +
                      ", not device " + std::to_string(device) +
                      " as the manifest says: the fds and the manifest come from different "
                      "arenas; attach again");
    }
    total += allocs[i].size;
  }
  WSUP_ASSIGN_OR_RETURN(cuda_base_, cuda::VmmReserve(total, gran));
  cuda_reserved_ = total;
  uint64_t off = 0;
  for (size_t i = 0; i < fds.size(); ++i) {
    Status st = cuda::VmmMap(cuda_base_ + off, allocs[i].size, cuda_handles_[i]);
    if (!st.ok()) return st.error().With(AllocName(i));
    bases_.push_back(reinterpret_cast<void*>(cuda_base_ + off));
    off += allocs[i].size;
  }
  return cuda::VmmSetAccess(cuda_base_, total, device);
}

Result<MappedArena> MappedArena::Map(Manifest manifest, std::vector<UniqueFd> fds, int device,
                                     MapStats* stats, std::string_view table) {
  MapStats local;
  MapStats& st = stats != nullptr ? *stats : local;
  st = MapStats{};
  if (!table.empty() && !manifest.entries.empty()) {
    return InvalidArgument(
        "arena: a manifest with entries and a tensor table besides; pass the entries one way");
  }
  // Enough to map safely; the entries are checked below.
  WSUP_RETURN_IF_ERROR(manifest.ValidateHeader());
  if (fds.size() != manifest.allocations.size()) {
    return InvalidArgument("arena: got " + std::to_string(fds.size()) + " fds for " +
                           std::to_string(manifest.allocations.size()) +
                           " allocations in the manifest: the sender must pass one fd per "
                           "allocation, in allocation order");
  }
  for (size_t i = 0; i < fds.size(); ++i) {
    if (!fds[i].valid()) {
      return InvalidArgument(AllocName(i) +
                             ": no fd was passed for it: the sender must pass one fd "
                             "per allocation");
    }
  }

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
    Status s = cuda ? m.MapDevice(fds, device) : m.MapHost(fds);
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
