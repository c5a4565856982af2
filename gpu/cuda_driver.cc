#include "gpu/cuda_driver.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <utility>

namespace wsup::cuda {

std::string VersionString(int version) {
  return std::to_string(version / 1000) + "." + std::to_string((version % 1000) / 10);
}

}  // namespace wsup::cuda

#if WSUP_HAVE_CUDA

#include <cuda.h>
#include <dlfcn.h>

namespace wsup::cuda {
namespace {

// Every driver entry point wsup uses. cuda.h #defines many of them to a
// versioned symbol (cuMemAlloc -> cuMemAlloc_v2); the X macro below keeps the
// plain name for the member (token pasting does not expand it) and takes the
// expanded one for the type and the symbol looked up, so each pointer has
// exactly the prototype of the symbol it points to.
// clang-format off
#define WSUP_CUDA_FUNCTIONS(X)                                                                       \
  X(cuInit) X(cuDriverGetVersion) X(cuGetErrorName)                                                  \
  X(cuGetErrorString) X(cuDeviceGetCount) X(cuDeviceGet)                                             \
  X(cuDeviceGetName) X(cuDeviceGetUuid) X(cuDeviceGetAttribute)                                      \
  X(cuDeviceTotalMem) X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease)                       \
  X(cuCtxSetCurrent) X(cuCtxGetCurrent) X(cuCtxSynchronize)                                          \
  X(cuMemGetAllocationGranularity) X(cuMemCreate) X(cuMemRelease)                                    \
  X(cuMemExportToShareableHandle) X(cuMemImportFromShareableHandle)                                  \
  X(cuMemGetAllocationPropertiesFromHandle) X(cuMemAddressReserve)                                   \
  X(cuMemAddressFree) X(cuMemMap) X(cuMemUnmap)                                                      \
  X(cuMemSetAccess) X(cuMemHostAlloc) X(cuMemFreeHost)                                               \
  X(cuStreamCreate) X(cuStreamDestroy) X(cuStreamSynchronize)                                        \
  X(cuEventCreate) X(cuEventDestroy) X(cuEventRecord)                                                \
  X(cuEventSynchronize) X(cuMemsetD8) X(cuMemcpyHtoDAsync)                                           \
  X(cuMemcpy2DAsync) X(cuMemcpyDtoH) X(cuMemcpyHtoD)                                                 \
  X(cuMemAlloc) X(cuMemFree) X(cuIpcGetMemHandle)                                                    \
  X(cuIpcOpenMemHandle) X(cuIpcCloseMemHandle)
// clang-format on

#define WSUP_CUDA_STR2(x) #x
#define WSUP_CUDA_STR(x) WSUP_CUDA_STR2(x)

struct Api {
#define WSUP_CUDA_DECLARE(fn) decltype(&fn) p_##fn = nullptr;
  WSUP_CUDA_FUNCTIONS(WSUP_CUDA_DECLARE)
#undef WSUP_CUDA_DECLARE
};

struct Driver {
  Api api;
  std::string path;
  std::optional<Error> error;  // set when the driver cannot be used
};

const Driver& LoadDriver() {
  static const Driver* driver = [] {
    auto* d = new Driver();  // lives for the process: function pointers into libcuda
    const char* env = std::getenv("WSUP_LIBCUDA");
    d->path = env && *env ? env : "libcuda.so.1";
    void* lib = ::dlopen(d->path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      d->error =
          Unavailable("no CUDA driver (" + d->path + " not found): use backend host, or run on a GPU node");
      return d;
    }
#define WSUP_CUDA_RESOLVE(fn)                                                                              \
  d->api.p_##fn = reinterpret_cast<decltype(&fn)>(::dlsym(lib, WSUP_CUDA_STR(fn)));                        \
  if (!d->api.p_##fn && !d->error) {                                                                       \
    d->error =                                                                                             \
        Unavailable("the CUDA driver " + d->path +                                                         \
                    " lacks " WSUP_CUDA_STR(fn) ", which wsup needs (the driver is older than the CUDA " + \
                    VersionString(CUDA_VERSION) +                                                          \
                    " headers wsup was built with): update the NVIDIA driver, or use "                     \
                    "backend host");                                                                       \
  }
    WSUP_CUDA_FUNCTIONS(WSUP_CUDA_RESOLVE)
#undef WSUP_CUDA_RESOLVE
    if (d->error) return d;
    CUresult r = d->api.p_cuInit(0);
    if (r != CUDA_SUCCESS) {
      const char* name = nullptr;
      if (d->api.p_cuGetErrorName(r, &name) != CUDA_SUCCESS || !name) name = "unknown CUDA error";
      d->error = Unavailable(
          std::string("the CUDA driver is present but cuInit failed: ") + name +
          (r == CUDA_ERROR_NO_DEVICE ? " (no visible GPU; check CUDA_VISIBLE_DEVICES and nvidia-smi)" : "") +
          ": use backend host, or run on a GPU node with a working driver");
    }
    return d;
  }();
  return *driver;
}

Result<const Api*> GetApi() {
  const Driver& d = LoadDriver();
  if (d.error) return *d.error;
  return &d.api;
}

// What to do about a CUDA error, for the end of the message.
const char* Fix(CUresult r) {
  switch (r) {
    case CUDA_ERROR_OUT_OF_MEMORY:
      return "free GPU memory (nvidia-smi lists the processes holding it) or put fewer bytes on "
             "each GPU (a larger tp)";
    case CUDA_ERROR_NOT_SUPPORTED:
      return "this device or driver lacks the feature (CUDA VMM with POSIX fd handles needs a "
             "Linux driver >= 450 and compute capability >= 6.0): use backend host";
    case CUDA_ERROR_INVALID_DEVICE:
    case CUDA_ERROR_NO_DEVICE:
      return "check the device ordinal against nvidia-smi and CUDA_VISIBLE_DEVICES";
    case CUDA_ERROR_INVALID_CONTEXT:
      return "this is a wsup bug: a context must be current on the calling thread";
    default:
      return "see the CUDA driver documentation for this error; check dmesg for Xid errors";
  }
}

Code CodeFor(CUresult r) {
  switch (r) {
    case CUDA_ERROR_OUT_OF_MEMORY:
    case CUDA_ERROR_NOT_SUPPORTED:
    case CUDA_ERROR_NO_DEVICE:
    case CUDA_ERROR_INVALID_DEVICE:
      return Code::kUnavailable;
    case CUDA_ERROR_INVALID_VALUE:
    case CUDA_ERROR_INVALID_HANDLE:
      return Code::kInvalidArgument;
    default:
      return Code::kIo;
  }
}

Error CuError(const Api& api, CUresult r, const std::string& what) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (api.p_cuGetErrorName(r, &name) != CUDA_SUCCESS || !name) name = "unknown CUDA error";
  if (api.p_cuGetErrorString(r, &text) != CUDA_SUCCESS || !text) text = "no description";
  return Error(CodeFor(r), what + ": " + name + " (" + text + "): " + Fix(r));
}

