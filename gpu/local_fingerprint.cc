#include "gpu/local_fingerprint.h"

#include <filesystem>

#include "checkpoint/checkpoint.h"
#include "gpu/cuda_driver.h"

#ifndef WSUP_CUDA_RUNTIME_VERSION
#define WSUP_CUDA_RUNTIME_VERSION "none"
#endif

namespace wsup {

std::string AbsoluteModelPath(const std::string& model_dir) {
  std::error_code ec;
  std::filesystem::path p = std::filesystem::absolute(model_dir, ec);
  if (ec) p = model_dir;
  std::string s = p.lexically_normal().string();
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

Result<FingerprintInputs> LocalFingerprintInputs(const std::string& model_dir, const std::string& revision,
                                                 const ShardSpec& shard, const std::string& backend,
                                                 int device) {
  FingerprintInputs in;
  in.model_path = AbsoluteModelPath(model_dir);
  in.revision = revision;
  in.shard = shard;
  in.backend = backend;
  if (backend == "host") {
    in.device_capability = "cpu";
    in.cuda_driver = "none";
    in.cuda_runtime = "none";
    return in;
  }
  if (backend != "cuda") {
    return InvalidArgument("backend '" + backend + "' is not one of host, cuda");
  }
  auto info = cuda::GetDeviceInfo(device);
  if (!info.ok()) return info.error().With("cuda device " + std::to_string(device));
  auto driver = cuda::DriverVersion();
  if (!driver.ok()) return driver.error();
  in.device_capability = std::to_string(info->cc_major) + "." + std::to_string(info->cc_minor);
  in.cuda_driver = std::to_string(*driver);
  in.cuda_runtime = WSUP_CUDA_RUNTIME_VERSION;
  return in;
}

Result<Fingerprint> ComputeFingerprint(const std::string& model_dir, const FingerprintInputs& inputs) {
  WSUP_ASSIGN_OR_RETURN(Checkpoint ckpt, Checkpoint::Open(model_dir));
  return Fingerprint::Compute(ckpt, inputs);
}

}  // namespace wsup
