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
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "common/unique_fd.h"
#include "gpu/cuda_driver.h"
#include "gpu/vmm.h"
#include "wire/manifest.h"

namespace wsup {

struct TensorView {
  const ManifestEntry* entry = nullptr;
  const void* data = nullptr;  // host pointer (host backend) or device pointer (cuda)
};

// GrantMapping: a layout writer's own mapping of the memory its lease was
// granted (client/publish.h), in grant order, at addresses that never
// change while it lives:
//   host: each memfd mapped shared read-write. For the commit, Park()
//     swaps every mapping for an inaccessible placeholder at the same
//     address (the holder seals a memfd only once no writable mapping of it
//     exists); a refused commit maps the memfds back read-write, a
//     committed layout maps them read-only (MapSealed), both where they
//     were.
//   cuda: one virtual range of the device's memory size reserved at the
//     first grant, each grant imported and mapped read-write into it one
//     after the other (so the grants are contiguous, as a reader maps
//     them), access granted on the device. Nothing changes at the commit.
// A committed layout's MappedArena shares this object, so the writer's
// pointers ARE the attached layout's: a writer that keeps computing from
// the tensors it loaded into the lease (a torch model) keeps valid memory,
// which is the bytes every reader sees. The memory is unmapped when the
// last owner goes (the Publication, the arena, a torch allocator still
// holding blocks in it: client/torch_allocator.h); for cuda, after the
// device finished its work.
//
// Thread-safety: Map(), Park() and the Map*() calls need one caller at a
// time (the Publication's owner); bases() may be read from any thread.
// The cuda calls leave the thread's current context as they found it.
class GrantMapping {
 public:
  // `device` is this process's cuda ordinal for `device_uuid` (ignored for
  // host); the GPU must be the lease's, named by its uuid.
  static Result<std::shared_ptr<GrantMapping>> Create(const std::string& backend, int device,
                                                      const std::string& device_uuid);
  ~GrantMapping();
  GrantMapping(const GrantMapping&) = delete;
  GrantMapping& operator=(const GrantMapping&) = delete;

  bool is_cuda() const { return cuda_; }
  int device() const { return device_; }
  size_t size() const { return bases_.size(); }
  // Allocation i's address: host, or a device pointer.
  void* base(size_t i) const { return bases_[i]; }
  uint64_t bytes(size_t i) const { return sizes_[i]; }

  // Maps one more grant (its fd stays the caller's) and returns its address.
  Result<void*> Map(int fd, uint64_t size);
  // host: every mapping becomes an inaccessible placeholder at its address
  // (access faults until MapWritable or MapSealed). cuda: nothing.
  Status Park();
  // host: maps allocation i read-write again at its address.
  Status MapWritable(size_t i, int fd);
  // host: maps allocation i (sealed) read-only at its address.
  Status MapSealed(size_t i, int fd);
  // Which grant holds `p`, and where in it; false when none does.
  bool Locate(const void* p, uint32_t* alloc, uint64_t* offset) const;

 private:
  GrantMapping() = default;
  Status MapFixed(size_t i, int fd, int prot);
  bool cuda_ = false;
  int device_ = -1;
  std::vector<void*> bases_;
  std::vector<uint64_t> sizes_;
  // cuda
  cuda::PrimaryContext ctx_;
  uint64_t va_used_ = 0;  // of range_, by the grants so far
  uint64_t granularity_ = 0;
  std::vector<cuda::VmmHandle> handles_;  // one per grant
  cuda::VmmRange range_;                   // one range for all grants, reserved in Create()
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
  //
  // With `writer` (the committing writer's own GrantMapping, one grant per
  // allocation of the manifest, of the same sizes), nothing new is mapped:
  // host memfds are checked as usual and mapped read-only where the
  // writer's regions were, cuda grants are the writer's mapping as it is.
  // The arena then shares `writer`, and its tensors are at the writer's
  // addresses.
  static Result<MappedArena> Map(Manifest manifest, std::vector<UniqueFd> fds, int device = 0,
                                 MapStats* stats = nullptr, std::string_view table = {},
                                 std::shared_ptr<GrantMapping> writer = nullptr);

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
  Status MapOverWriter(const std::vector<UniqueFd>& fds, std::shared_ptr<GrantMapping> writer);
  void Unmap();
  Manifest manifest_;
  std::vector<void*> bases_;     // one per allocation (host) / device address (cuda)
  std::vector<cuda::VmmHandle> cuda_handles_;  // one per allocation (cuda)
  cuda::VmmRange cuda_range_;    // all allocations, mapped back to back (cuda)
  int device_ = -1;
  cuda::PrimaryContext ctx_;     // retained while mapped (cuda)
  std::shared_ptr<GrantMapping> writer_;  // the memory, when it is a writer's mapping
  TensorIndex index_;            // over manifest_.entries
};

}  // namespace wsup
