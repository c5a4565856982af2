// The fingerprint of this process's deployment: the inputs that depend on
// where and how a checkpoint is served (the model path made absolute, the
// shard, the backend, and for the cuda backend the device's capability and
// the driver and runtime versions), and the fingerprint computed from them
// and the checkpoint's headers.
//
// The holder computes its fingerprint here and every client (engines, the C
// ABI, `wsup cache`) computes the one it presents here too, so the two sides
// can only differ where the deployments differ. The driver is reached
// through gpu/cuda_driver.h (dlopen), so this works without a GPU for the
// host backend.
//
// Pure apart from reading the checkpoint's headers and asking the driver;
// any thread.
#pragma once

#include <string>

#include "checkpoint/fingerprint.h"
#include "checkpoint/sharding.h"
#include "common/status.h"

namespace wsup {

// The deployment- and device-dependent fingerprint inputs of this process:
// the model path made absolute, and for the cuda backend the device's
// capability and the driver version (through the dlopen'ed driver). The
// holder and its engines compute them the same way.
Result<FingerprintInputs> LocalFingerprintInputs(const std::string& model_dir, const std::string& revision,
                                                 const ShardSpec& shard, const std::string& backend,
                                                 int device);
// Opens the checkpoint's headers (no tensor bytes) and computes the fingerprint.
Result<Fingerprint> ComputeFingerprint(const std::string& model_dir, const FingerprintInputs& inputs);

// Absolute, normalized form of a model path, as fingerprints record it.
std::string AbsoluteModelPath(const std::string& model_dir);

}  // namespace wsup