#define WSUP_CU(api, call, what)                                                \
  do {                                                                          \
    CUresult wsup_cu_r_ = (api)->call;                                          \
    if (wsup_cu_r_ != CUDA_SUCCESS) return CuError(*(api), wsup_cu_r_, (what)); \
  } while (0)

Result<CUdevice> GetDevice(const Api* api, int ordinal) {
  CUdevice dev = 0;
  int count = 0;
  WSUP_CU(api, p_cuDeviceGetCount(&count), "cuDeviceGetCount");
  if (ordinal < 0 || ordinal >= count) {
    return Unavailable("CUDA device " + std::to_string(ordinal) + " does not exist (" +
                       std::to_string(count) + " visible): pick a device in 0.." + std::to_string(count - 1) +
                       " or check CUDA_VISIBLE_DEVICES");
  }
  WSUP_CU(api, p_cuDeviceGet(&dev, ordinal), "cuDeviceGet(" + std::to_string(ordinal) + ")");
  return dev;
}

CUmemAllocationProp AllocProp(int device) {
  CUmemAllocationProp prop;
  std::memset(&prop, 0, sizeof prop);
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

std::string UuidString(const CUuuid& u) {
  const auto* b = reinterpret_cast<const unsigned char*>(u.bytes);
  char buf[64];
  std::snprintf(buf, sizeof buf, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
                b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14],
                b[15]);
  return buf;
}

