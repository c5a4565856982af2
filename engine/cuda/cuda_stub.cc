// The CUDA path in a build without the CUDA Toolkit: every entry point
// refuses, naming the fix.
#include "engine/cuda/cuda_engine.h"

namespace wsup::engine {

namespace {
Error NotBuilt() {
  return Error(Code::kUnavailable,
               "this build of wsup-engine has no CUDA path (the CUDA Toolkit was not found at build time); "
               "rebuild with the toolkit installed (cmake -DWSUP_CUDA=ON), or use --device cpu");
}
}  // namespace

bool CudaEngineBuilt() { return false; }
Result<std::vector<std::string>> InitCudaDevices(const std::vector<int>&) { return NotBuilt(); }
Result<std::unique_ptr<RankEngine>> MakeCudaRank(const ModelDims&, const WeightSource&, int, const CudaRankOptions&) {
  return NotBuilt();
}
Result<std::unique_ptr<WeightSource>> UploadWeights(std::unique_ptr<WeightSource>, int) { return NotBuilt(); }
Status InitCudaCommunicators(const std::vector<RankEngine*>&, int) { return NotBuilt(); }

}  // namespace wsup::engine
