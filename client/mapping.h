// MappedArena: a process's read-only view of an arena, from the manifest and
// the fds it came with. Host: mmap(PROT_READ). Cuda: import each fd, reserve
// one virtual range, map every allocation into it, grant the device access.
//
// The mapping lives until the MappedArena is destroyed, independently of the
// holder: once mapped, the holder may die and the bytes stay readable.
// Lookups are O(1) by name. Thread-safety: const methods may be called from
// any thread once Map() has returned; Map() itself may use a second thread
// for the length of the call.
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
#include <vector>

#include "common/status.h"
#include "common/unique_fd.h"
#include "wire/cuda_driver.h"
#include "wire/manifest.h"

namespace wsup {

struct TensorView {
  const ManifestEntry* entry = nullptr;
  const void* data = nullptr;  // host pointer (host backend) or device pointer (cuda)
};

// Where Map() spent its time, in milliseconds.
struct MapStats {
  double decode_ms = 0;  // the tensor table, when one was passed
  double checks_ms = 0;  // Manifest::ValidateLayout()
  double index_ms = 0;   // the name index (which also finds duplicate names)
  double map_ms = 0;     // host: check seals and mmap; cuda: import, reserve, map, set access
  // True when map_ms ran on a second thread beside decode, checks and
  // index, so that Map() took about the longer of the two, not the sum.
  bool overlapped = false;
};

class MappedArena {
 public:
  MappedArena() = default;
  MappedArena(MappedArena&&) noexcept;
  MappedArena& operator=(MappedArena&&) noexcept;
  ~MappedArena();

  // Validates the manifest and maps. Takes ownership of fds (closed once
  // mapped; the mapping keeps the memory). `device` is the cuda ordinal to
  // map on (ignored for host). `stats`, when given, gets the time per step.
  //
  // With `table` (a tensor table, wire/manifest.h), `manifest` holds only
  // the header (ManifestDecoding::kHeaderOnly) and the entries are decoded
  // from the table here. The header is checked before anything is mapped;
  // with many entries, they are decoded, checked and indexed on the calling
  // thread while a second thread maps the allocations (for cuda: imports,
  // reserves, maps, grants access), so an attach costs about the longer of
  // the two. Any error unmaps what was mapped.
  static Result<MappedArena> Map(Manifest manifest, std::vector<UniqueFd> fds, int device = 0,
                                 MapStats* stats = nullptr, std::string_view table = {});

  const Manifest& manifest() const { return manifest_; }
  bool is_cuda() const { return manifest_.backend == "cuda"; }
  // nullptr view when absent.
  TensorView Find(std::string_view name) const;
  // The i-th entry of the manifest, without a name lookup (for walking every
  // tensor); nullptr view when i >= size().
  TensorView At(size_t i) const;
  size_t size() const { return manifest_.entries.size(); }

  // Copies a tensor's bytes into host memory (a plain copy for host, a
  // device-to-host copy for cuda). For verification and tests.
  Status CopyToHost(const ManifestEntry& e, void* dst) const;

 private:
  // Below this many entries (or table bytes) the arena is mapped on the
  // calling thread, after the entries: a thread costs more than it saves.
  static constexpr size_t kOverlapEntries = 512;
  static constexpr size_t kOverlapTableBytes = 32 << 10;
  Status MapHost(const std::vector<UniqueFd>& fds);
  Status MapDevice(const std::vector<UniqueFd>& fds, int device);
  void Unmap();
  Manifest manifest_;
  std::vector<void*> bases_;     // one per allocation (host) / device address (cuda)
  uint64_t cuda_reserved_ = 0;   // bytes of the reserved VA range (cuda)
  uint64_t cuda_base_ = 0;       // start of the reserved VA range (cuda)
  std::vector<uint64_t> cuda_handles_;  // CUmemGenericAllocationHandle per allocation
  int device_ = -1;
  cuda::PrimaryContext ctx_;     // retained while mapped (cuda)
  TensorIndex index_;            // over manifest_.entries
};

}  // namespace wsup