std::string Hex(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace

bool BuiltWithCuda() { return true; }

Status Init() { return GetApi().status(); }

Result<int> DriverVersion() {
  WSUP_ASSIGN_OR_RETURN(const Api* api, GetApi());
  int v = 0;
  WSUP_CU(api, p_cuDriverGetVersion(&v), "cuDriverGetVersion");
  return v;
}

Result<int> DeviceCount() {
  WSUP_ASSIGN_OR_RETURN(const Api* api, GetApi());
  int count = 0;
  WSUP_CU(api, p_cuDeviceGetCount(&count), "cuDeviceGetCount");
  return count;
}

Result<DeviceInfo> GetDeviceInfo(int ordinal) {
  WSUP_ASSIGN_OR_RETURN(const Api* api, GetApi());
  WSUP_ASSIGN_OR_RETURN(CUdevice dev, GetDevice(api, ordinal));
  const std::string what = "CUDA device " + std::to_string(ordinal);
  DeviceInfo info;
  info.ordinal = ordinal;
  char name[256] = {};
  WSUP_CU(api, p_cuDeviceGetName(name, sizeof name - 1, dev), what + ": cuDeviceGetName");
  info.name = name;
  CUuuid uuid;
  WSUP_CU(api, p_cuDeviceGetUuid(&uuid, dev), what + ": cuDeviceGetUuid");
  info.uuid = UuidString(uuid);
  WSUP_CU(api, p_cuDeviceGetAttribute(&info.cc_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev),
          what + ": compute capability");
  WSUP_CU(api, p_cuDeviceGetAttribute(&info.cc_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev),
          what + ": compute capability");
  size_t total = 0;
  WSUP_CU(api, p_cuDeviceTotalMem(&total, dev), what + ": cuDeviceTotalMem");
  info.total_memory = total;
  int vmm = 0, posix = 0;
  WSUP_CU(api, p_cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev),
          what + ": VMM support");
  WSUP_CU(
      api,
      p_cuDeviceGetAttribute(&posix, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, dev),
      what + ": POSIX fd handle support");
  info.vmm_supported = vmm != 0;
  info.posix_fd_supported = posix != 0;
  return info;
}

Result<int> FindDeviceByUuid(const std::string& uuid) {
  WSUP_ASSIGN_OR_RETURN(int count, DeviceCount());
  std::string seen;
  for (int i = 0; i < count; ++i) {
    WSUP_ASSIGN_OR_RETURN(DeviceInfo info, GetDeviceInfo(i));
    if (info.uuid == uuid) return i;
    seen += (seen.empty() ? "" : ", ") + std::to_string(i) + "=" + info.uuid;
  }
  return NotFound("no visible CUDA device has uuid " + uuid +
                  " (visible: " + (seen.empty() ? std::string("none") : seen) +
                  "): run on the node and GPU that holds the arena, or check CUDA_VISIBLE_DEVICES");
}

// --- PrimaryContext ---

PrimaryContext::~PrimaryContext() { Reset(); }

PrimaryContext::PrimaryContext(PrimaryContext&& o) noexcept
    : device_(std::exchange(o.device_, -1)), ctx_(std::exchange(o.ctx_, nullptr)) {}

PrimaryContext& PrimaryContext::operator=(PrimaryContext&& o) noexcept {
  if (this != &o) {
    Reset();
    device_ = std::exchange(o.device_, -1);
    ctx_ = std::exchange(o.ctx_, nullptr);
  }
  return *this;
}

void PrimaryContext::Reset() {
  if (ctx_) {
    auto api = GetApi();
    CUdevice dev = 0;
    if (api.ok() && (*api)->p_cuDeviceGet(&dev, device_) == CUDA_SUCCESS) {
      (*api)->p_cuDevicePrimaryCtxRelease(dev);
    }
  }
  ctx_ = nullptr;
  device_ = -1;
}

Result<PrimaryContext> PrimaryContext::Retain(int device) {
  WSUP_ASSIGN_OR_RETURN(const Api* api, GetApi());
  WSUP_ASSIGN_OR_RETURN(CUdevice dev, GetDevice(api, device));
  CUcontext ctx = nullptr;
  WSUP_CU(api, p_cuDevicePrimaryCtxRetain(&ctx, dev),
          "cuDevicePrimaryCtxRetain(device " + std::to_string(device) + ")");
  PrimaryContext pc;
  pc.device_ = device;
  pc.ctx_ = ctx;
  return pc;
}

Status PrimaryContext::MakeCurrent() const {
  WSUP_ASSIGN_OR_RETURN(const Api* api, GetApi());
  if (!ctx_) return Internal("PrimaryContext::MakeCurrent on an empty context: retain it first");
  WSUP_CU(api, p_cuCtxSetCurrent(static_cast<CUcontext>(ctx_)),
          "cuCtxSetCurrent(device " + std::to_string(device_) + ")");
  return {};
}

