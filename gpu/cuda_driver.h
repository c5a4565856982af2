// The CUDA driver API, reached through dlopen("libcuda.so.1") at run time.
//
// wsup links neither libcuda nor cudart: every binary must start on a machine
// without a GPU or a driver (CI, the supervisor's host), and the host backend
// must work there. The first call that needs the driver loads it, resolves
// every entry point wsup uses and calls cuInit(0), once per process; when
// that fails, every call returns the same Unavailable error, which says to
// use the host backend or run on a GPU node.
//
// The wrappers below speak in plain integers and pointers (DevicePtr,
// MemHandle, Stream, Event) so that callers need no <cuda.h>; only
// cuda_driver.cc includes it. A build without the toolkit headers
// (WSUP_HAVE_CUDA unset) compiles the same interface, and every call says how
// to rebuild with CUDA.
//
// VMM (virtual memory management) allocations are what arenas are made of:
// cuMemCreate on a device with POSIX-fd export, mapped into a reserved
// virtual range. An exported fd (or an imported handle, or a mapping) keeps
// the physical memory alive, independently of the process that created it.
//
// Environment: WSUP_LIBCUDA overrides the library's path (tests use it to
// simulate a machine without a driver).
//
// Thread-safety: all functions may be called from any thread. Functions that
// act on memory or streams need a current context on the calling thread
// (PrimaryContext::MakeCurrent); those that don't say so.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/status.h"
#include "common/unique_fd.h"

namespace wsup::cuda {

using DevicePtr = uint64_t;  // CUdeviceptr
using MemHandle = uint64_t;  // CUmemGenericAllocationHandle
using Stream = void*;        // CUstream
using Event = void*;         // CUevent

// Whether this build has the cuda backend compiled in (toolkit headers found).
bool BuiltWithCuda();

// Loads the driver and initialises it; the error is cached for the process.
// No context needed.
Status Init();

// cuDriverGetVersion, e.g. 13000 for CUDA 13.0. No context needed.
Result<int> DriverVersion();
// "13.0" from 13000.
std::string VersionString(int version);
// Number of visible devices. No context needed.
Result<int> DeviceCount();

struct DeviceInfo {
  int ordinal = -1;
  std::string name;  // "NVIDIA H200"
  std::string uuid;  // "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as nvidia-smi prints it
  int cc_major = 0;
  int cc_minor = 0;
  uint64_t total_memory = 0;
  bool vmm_supported = false;       // CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
  bool posix_fd_supported = false;  // ..._HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED
};
// No context needed.
Result<DeviceInfo> GetDeviceInfo(int ordinal);
// The ordinal of the visible device with this uuid, or NotFound naming the
// visible ones.
Result<int> FindDeviceByUuid(const std::string& uuid);

// A retained primary context of one device, released on destruction. The
// primary context is the one the CUDA runtime (and so an engine) uses, which
// is why mappings are made in it.
class PrimaryContext {
 public:
  PrimaryContext() = default;
  ~PrimaryContext();
  PrimaryContext(PrimaryContext&& o) noexcept;
  PrimaryContext& operator=(PrimaryContext&& o) noexcept;
  PrimaryContext(const PrimaryContext&) = delete;
  PrimaryContext& operator=(const PrimaryContext&) = delete;

  static Result<PrimaryContext> Retain(int device);
  // Makes it current on the calling thread.
  Status MakeCurrent() const;
  int device() const { return device_; }
  bool valid() const { return ctx_ != nullptr; }

 private:
  void Reset();
  int device_ = -1;
  void* ctx_ = nullptr;  // CUcontext
};

// Makes a primary context current on the calling thread for its lifetime,
// then makes current again whatever was before (no context, or the one an
// engine's CUDA runtime works in), so that a call into wsup never changes
// the device a caller's thread is on. A scope that did not Enter() restores
// nothing.
class ContextScope {
 public:
  ContextScope() = default;
  ~ContextScope();
  ContextScope(const ContextScope&) = delete;
  ContextScope& operator=(const ContextScope&) = delete;

  Status Enter(const PrimaryContext& ctx);

 private:
  void* saved_ = nullptr;  // CUcontext current before Enter()
  bool entered_ = false;
};

// --- VMM (no context needed, but the driver must be initialised) ---

// Minimum granularity of a POSIX-fd-exportable allocation on the device.
Result<uint64_t> VmmGranularity(int device);
// Physical memory on `device`, exportable as a POSIX fd. size must be a
// multiple of VmmGranularity.
Result<MemHandle> VmmCreate(int device, uint64_t size);
Result<UniqueFd> VmmExport(MemHandle handle);
// Imports an exported fd (the fd stays the caller's to close).
Result<MemHandle> VmmImport(int fd);
// The device ordinal (in this process) the allocation lives on, and whether
// it is exportable as a POSIX fd.
struct VmmProperties {
  int device = -1;
  bool posix_fd = false;
};
Result<VmmProperties> VmmGetProperties(MemHandle handle);
Status VmmRelease(MemHandle handle);
Result<DevicePtr> VmmReserve(uint64_t size, uint64_t alignment);
Status VmmFree(DevicePtr ptr, uint64_t size);
Status VmmMap(DevicePtr ptr, uint64_t size, MemHandle handle);
Status VmmUnmap(DevicePtr ptr, uint64_t size);
// Read and write access for `device`. VMM grants read-only access only to
// peer devices, never to the device that owns the memory, so mappings on
// the owner are read/write: immutability is a contract, checked by hashes.
Status VmmSetAccess(DevicePtr ptr, uint64_t size, int device);

// --- copies, streams, events (need a current context) ---

Result<void*> PinnedAlloc(size_t bytes);  // page-aligned, page-locked host memory
void PinnedFree(void* p);
Result<Stream> StreamCreate();  // non-blocking with respect to the legacy stream
void StreamDestroy(Stream s);
Status StreamSynchronize(Stream s);
Result<Event> EventCreate();  // timing disabled
void EventDestroy(Event e);
Status EventRecord(Event e, Stream s);
Status EventSynchronize(Event e);
// Waits for all work of the current context, including the legacy stream
// (which the non-blocking streams of StreamCreate do not wait for).
Status ContextSynchronize();
// Asynchronous with respect to the host for device memory: synchronize
// before depending on it.
Status MemsetD8(DevicePtr dst, uint8_t value, size_t bytes);
Status CopyHtoDAsync(DevicePtr dst, const void* src, size_t bytes, Stream s);
// `height` rows of `width` bytes, src rows `src_pitch` apart, dst rows `dst_pitch` apart.
Status Copy2DHtoDAsync(DevicePtr dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                       size_t height, Stream s);
Status CopyDtoH(void* dst, DevicePtr src, size_t bytes);
// Synchronous with respect to the host (pageable src is fine).
Status CopyHtoD(DevicePtr dst, const void* src, size_t bytes);

// --- legacy per-buffer IPC (the attach benchmark compares against it) ---

using IpcHandle = std::array<char, 64>;  // CUipcMemHandle
Result<DevicePtr> MemAlloc(size_t bytes);
Status MemFree(DevicePtr ptr);
Result<IpcHandle> IpcGetMemHandle(DevicePtr ptr);
Result<DevicePtr> IpcOpenMemHandle(const IpcHandle& handle);
Status IpcCloseMemHandle(DevicePtr ptr);

}  // namespace wsup::cuda
