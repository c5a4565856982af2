// Quantization allowlist for zero-copy weight sharing.
//
// A client maps the holder's bytes as they are on disk. That is only right
// for formats an engine uses exactly as stored: unquantized weights, and
// block-wise FP8 (one float32 scale per 128x128 block, stored as
// `<w>.weight_scale_inv`). Every other format is transformed after loading
// (int4 repacked into a kernel's tile layout, per-tensor FP8 scales folded or
// requantized for fused layers, ...), and a client that only maps memory
// cannot reproduce that transform. Those are refused with Code::kRefused, an
// error naming the method, why, and that weight-cache mode `off` loads the
// model the ordinary way.
//
// Pure functions of the config and the tensor names; any thread.
#pragma once

#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "common/status.h"

namespace wsup {

// `where` names the checkpoint in messages (its folder).
Status CheckZeroCopyAllowed(const ModelConfig& config, const std::vector<std::string>& tensor_names,
                            const std::string& where);
Status CheckZeroCopyAllowed(const Checkpoint& ckpt);

}  // namespace wsup