// --- ContextScope ---

ContextScope::~ContextScope() {
  if (!entered_) return;
  auto api = GetApi();
  if (api.ok()) (*api)->p_cuCtxSetCurrent(static_cast<CUcontext>(saved_));
}

Status ContextScope::Enter(const PrimaryContext& ctx) {
  WSUP_ASSIGN_OR_RETURN(const Api* api, GetApi());
  if (entered_) return Internal("ContextScope::Enter twice on one scope: this is a wsup bug");
  CUcontext saved = nullptr;
  WSUP_CU(api, p_cuCtxGetCurrent(&saved), "cuCtxGetCurrent");
  WSUP_RETURN_IF_ERROR(ctx.MakeCurrent());
  saved_ = saved;
  entered_ = true;
  return {};
}

// --- VMM ---

Result<uint64_t> VmmGranularity(int device) {
  WSUP_ASSIGN_OR_RETURN(const Api* api, GetApi());
  CUmemAllocationProp prop = AllocProp(device);
  size_t g = 0;
  WSUP_CU(api, p_cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
          "cuMemGetAllocationGranularity(device " + std::to_string(device) + ")");
  if (g == 0) return Internal("the CUDA driver reported a granularity of 0 bytes");
  return static_cast<uint64_t>(g);
}

Result<MemHandle> VmmCreate(int device, uint64_t size) {
  WSUP_ASSIGN_OR_RETURN(const Api* api, GetApi());
  CUmemAllocationProp prop = AllocProp(device);
  CUmemGenericAllocationHandle h = 0;
  WSUP_CU(api, p_cuMemCreate(&h, size, &prop, 0),
          "cuMemCreate(device " + std::to_string(device) + ", " + std::to_string(size) + " bytes)");
  return static_cast<MemHandle>(h);
}

