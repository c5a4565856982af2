#include "client/mapping.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace wsup {
namespace {

std::string AllocName(size_t i) { return "arena allocation " + std::to_string(i); }

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
    // The names the index points into live in the entries' heap buffer,
    // which moved along with the manifest, so the views stay valid.
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
  index_.clear();
}

Result<MappedArena> MappedArena::Map(Manifest manifest, std::vector<UniqueFd> fds, int device) {
  WSUP_RETURN_IF_ERROR(manifest.Validate());
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
  const auto& allocs = m.manifest_.allocations;

  if (m.manifest_.backend == "host") {
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
      m.bases_.push_back(p);
    }
  } else {  // cuda: Validate() admits only "host" and "cuda"
    WSUP_RETURN_IF_ERROR(cuda::Init());
    WSUP_ASSIGN_OR_RETURN(cuda::DeviceInfo info, cuda::GetDeviceInfo(device));
    if (info.uuid != m.manifest_.device_uuid) {
      auto other = cuda::FindDeviceByUuid(m.manifest_.device_uuid);
      if (other.ok()) {
        return Mismatch("arena: it lives on GPU " + m.manifest_.device_uuid + ", which is device " +
                        std::to_string(*other) + " in this process, not device " + std::to_string(device) +
                        " (" + info.uuid + "): map it on device " + std::to_string(*other));
      }
      return Mismatch("arena: it lives on GPU " + m.manifest_.device_uuid +
                      ", which this process cannot see (device " + std::to_string(device) + " is " +
                      info.uuid +
                      "): run on the holder's node and make that GPU visible "
                      "(CUDA_VISIBLE_DEVICES)");
    }
    WSUP_ASSIGN_OR_RETURN(m.ctx_, cuda::PrimaryContext::Retain(device));
    WSUP_RETURN_IF_ERROR(m.ctx_.MakeCurrent());
    m.device_ = device;
    WSUP_ASSIGN_OR_RETURN(uint64_t gran, cuda::VmmGranularity(device));
    uint64_t total = 0;
    for (size_t i = 0; i < fds.size(); ++i) {
      if (allocs[i].size % gran != 0) {
        return Corrupt(AllocName(i) + ": size " + std::to_string(allocs[i].size) +
                       " is not a multiple of this device's VMM granularity (" + std::to_string(gran) +
                       "): the manifest does not describe a cuda arena of this GPU; attach again");
      }
      auto h = cuda::VmmImport(fds[i].get());
      if (!h.ok()) return h.error().With(AllocName(i));
      m.cuda_handles_.push_back(*h);
      WSUP_ASSIGN_OR_RETURN(cuda::VmmProperties props, cuda::VmmGetProperties(*h));
      if (props.device != device) {
        return Mismatch(AllocName(i) + ": the imported memory lives on device " +
                        std::to_string(props.device) + ", not device " + std::to_string(device) +
                        " as the manifest says: the fds and the manifest come from different "
                        "arenas; attach again");
      }
      total += allocs[i].size;
    }
    WSUP_ASSIGN_OR_RETURN(m.cuda_base_, cuda::VmmReserve(total, gran));
    m.cuda_reserved_ = total;
    uint64_t off = 0;
    for (size_t i = 0; i < fds.size(); ++i) {
      Status st = cuda::VmmMap(m.cuda_base_ + off, allocs[i].size, m.cuda_handles_[i]);
      if (!st.ok()) return st.error().With(AllocName(i));
      m.bases_.push_back(reinterpret_cast<void*>(m.cuda_base_ + off));
      off += allocs[i].size;
    }
    WSUP_RETURN_IF_ERROR(cuda::VmmSetAccess(m.cuda_base_, total, device));
  }
  // fds close here: the mappings (and, for cuda, the imported handles) keep
  // the memory alive.

  m.index_.reserve(m.manifest_.entries.size());
  for (size_t i = 0; i < m.manifest_.entries.size(); ++i) {
    m.index_.emplace(m.manifest_.entries[i].name, i);
  }
  return m;
}

TensorView MappedArena::Find(std::string_view name) const {
  auto it = index_.find(name);
  if (it == index_.end()) return {};
  const ManifestEntry& e = manifest_.entries[it->second];
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
