// Owners of CUDA VMM resources: a physical allocation handle (VmmHandle) and
// a reserved virtual range with the mappings made in it (VmmRange).
//
// The holder's arena, the client's mappings and the engine's KV memory all
// build the same thing (handles created or imported, one range reserved,
// each handle mapped into it, access granted) and must undo it on every
// failure path and on teardown. These types own what they made and give it
// back exactly once, on destruction or on an explicit Reset(), so a load or
// an attach that fails half-way leaves nothing mapped or reserved behind.
//
// Every driver call goes through VmmOps, an interface whose default is the
// dlopen'ed driver (gpu/cuda_driver.h); tests substitute a fake that counts
// what is live, so the ownership rules are checked on machines without a GPU.
//
// Teardown does not synchronize: work still using a range must be finished
// (cuda::ContextSynchronize in the right context) before the range goes, or
// the access faults and poisons the context. Errors of teardown calls in
// destructors are dropped on purpose: there is nobody left to tell, and the
// driver frees what a process leaves behind when it exits.
//
// Not thread-safe: one owner per object, like any value.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/unique_fd.h"
#include "gpu/cuda_driver.h"

namespace wsup::cuda {

// The VMM calls of gpu/cuda_driver.h, as an interface.
class VmmOps {
 public:
  virtual ~VmmOps() = default;
  virtual Result<MemHandle> Create(int device, uint64_t size) = 0;
  virtual Result<MemHandle> Import(int fd) = 0;
  virtual Result<UniqueFd> Export(MemHandle handle) = 0;
  virtual Status Release(MemHandle handle) = 0;
  virtual Result<DevicePtr> Reserve(uint64_t size, uint64_t alignment) = 0;
  virtual Status Free(DevicePtr ptr, uint64_t size) = 0;
  virtual Status Map(DevicePtr ptr, uint64_t size, MemHandle handle) = 0;
  virtual Status Unmap(DevicePtr ptr, uint64_t size) = 0;
  virtual Status SetAccess(DevicePtr ptr, uint64_t size, int device) = 0;
};

// The driver's VMM calls (process-wide, never destroyed).
VmmOps& DriverVmm();

// One physical allocation handle (made here or imported from a peer's fd).
// An exported fd and every mapping keep the memory alive on their own, so
// the handle may go as soon as those exist.
class VmmHandle {
 public:
  VmmHandle() = default;
  ~VmmHandle() { (void)Reset(); }
  VmmHandle(VmmHandle&& o) noexcept;
  VmmHandle& operator=(VmmHandle&& o) noexcept;
  VmmHandle(const VmmHandle&) = delete;
  VmmHandle& operator=(const VmmHandle&) = delete;

  // Physical memory on `device` (size a multiple of VmmGranularity).
  static Result<VmmHandle> Create(int device, uint64_t size, VmmOps& ops = DriverVmm());
  // Imports an exported fd (the fd stays the caller's).
  static Result<VmmHandle> Import(int fd, VmmOps& ops = DriverVmm());

  // A POSIX fd that keeps the memory alive after the handle goes.
  Result<UniqueFd> Export() const;
  bool valid() const { return ops_ != nullptr; }
  MemHandle get() const { return handle_; }
  // Releases the handle now (once); later calls do nothing.
  Status Reset();

 private:
  VmmHandle(VmmOps* ops, MemHandle h) : ops_(ops), handle_(h) {}
  VmmOps* ops_ = nullptr;  // null: owns nothing
  MemHandle handle_ = 0;
};

// A reserved virtual range and the mappings made in it. Destruction (or
// Reset) unmaps every mapping still there, then frees the range.
class VmmRange {
 public:
  VmmRange() = default;
  ~VmmRange() { (void)Reset(); }
  VmmRange(VmmRange&& o) noexcept;
  VmmRange& operator=(VmmRange&& o) noexcept;
  VmmRange(const VmmRange&) = delete;
  VmmRange& operator=(const VmmRange&) = delete;

  // Reserves `size` bytes of virtual addresses aligned to `alignment`.
  static Result<VmmRange> Reserve(uint64_t size, uint64_t alignment, VmmOps& ops = DriverVmm());
  // Reserves one range for allocations of `sizes`, maps `handles[i]` right
  // after allocation i-1 and grants `device` read/write access to all of
  // it. On any failure everything done so far is undone and the error
  // names the allocation (`what` + " " + i).
  static Result<VmmRange> MapAll(const std::vector<uint64_t>& sizes, const std::vector<MemHandle>& handles,
                                 uint64_t alignment, int device, const std::string& what,
                                 VmmOps& ops = DriverVmm());

  // Maps `size` bytes of `handle` at `offset` (the mapping keeps the memory).
  Status Map(uint64_t offset, uint64_t size, MemHandle handle);
  // Grants `device` read/write access to [offset, offset + size).
  Status SetAccess(uint64_t offset, uint64_t size, int device);
  // Unmaps the mappings inside [offset, offset + size) with one driver call
  // over that span (the span must cover whole mappings).
  Status Unmap(uint64_t offset, uint64_t size);
  // Unmaps every mapping, one call each; the reservation stays.
  Status UnmapAll();
  // Unmaps everything and frees the reservation (once).
  Status Reset();

  bool valid() const { return ops_ != nullptr; }
  DevicePtr base() const { return base_; }
  uint64_t size() const { return size_; }
  size_t mappings() const { return mapped_.size(); }

 private:
  struct Mapped {
    uint64_t offset;
    uint64_t size;
  };
  VmmOps* ops_ = nullptr;  // null: owns nothing
  DevicePtr base_ = 0;
  uint64_t size_ = 0;
  std::vector<Mapped> mapped_;
};

}  // namespace wsup::cuda
