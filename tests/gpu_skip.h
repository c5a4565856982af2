// The [gpu] tests' check for a CUDA device: where this process sees none, a
// [gpu] test warns why and how to run it on a GPU node, and passes.
#pragma once

#include <catch2/catch.hpp>
#include <string>

#include "gpu/cuda_driver.h"

namespace wsup::test {

// Why the [gpu] tests cannot run here, or "" when they can.
inline std::string NoGpuReason() {
  Status st = cuda::Init();
  if (!st.ok()) return "no CUDA device (" + st.error().message() + ")";
  auto n = cuda::DeviceCount();
  if (!n.ok()) return "no CUDA device (" + n.error().message() + ")";
  if (*n == 0) return "no CUDA device (the driver sees no device)";
  return "";
}

}  // namespace wsup::test

// Ends the calling test (returns) with a warning where `why` (an expression
// giving a std::string) is not empty; `exe` names the test executable under
// build/tests that runs the [gpu] tests on a GPU node.
#define WSUP_GPU_SKIP_IF(why, exe)                                                                        \
  do {                                                                                                    \
    std::string why_ = (why);                                                                             \
    if (!why_.empty()) {                                                                                  \
      WARN("SKIP [gpu]: " << why_ << "; run on a GPU node with: build/tests/" << (exe) << " '[gpu]'"); \
      return;                                                                                             \
    }                                                                                                     \
  } while (0)
