// The CUDA path of the reference engine, as the rest of the engine sees it:
// ranks that compute on a GPU (RankEngine), their NCCL communicators, and a
// disk load copied to the GPU. Built when the CUDA Toolkit is found;
// otherwise every function here refuses with a message saying so, and the
// engine still runs on the CPU.
//
// A CUDA rank reads its weights where they lie: the holder's arena mapped
// into this process (zero-copy), or device memory filled from disk. Its
// decode steps (one token for each of up to max_batch sequences) replay
// CUDA graphs captured at startup; other steps (prompts) run eagerly.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/model.h"
#include "engine/rank_engine.h"
#include "engine/weights.h"

namespace wsup::engine {

inline constexpr uint64_t kDefaultDequantScratchBytes = 32ull << 20;

// True when this build has the CUDA path.
bool CudaEngineBuilt();

// Makes each device's context current once (the startup's "context"
// phase) and describes them: "cuda:0 NVIDIA H200 (sm 9.0)".
Result<std::vector<std::string>> InitCudaDevices(const std::vector<int>& devices);

struct CudaRankOptions {
  // Bounds the float32 scratch that products over f16 and FP8 weights
  // widen them into (wider matrices are multiplied in row slices): without
  // a bound it is as large as the widest matrix, the lm_head, 250 MiB for
  // a 32k x 2k one.
  uint64_t dequant_scratch_bytes = kDefaultDequantScratchBytes;
  // Wide products over bfloat16 weights (engine/cuda/kernels.h): false
  // splits the float32 activations into two bfloat16 terms (two tensor-core
  // products, close to float32: the goldens hold); true rounds them to one
  // (half the work, bfloat16 arithmetic as transformers does it in bf16).
  bool bf16_activations = false;
  // Prompt chunks' attention in float32 on the CUDA cores (attention.cu)
  // instead of on tensor cores with the same split as the products
  // (attention_tc.cu). The tensor-core kernel is used wherever it fits
  // (sm_80 and later, heads up to kMaxHeadDim within the shared memory);
  // this keeps the other one tested.
  bool float32_attention = false;
};

// Binds one rank to weights already on `device` (a cuda arena or
// UploadWeights), naming any tensor that does not fit.
Result<std::unique_ptr<RankEngine>> MakeCudaRank(const ModelDims& dims, const WeightSource& weights, int device,
                                                 const CudaRankOptions& options = {});

// Copies host weights (a disk load) into one device allocation.
Result<std::unique_ptr<WeightSource>> UploadWeights(std::unique_ptr<WeightSource> host, int device);

// Creates the NCCL communicators of the group (one per rank, on the ranks'
// devices; also with a single rank), made by MakeCudaRank. max_ctas caps
// the channels (and so the buffers) each communicator sets up; 0 leaves
// it to NCCL, which takes 64 channels (578 MiB on an H200) even for one
// rank ($NCCL_MAX_CTAS still overrides it).
Status InitCudaCommunicators(const std::vector<RankEngine*>& ranks, int max_ctas = 0);

}  // namespace wsup::engine
