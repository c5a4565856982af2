#include "engine/gpu_memory.h"

#include <dlfcn.h>
#include <unistd.h>

#include <mutex>
#include <string>

#include "gpu/cuda_driver.h"

namespace wsup::engine {

namespace {

// The parts of nvml.h used here (NVML's ABI: these names and layouts are
// versioned by their _v2/_v3 suffixes).
struct NvmlProcessInfo {
  unsigned int pid;
  unsigned long long used_gpu_memory;
  unsigned int gpu_instance_id;
  unsigned int compute_instance_id;
};
using NvmlDevice = void*;
constexpr int kNvmlSuccess = 0;
constexpr int kNvmlInsufficientSize = 7;

struct Nvml {
  int (*init)() = nullptr;
  int (*by_uuid)(const char*, NvmlDevice*) = nullptr;
  int (*procs)(NvmlDevice, unsigned int*, NvmlProcessInfo*) = nullptr;
  Status status;
};

const Nvml& Load() {
  static Nvml n;
  static std::once_flag once;
  std::call_once(once, [] {
    void* lib = ::dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      n.status = Unavailable("libnvidia-ml.so.1 cannot be loaded (no NVIDIA driver here); per-process GPU memory is "
                             "not known");
      return;
    }
    n.init = reinterpret_cast<int (*)()>(::dlsym(lib, "nvmlInit_v2"));
    n.by_uuid = reinterpret_cast<int (*)(const char*, NvmlDevice*)>(::dlsym(lib, "nvmlDeviceGetHandleByUUID"));
    n.procs = reinterpret_cast<int (*)(NvmlDevice, unsigned int*, NvmlProcessInfo*)>(
        ::dlsym(lib, "nvmlDeviceGetComputeRunningProcesses_v3"));
    if (!n.init || !n.by_uuid || !n.procs) {
      n.status = Unavailable("libnvidia-ml.so.1 lacks nvmlDeviceGetComputeRunningProcesses_v3; update the driver");
      return;
    }
    if (int rc = n.init(); rc != kNvmlSuccess) {
      n.status = Unavailable("nvmlInit failed (" + std::to_string(rc) + ")");
    }
  });
  return n;
}

}  // namespace

Result<uint64_t> ProcessGpuMemory(const std::vector<int>& devices) {
  const Nvml& n = Load();
  if (!n.status.ok()) return n.status.error();
  const unsigned int me = static_cast<unsigned int>(::getpid());
  uint64_t total = 0;
  for (int d : devices) {
    // NVML numbers devices by PCI order, CUDA by its own: match by uuid.
    WSUP_ASSIGN_OR_RETURN(cuda::DeviceInfo info, cuda::GetDeviceInfo(d));
    NvmlDevice dev = nullptr;
    if (int rc = n.by_uuid(info.uuid.c_str(), &dev); rc != kNvmlSuccess) {
      return Unavailable("NVML does not know " + info.uuid + " (" + std::to_string(rc) + ")");
    }
    std::vector<NvmlProcessInfo> procs(64);
    for (int tries = 0; tries < 4; ++tries) {
      unsigned int count = static_cast<unsigned int>(procs.size());
      int rc = n.procs(dev, &count, procs.data());
      if (rc == kNvmlInsufficientSize) {
        procs.resize(count + 16);
        continue;
      }
      if (rc != kNvmlSuccess) return Unavailable("NVML's process list failed (" + std::to_string(rc) + ")");
      procs.resize(count);
      break;
    }
    for (const auto& p : procs) {
      if (p.pid == me) total += p.used_gpu_memory;
    }
  }
  return total;
}

}  // namespace wsup::engine