Result<UniqueFd> VmmExport(MemHandle handle) {
  WSUP_ASSIGN_OR_RETURN(const Api* api, GetApi());
  int fd = -1;
  WSUP_CU(api, p_cuMemExportToShareableHandle(&fd, handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
          "cuMemExportToShareableHandle(" + Hex(handle) + ")");
  if (fd < 0) return Internal("cuMemExportToShareableHandle returned no fd");
  return UniqueFd(fd);
}

Result<MemHandle> VmmImport(int fd) {
  WSUP_ASSIGN_OR_RETURN(const Api* api, GetApi());
  CUmemGenericAllocationHandle h = 0;
  CUresult r = api->p_cuMemImportFromShareableHandle(&h, reinterpret_cast<void*>(static_cast<uintptr_t>(fd)),
                                                     CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  if (r != CUDA_SUCCESS) {
    return CuError(*api, r,
                   "cuMemImportFromShareableHandle(fd " + std::to_string(fd) +
                       "): the fd is not a CUDA allocation exported on this node, or its GPU was "
                       "reset");
  }
  return static_cast<MemHandle>(h);
}

Result<VmmProperties> VmmGetProperties(MemHandle handle) {
  WSUP_ASSIGN_OR_RETURN(const Api* api, GetApi());
  CUmemAllocationProp prop;
  std::memset(&prop, 0, sizeof prop);
  WSUP_CU(api, p_cuMemGetAllocationPropertiesFromHandle(&prop, handle),
          "cuMemGetAllocationPropertiesFromHandle(" + Hex(handle) + ")");
  VmmProperties p;
  p.device = prop.location.type == CU_MEM_LOCATION_TYPE_DEVICE ? prop.location.id : -1;
  p.posix_fd = (prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != 0;
  return p;
}

Status VmmRelease(MemHandle handle) {
  WSUP_ASSIGN_OR_RETURN(const Api* api, GetApi());
  WSUP_CU(api, p_cuMemRelease(handle), "cuMemRelease(" + Hex(handle) + ")");
  return {};
}

Result<DevicePtr> VmmReserve(uint64_t size, uint64_t alignment) {
  WSUP_ASSIGN_OR_RETURN(const Api* api, GetApi());
  CUdeviceptr p = 0;
  WSUP_CU(api, p_cuMemAddressReserve(&p, size, alignment, 0, 0),
          "cuMemAddressReserve(" + std::to_string(size) + " bytes)");
  return static_cast<DevicePtr>(p);
}

Status VmmFree(DevicePtr ptr, uint64_t size) {
  WSUP_ASSIGN_OR_RETURN(const Api* api, GetApi());
  WSUP_CU(api, p_cuMemAddressFree(ptr, size), "cuMemAddressFree(" + Hex(ptr) + ")");
  return {};
}

Status VmmMap(DevicePtr ptr, uint64_t size, MemHandle handle) {
  WSUP_ASSIGN_OR_RETURN(const Api* api, GetApi());
  WSUP_CU(api, p_cuMemMap(ptr, size, 0, handle, 0),
          "cuMemMap(" + std::to_string(size) + " bytes at " + Hex(ptr) +
              "; an allocation smaller than its manifest says fails here)");
  return {};
}

Status VmmUnmap(DevicePtr ptr, uint64_t size) {
  WSUP_ASSIGN_OR_RETURN(const Api* api, GetApi());
  WSUP_CU(api, p_cuMemUnmap(ptr, size), "cuMemUnmap(" + Hex(ptr) + ")");
  return {};
}

Status VmmSetAccess(DevicePtr ptr, uint64_t size, int device) {
  WSUP_ASSIGN_OR_RETURN(const Api* api, GetApi());
  CUmemAccessDesc desc;
  std::memset(&desc, 0, sizeof desc);
  desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  desc.location.id = device;
  desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  WSUP_CU(api, p_cuMemSetAccess(ptr, size, &desc, 1),
          "cuMemSetAccess(device " + std::to_string(device) + ", " + std::to_string(size) + " bytes)");
  return {};
}

// --- copies, streams, events ---

Result<void*> PinnedAlloc(size_t bytes) {
  WSUP_ASSIGN_OR_RETURN(const Api* api, GetApi());
  void* p = nullptr;
  CUresult r = api->p_cuMemHostAlloc(&p, bytes, CU_MEMHOSTALLOC_PORTABLE);
  if (r != CUDA_SUCCESS) {
    return CuError(*api, r,
                   "cuMemHostAlloc(" + std::to_string(bytes) +
                       " bytes of pinned staging memory; lower the staging buffers' size or count "
                       "if host memory is short)");
  }
  return p;
}

void PinnedFree(void* p) {
  auto api = GetApi();
  if (p && api.ok()) (*api)->p_cuMemFreeHost(p);
}

Result<Stream> StreamCreate() {
  WSUP_ASSIGN_OR_RETURN(const Api* api, GetApi());
  CUstream s = nullptr;
  WSUP_CU(api, p_cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  return static_cast<Stream>(s);
}

void StreamDestroy(Stream s) {
  auto api = GetApi();
  if (s && api.ok()) (*api)->p_cuStreamDestroy(static_cast<CUstream>(s));
}

Status StreamSynchronize(Stream s) {
  WSUP_ASSIGN_OR_RETURN(const Api* api, GetApi());
  WSUP_CU(api, p_cuStreamSynchronize(static_cast<CUstream>(s)), "cuStreamSynchronize");
  return {};
}

Result<Event> EventCreate() {
  WSUP_ASSIGN_OR_RETURN(const Api* api, GetApi());
  CUevent e = nullptr;
  WSUP_CU(api, p_cuEventCreate(&e, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
  return static_cast<Event>(e);
}

void EventDestroy(Event e) {
  auto api = GetApi();
  if (e && api.ok()) (*api)->p_cuEventDestroy(static_cast<CUevent>(e));
}

Status EventRecord(Event e, Stream s) {
  WSUP_ASSIGN_OR_RETURN(const Api* api, GetApi());
  WSUP_CU(api, p_cuEventRecord(static_cast<CUevent>(e), static_cast<CUstream>(s)), "cuEventRecord");
  return {};
}

Status EventSynchronize(Event e) {
  WSUP_ASSIGN_OR_RETURN(const Api* api, GetApi());
  WSUP_CU(api, p_cuEventSynchronize(static_cast<CUevent>(e)), "cuEventSynchronize");
  return {};
}

Status ContextSynchronize() {
  WSUP_ASSIGN_OR_RETURN(const Api* api, GetApi());
  WSUP_CU(api, p_cuCtxSynchronize(), "cuCtxSynchronize");
  return {};
}

Status MemsetD8(DevicePtr dst, uint8_t value, size_t bytes) {
  WSUP_ASSIGN_OR_RETURN(const Api* api, GetApi());
  WSUP_CU(api, p_cuMemsetD8(dst, value, bytes), "cuMemsetD8(" + std::to_string(bytes) + " bytes)");
  return {};
}

Status CopyHtoDAsync(DevicePtr dst, const void* src, size_t bytes, Stream s) {
  WSUP_ASSIGN_OR_RETURN(const Api* api, GetApi());
  WSUP_CU(api, p_cuMemcpyHtoDAsync(dst, src, bytes, static_cast<CUstream>(s)),
          "cuMemcpyHtoDAsync(" + std::to_string(bytes) + " bytes to " + Hex(dst) + ")");
  return {};
}

Status Copy2DHtoDAsync(DevicePtr dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                       size_t height, Stream s) {
  WSUP_ASSIGN_OR_RETURN(const Api* api, GetApi());
  CUDA_MEMCPY2D c;
  std::memset(&c, 0, sizeof c);
  c.srcMemoryType = CU_MEMORYTYPE_HOST;
  c.srcHost = src;
  c.srcPitch = src_pitch;
  c.dstMemoryType = CU_MEMORYTYPE_DEVICE;
  c.dstDevice = dst;
  c.dstPitch = dst_pitch;
  c.WidthInBytes = width;
  c.Height = height;
  WSUP_CU(api, p_cuMemcpy2DAsync(&c, static_cast<CUstream>(s)),
          "cuMemcpy2DAsync(" + std::to_string(height) + " rows of " + std::to_string(width) + " bytes to " +
              Hex(dst) + ")");
  return {};
}

Status CopyDtoH(void* dst, DevicePtr src, size_t bytes) {
  WSUP_ASSIGN_OR_RETURN(const Api* api, GetApi());
  WSUP_CU(api, p_cuMemcpyDtoH(dst, src, bytes),
          "cuMemcpyDtoH(" + std::to_string(bytes) + " bytes from " + Hex(src) + ")");
  return {};
}

Status CopyHtoD(DevicePtr dst, const void* src, size_t bytes) {
  WSUP_ASSIGN_OR_RETURN(const Api* api, GetApi());
  WSUP_CU(api, p_cuMemcpyHtoD(dst, src, bytes),
          "cuMemcpyHtoD(" + std::to_string(bytes) + " bytes to " + Hex(dst) + ")");
  return {};
}

// --- legacy IPC ---

Result<DevicePtr> MemAlloc(size_t bytes) {
  WSUP_ASSIGN_OR_RETURN(const Api* api, GetApi());
  CUdeviceptr p = 0;
  WSUP_CU(api, p_cuMemAlloc(&p, bytes), "cuMemAlloc(" + std::to_string(bytes) + " bytes)");
  return static_cast<DevicePtr>(p);
}

Status MemFree(DevicePtr ptr) {
  WSUP_ASSIGN_OR_RETURN(const Api* api, GetApi());
  WSUP_CU(api, p_cuMemFree(ptr), "cuMemFree(" + Hex(ptr) + ")");
  return {};
}

Result<IpcHandle> IpcGetMemHandle(DevicePtr ptr) {
  WSUP_ASSIGN_OR_RETURN(const Api* api, GetApi());
  CUipcMemHandle h;
  WSUP_CU(api, p_cuIpcGetMemHandle(&h, ptr), "cuIpcGetMemHandle(" + Hex(ptr) + ")");
  static_assert(sizeof(h.reserved) == sizeof(IpcHandle));
  IpcHandle out;
  std::memcpy(out.data(), h.reserved, out.size());
  return out;
}

Result<DevicePtr> IpcOpenMemHandle(const IpcHandle& handle) {
  WSUP_ASSIGN_OR_RETURN(const Api* api, GetApi());
  CUipcMemHandle h;
  std::memcpy(h.reserved, handle.data(), handle.size());
  CUdeviceptr p = 0;
  WSUP_CU(api, p_cuIpcOpenMemHandle(&p, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), "cuIpcOpenMemHandle");
  return static_cast<DevicePtr>(p);
}

Status IpcCloseMemHandle(DevicePtr ptr) {
  WSUP_ASSIGN_OR_RETURN(const Api* api, GetApi());
  WSUP_CU(api, p_cuIpcCloseMemHandle(ptr), "cuIpcCloseMemHandle(" + Hex(ptr) + ")");
  return {};
}

}  // namespace wsup::cuda

#else  // !WSUP_HAVE_CUDA

namespace wsup::cuda {
namespace {

Error NotBuilt() {
  return Unavailable(
      "this wsup was built without the CUDA toolkit headers, so it has no cuda backend: rebuild "
      "with -DWSUP_CUDA=ON on a machine with the CUDA toolkit, or use backend host");
}

}  // namespace

bool BuiltWithCuda() { return false; }
Status Init() { return NotBuilt(); }
Result<int> DriverVersion() { return NotBuilt(); }
Result<int> DeviceCount() { return NotBuilt(); }
Result<DeviceInfo> GetDeviceInfo(int) { return NotBuilt(); }
Result<int> FindDeviceByUuid(const std::string&) { return NotBuilt(); }

PrimaryContext::~PrimaryContext() = default;
PrimaryContext::PrimaryContext(PrimaryContext&& o) noexcept
    : device_(std::exchange(o.device_, -1)), ctx_(std::exchange(o.ctx_, nullptr)) {}
PrimaryContext& PrimaryContext::operator=(PrimaryContext&& o) noexcept {
  device_ = std::exchange(o.device_, -1);
  ctx_ = std::exchange(o.ctx_, nullptr);
  return *this;
}
void PrimaryContext::Reset() {}
Result<PrimaryContext> PrimaryContext::Retain(int) { return NotBuilt(); }
Status PrimaryContext::MakeCurrent() const { return NotBuilt(); }
ContextScope::~ContextScope() = default;
Status ContextScope::Enter(const PrimaryContext&) {
  // Nothing to enter without CUDA; the fields are named so that this build
  // uses them too (clang's -Wunused-private-field).
  saved_ = nullptr;
  entered_ = false;
  return NotBuilt();
}

Result<uint64_t> VmmGranularity(int) { return NotBuilt(); }
Result<MemHandle> VmmCreate(int, uint64_t) { return NotBuilt(); }
Result<UniqueFd> VmmExport(MemHandle) { return NotBuilt(); }
Result<MemHandle> VmmImport(int) { return NotBuilt(); }
Result<VmmProperties> VmmGetProperties(MemHandle) { return NotBuilt(); }
Status VmmRelease(MemHandle) { return NotBuilt(); }
Result<DevicePtr> VmmReserve(uint64_t, uint64_t) { return NotBuilt(); }
Status VmmFree(DevicePtr, uint64_t) { return NotBuilt(); }
Status VmmMap(DevicePtr, uint64_t, MemHandle) { return NotBuilt(); }
Status VmmUnmap(DevicePtr, uint64_t) { return NotBuilt(); }
Status VmmSetAccess(DevicePtr, uint64_t, int) { return NotBuilt(); }
Result<void*> PinnedAlloc(size_t) { return NotBuilt(); }
void PinnedFree(void*) {}
Result<Stream> StreamCreate() { return NotBuilt(); }
void StreamDestroy(Stream) {}
Status StreamSynchronize(Stream) { return NotBuilt(); }
Result<Event> EventCreate() { return NotBuilt(); }
void EventDestroy(Event) {}
Status EventRecord(Event, Stream) { return NotBuilt(); }
Status EventSynchronize(Event) { return NotBuilt(); }
Status ContextSynchronize() { return NotBuilt(); }
Status MemsetD8(DevicePtr, uint8_t, size_t) { return NotBuilt(); }
Status CopyHtoDAsync(DevicePtr, const void*, size_t, Stream) { return NotBuilt(); }
Status Copy2DHtoDAsync(DevicePtr, size_t, const void*, size_t, size_t, size_t, Stream) { return NotBuilt(); }
Status CopyDtoH(void*, DevicePtr, size_t) { return NotBuilt(); }
Status CopyHtoD(DevicePtr, const void*, size_t) { return NotBuilt(); }
Result<DevicePtr> MemAlloc(size_t) { return NotBuilt(); }
Status MemFree(DevicePtr) { return NotBuilt(); }
Result<IpcHandle> IpcGetMemHandle(DevicePtr) { return NotBuilt(); }
Result<DevicePtr> IpcOpenMemHandle(const IpcHandle&) { return NotBuilt(); }
Status IpcCloseMemHandle(DevicePtr) { return NotBuilt(); }

}  // namespace wsup::cuda

#endif  // WSUP_HAVE_CUDA
