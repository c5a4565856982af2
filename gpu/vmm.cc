#include "gpu/vmm.h"

#include <utility>

namespace wsup::cuda {
namespace {

class DriverOps final : public VmmOps {
 public:
  Result<MemHandle> Create(int device, uint64_t size) override { return VmmCreate(device, size); }
  Result<MemHandle> Import(int fd) override { return VmmImport(fd); }
  Result<UniqueFd> Export(MemHandle handle) override { return VmmExport(handle); }
  Status Release(MemHandle handle) override { return VmmRelease(handle); }
  Result<DevicePtr> Reserve(uint64_t size, uint64_t alignment) override { return VmmReserve(size, alignment); }
  Status Free(DevicePtr ptr, uint64_t size) override { return VmmFree(ptr, size); }
  Status Map(DevicePtr ptr, uint64_t size, MemHandle handle) override { return VmmMap(ptr, size, handle); }
  Status Unmap(DevicePtr ptr, uint64_t size) override { return VmmUnmap(ptr, size); }
  Status SetAccess(DevicePtr ptr, uint64_t size, int device) override { return VmmSetAccess(ptr, size, device); }
};

}  // namespace

VmmOps& DriverVmm() {
  static DriverOps* ops = new DriverOps();  // never destroyed: owners may outlive static destruction
  return *ops;
}

// ---------------------------------------------------------------- VmmHandle

VmmHandle::VmmHandle(VmmHandle&& o) noexcept
    : ops_(std::exchange(o.ops_, nullptr)), handle_(std::exchange(o.handle_, 0)) {}

VmmHandle& VmmHandle::operator=(VmmHandle&& o) noexcept {
  if (this != &o) {
    (void)Reset();
    ops_ = std::exchange(o.ops_, nullptr);
    handle_ = std::exchange(o.handle_, 0);
  }
  return *this;
}

Result<VmmHandle> VmmHandle::Create(int device, uint64_t size, VmmOps& ops) {
  WSUP_ASSIGN_OR_RETURN(MemHandle h, ops.Create(device, size));
  return VmmHandle(&ops, h);
}

Result<VmmHandle> VmmHandle::Import(int fd, VmmOps& ops) {
  WSUP_ASSIGN_OR_RETURN(MemHandle h, ops.Import(fd));
  return VmmHandle(&ops, h);
}

Result<UniqueFd> VmmHandle::Export() const {
  if (!valid()) return Internal("exporting an empty VMM handle; this is a wsup bug");
  return ops_->Export(handle_);
}

Status VmmHandle::Reset() {
  if (!valid()) return Status::Ok();
  VmmOps* ops = std::exchange(ops_, nullptr);
  return ops->Release(std::exchange(handle_, 0));
}

// ---------------------------------------------------------------- VmmRange

VmmRange::VmmRange(VmmRange&& o) noexcept
    : ops_(std::exchange(o.ops_, nullptr)),
      base_(std::exchange(o.base_, 0)),
      size_(std::exchange(o.size_, 0)),
      mapped_(std::exchange(o.mapped_, {})) {}

VmmRange& VmmRange::operator=(VmmRange&& o) noexcept {
  if (this != &o) {
    (void)Reset();
    ops_ = std::exchange(o.ops_, nullptr);
    base_ = std::exchange(o.base_, 0);
    size_ = std::exchange(o.size_, 0);
    mapped_ = std::exchange(o.mapped_, {});
  }
  return *this;
}

Result<VmmRange> VmmRange::Reserve(uint64_t size, uint64_t alignment, VmmOps& ops) {
  WSUP_ASSIGN_OR_RETURN(DevicePtr base, ops.Reserve(size, alignment));
  VmmRange r;
  r.ops_ = &ops;
  r.base_ = base;
  r.size_ = size;
  return r;
}

Result<VmmRange> VmmRange::MapAll(const std::vector<uint64_t>& sizes, const std::vector<MemHandle>& handles,
                                  uint64_t alignment, int device, const std::string& what, VmmOps& ops) {
  if (sizes.size() != handles.size()) {
    return Internal("mapping " + std::to_string(handles.size()) + " handles for " + std::to_string(sizes.size()) +
                    " sizes; this is a wsup bug");
  }
  uint64_t total = 0;
  for (uint64_t s : sizes) total += s;
  WSUP_ASSIGN_OR_RETURN(VmmRange r, Reserve(total, alignment, ops));
  uint64_t off = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    Status st = r.Map(off, sizes[i], handles[i]);
    if (!st.ok()) return st.error().With(what + " " + std::to_string(i));
    off += sizes[i];
  }
  WSUP_RETURN_IF_ERROR(r.SetAccess(0, total, device));
  return r;
}

Status VmmRange::Map(uint64_t offset, uint64_t size, MemHandle handle) {
  if (!valid() || offset > size_ || size > size_ - offset) {
    return Internal("mapping " + std::to_string(size) + " bytes at offset " + std::to_string(offset) +
                    " of a VMM range of " + std::to_string(size_) + " bytes; this is a wsup bug");
  }
  WSUP_RETURN_IF_ERROR(ops_->Map(base_ + offset, size, handle));
  mapped_.push_back({offset, size});
  return Status::Ok();
}

Status VmmRange::SetAccess(uint64_t offset, uint64_t size, int device) {
  if (!valid()) return Internal("granting access to an empty VMM range; this is a wsup bug");
  return ops_->SetAccess(base_ + offset, size, device);
}

Status VmmRange::Unmap(uint64_t offset, uint64_t size) {
  if (!valid()) return Status::Ok();
  Status st = ops_->Unmap(base_ + offset, size);
  if (!st.ok()) return st;
  std::erase_if(mapped_, [&](const Mapped& m) { return m.offset >= offset && m.offset + m.size <= offset + size; });
  return Status::Ok();
}

Status VmmRange::UnmapAll() {
  Status first;
  for (const Mapped& m : mapped_) {
    Status st = ops_->Unmap(base_ + m.offset, m.size);
    if (first.ok() && !st.ok()) first = st;
  }
  mapped_.clear();
  return first;
}

Status VmmRange::Reset() {
  if (!valid()) return Status::Ok();
  Status first = UnmapAll();
  Status freed = ops_->Free(base_, size_);
  ops_ = nullptr;
  base_ = 0;
  size_ = 0;
  return first.ok() ? freed : first;
}

}  // namespace wsup::cuda
