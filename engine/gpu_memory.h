// What the GPU driver charges to this process, per device: the memory
// nvidia-smi shows beside its pid (its CUDA contexts, the allocations it
// made, its own VMM memory; not memory it imported from another process,
// such as the holder's weights and the node's KV pool, which the driver
// charges to no process). Read through NVML (libnvidia-ml.so.1, loaded with
// dlopen at the first call, as the CUDA driver is: gpu/cuda_driver.h), so
// the engine runs where there is none and says so.
//
// Thread-safety: any thread; the library is loaded once.
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"

namespace wsup::engine {

// Bytes charged to this process on each of these cuda devices (this
// process's ordinals), summed. Unavailable without NVML or a device.
Result<uint64_t> ProcessGpuMemory(const std::vector<int>& devices);

}  // namespace wsup::engine
