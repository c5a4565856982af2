// MappedArena: a process's read-only view of an arena, from the manifest and
// the fds it came with. Host: mmap(PROT_READ). Cuda: import each fd, reserve
// one virtual range, map every allocation into it, grant the device access.
//
// The mapping lives until the MappedArena is destroyed, independently of the
// holder: once mapped, the holder may die and the bytes stay readable.
// Lookups are O(1) by name. Thread-safety: const methods may be called from
// any thread once Map() has returned.
//
// Host: every fd must be a memfd sealed against writes and shrinking (what
// Arena::Load makes), so no one can change the bytes under a reader or make
// its mapping fault (SIGBUS) by truncating the file.
// Cuda: the device's primary context is retained for the mapping's life; the
// arena must live on the GPU whose uuid the manifest names (`device` is this
// process's ordinal for it). VMM cannot map memory read-only on the device
// that owns it, so the range is read/write: clients must not write to it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "client/cuda_driver.h"
#include "client/manifest.h"
#include "common/status.h"
#include "common/unique_fd.h"

namespace wsup {

struct TensorView {
  const ManifestEntry* entry = nullptr;
  const void* data = nullptr;  // host pointer (host backend) or device pointer (cuda)
};

class MappedArena {
 public:
  MappedArena() = default;
  MappedArena(MappedArena&&) noexcept;
  MappedArena& operator=(MappedArena&&) noexcept;
  ~MappedArena();

  // Takes ownership of fds (closed once mapped; the mapping keeps the memory).
  // `device` is the cuda ordinal to map on (ignored for host).
  static Result<MappedArena> Map(Manifest manifest, std::vector<UniqueFd> fds, int device = 0);

  const Manifest& manifest() const { return manifest_; }
  bool is_cuda() const { return manifest_.backend == "cuda"; }
  // nullptr view when absent.
  TensorView Find(std::string_view name) const;
  size_t size() const { return manifest_.entries.size(); }

  // Copies a tensor's bytes into host memory (a plain copy for host, a
  // device-to-host copy for cuda). For verification and tests.
  Status CopyToHost(const ManifestEntry& e, void* dst) const;

 private:
  void Unmap();
  Manifest manifest_;
  std::vector<void*> bases_;     // one per allocation (host) / device address (cuda)
  uint64_t cuda_reserved_ = 0;   // bytes of the reserved VA range (cuda)
  uint64_t cuda_base_ = 0;       // start of the reserved VA range (cuda)
  std::vector<uint64_t> cuda_handles_;  // CUmemGenericAllocationHandle per allocation
  int device_ = -1;
  cuda::PrimaryContext ctx_;     // retained while mapped (cuda)
  std::unordered_map<std::string_view, size_t> index_;
};

}  // namespace wsup
