// CudaRank: one rank of the CUDA path, a RankEngine over one GPU
// (engine/cuda/cuda_rank.cc says how it computes). Internal to the CUDA
// sources: the class and its device buffers, shared by its setup
// (cuda_rank.cc: weights, buffers, the KV cache, the NCCL and device
// entry points) and its step (cuda_rank_step.cc: a forward step, eager
// or replayed, and the capture of the decode graphs).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/cuda/cuda_engine.h"
#include "engine/cuda/kernels.h"

namespace wsup::engine::cuda_detail {

using cuda::DevMatrix;

inline Error CudaFail(cudaError_t e, const std::string& what) {
  const Code code = e == cudaErrorMemoryAllocation ? Code::kUnavailable : Code::kInternal;
  std::string fix = e == cudaErrorMemoryAllocation ? "; lower --kv-cache-mib or free GPU memory" : "";
  return Error(code, "cuda: " + what + ": " + cudaGetErrorString(e) + fix);
}

#define WSUP_CUDA_TRY(expr, what)                              \
  do {                                                         \
    cudaError_t wsup_e_ = (expr);                              \
    if (wsup_e_ != cudaSuccess) return CudaFail(wsup_e_, what); \
  } while (0)

inline Error BlasFail(cublasStatus_t s, const std::string& what) {
  return Internal("cuBLAS: " + what + ": " + cublasGetStatusString(s));
}

inline Error NcclFail(ncclResult_t r, const std::string& what) {
  return Internal("NCCL: " + what + ": " + ncclGetErrorString(r) + "; the communicator is broken: restart the engine");
}

template <typename T>
struct DevBuf {
  T* p = nullptr;
  size_t n = 0;
  DevBuf() = default;
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  ~DevBuf() {
    if (p) cudaFree(p);
  }
  Status Alloc(size_t count, const char* what) {
    n = std::max<size_t>(count, 1);
    cudaError_t e = cudaMalloc(reinterpret_cast<void**>(&p), n * sizeof(T));
    if (e != cudaSuccess) {
      p = nullptr;
      return CudaFail(e, std::string("allocating ") + what + " (" + std::to_string(n * sizeof(T)) + " bytes)");
    }
    return Status::Ok();
  }
};

template <typename T>
struct HostBuf {
  T* p = nullptr;
  size_t n = 0;
  HostBuf() = default;
  HostBuf(const HostBuf&) = delete;
  HostBuf& operator=(const HostBuf&) = delete;
  ~HostBuf() {
    if (p) cudaFreeHost(p);
  }
  Status Alloc(size_t count, const char* what) {
    n = std::max<size_t>(count, 1);
    cudaError_t e = cudaMallocHost(reinterpret_cast<void**>(&p), n * sizeof(T));
    if (e != cudaSuccess) {
      p = nullptr;
      return CudaFail(e, std::string("allocating pinned ") + what);
    }
    return Status::Ok();
  }
};

class CudaRank : public RankEngine {
 public:
  struct Layer {
    DevMatrix in_norm, post_norm, q, k, v, o, gate, up, down;
    DevMatrix q_norm, k_norm;                              // Qwen3-MoE
    DevMatrix q_a, q_a_norm, q_b, kv_a, kv_a_norm, kv_b;  // DeepSeek-V3
    bool moe = false;
    DevMatrix router, router_bias;
    // The experts' matrices as device arrays of DevMatrix (experts_dev_),
    // each of one dtype.
    const DevMatrix* e_gate = nullptr;
    const DevMatrix* e_up = nullptr;
    const DevMatrix* e_down = nullptr;
    int e_gate_dtype = cuda::kDevF32, e_up_dtype = cuda::kDevF32, e_down_dtype = cuda::kDevF32;
    DevMatrix s_gate, s_up, s_down;  // DeepSeek-V3 shared experts
  };

  CudaRank(const ModelDims& d, int device, const CudaRankOptions& o)
      : dims_(d),
        device_(device),
        dequant_cap_elems_(std::max<uint64_t>(o.dequant_scratch_bytes / sizeof(float), 1)),
        split_terms_(o.bf16_activations ? 1 : 2),
        float32_attention_(o.float32_attention) {}
  ~CudaRank() override;

  Status Init(const WeightSource& w);

  void SetComm(ncclComm_t c) { comm_ = c; }
  int device() const { return device_; }

  const ModelDims& dims() const override { return dims_; }
  std::string device_name() const override { return "cuda:" + std::to_string(device_); }

  uint64_t KvBlockBytes(int block_size) const override { return KvStorage::BlockBytes(dims_, block_size); }

  Status AllocateKv(const KvLayout& layout, int max_tokens, int max_seqs) override;

  Status AllReduceHost(float* v, size_t n) override;

  Status MapKvPool(const std::vector<UniqueFd>& fds) override;
  KvMemory* kv_memory() override { return kv_mem_.get(); }
  Status UnmapKvPool() override;

  Status Forward(const StepBatch& b, std::vector<float>* logits) override;

  Result<int> CaptureGraphs(int max_batch) override;

  uint64_t graph_steps() const override { return graph_steps_; }
  uint64_t eager_steps() const override { return eager_steps_; }

 private:
  // A decode step of n padding rows: each writes position 0 of the spare block.
  void FillPadding(StepBatch& pad, int n);

  // Writes the step's metadata to pinned memory; rows beyond the batch's
  // tokens (a replayed graph's padding) point at the spare block.
  void FillMeta(const StepBatch& b, int rows);

  void MatMul(const DevMatrix& w, const float* x, int T, float* y);

  // y = x . w^T for bfloat16 w on tensor cores: x split into split_terms_
  // bfloat16 terms (kernels.h LaunchSplitBf16), one product each, summed
  // in float32 by cuBLAS (beta 1).
  void TensorCoreMatMul(const DevMatrix& w, const float* x, int T, float* y);

  // How a step's attention runs: with no tiles (a decode graph, or a step
  // whose tokens form none), every token by the per-token kernel.
  struct AttentionPlan {
    int tiles = 0;    // query tiles, at tiles_at_ in the metadata
    int singles = 0;  // lone tokens, at singles_at_
    int64_t max_keys = 0;  // the most keys a tile reads (its last position + 1)
    cuda::TcSplit split;   // LaunchTcAttention's key split, the same for every layer
  };

  // An eager step's attention plan, written to the pinned metadata (before
  // FillMeta's copy): its prompt chunks as query tiles, its lone tokens as
  // a list for the per-token kernel. No tiles when nothing forms one or no
  // tiled kernel fits the heads.
  AttentionPlan PlanAttention(const StepBatch& b);

  // The step's attention for layer l into attn_: tiles on tensor cores
  // (attention_tc.cu) where that kernel fits, else in float32
  // (attention.cu).
  void Attention(int T, const AttentionPlan& plan, const cuda::DevKvLayout& kv, int64_t l);

  // Row-major y (T x rows, row stride ldy) = x (T x cols) . a^T for a
  // row-major rows x cols; in cuBLAS's column-major terms: y^T (rows x T)
  // = a^T^T . x^T, with a read as cols x rows.
  void Sgemm(const float* a, int64_t rows, int64_t cols, const float* x, int T, float* y, int64_t ldy);

  // The rows of a slice of w that fit `want` rows: at least one, and whole
  // scale blocks (an FP8 matrix's scales go by block_rows; a per-tensor
  // scale, block_rows >= rows, allows any slice).
  static int64_t SliceRows(const DevMatrix& w, int64_t want);

  // Rows [r0, r0 + n) of w as a matrix of its own (r0 a multiple of the
  // slice size SliceRows gave).
  static DevMatrix RowSlice(const DevMatrix& w, int64_t r0, int64_t n);

  static int64_t ElemBytes(int dtype);

  Status AllReduce(float* p, size_t n);

  // Enqueues a whole step over `T` tokens and `R` logit rows: the metadata
  // copy in, the model, the logits copy out.
  Status EnqueueStep(int T, int R, bool copy_meta, const AttentionPlan& plan);

  // The q, k and v projections of h_ (one launch for a small batch).
  void QkvProjections(const Layer& L, int T);
  // x_ += in . w^T, summed over the ranks first: an attention output or
  // an MLP's down projection into the residual.
  Status ProjectAdd(const DevMatrix& w, const float* in, int T);
  // gate_ = silu(in . gate^T) * (in . up^T).
  void GateUp(const DevMatrix& gate, const DevMatrix& up, int64_t inter, const float* in, int T);
  // gate_ = silu(gate(in)) * up(in); out = down(gate_).
  void DenseMlp(const DevMatrix& gate, const DevMatrix& up, const DevMatrix& down, int64_t inter, const float* in,
                int T, float* out);

  // RankModel::MlaProjections on the device: q_ gets the rotated queries,
  // the cache each head's k and v.
  void MlaProjections(const Layer& L, int T, const cuda::DevKvLayout& kv, int64_t l);

  // RankModel::Experts on the device: proj_ = the routed experts' weighted
  // sum (plus the shared experts) of h_.
  void Experts(const Layer& L, int T);

  // logits_host_ holds, per rank, `rows` x local_vocab; the caller wants
  // the first R rows with the whole vocabulary.
  void ScatterLogits(int rows, int R, std::vector<float>* logits);

  ModelDims dims_;
  int device_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  // Default math (tensor cores) for the bfloat16 products; blas_ stays
  // pedantic, so float32 products never take TF32.
  cublasHandle_t tc_blas_ = nullptr;
  ncclComm_t comm_ = nullptr;
  cublasStatus_t last_blas_ = CUBLAS_STATUS_SUCCESS, blas_failed_ = CUBLAS_STATUS_SUCCESS;

  DevMatrix embed_, lm_head_, final_norm_;
  std::vector<Layer> layers_;
  size_t dequant_elems_ = 0;
  uint64_t dequant_cap_elems_ = 0;
  int split_terms_ = 2;
  bool float32_attention_ = false;  // CudaRankOptions::float32_attention
  int64_t split_cols_ = 0;  // the widest bfloat16 matrix's columns: the split buffer's row
  bool tiled_ok_ = false;   // a tiled attention kernel takes this model's heads
  bool tc_attention_ = false;  // that kernel is LaunchTcAttention (else LaunchTiledAttention)
  int sms_ = 1;                // the device's multiprocessors (LaunchTcAttention's key split)
  size_t tiles_at_ = 0, singles_at_ = 0;  // in the metadata, ints

  int spare_block_ = 0, block_size_ = 0, cap_ = 0, max_seqs_ = 0, max_blocks_ = 0;
  size_t meta_ints_ = 0;
  cuda::DevStepMeta meta_;
  DevBuf<int32_t> meta_dev_;
  HostBuf<int32_t> meta_host_;
  std::unique_ptr<KvMemory> kv_mem_;
  DevBuf<float> x_, h_, proj_, q_, attn_, k_, v_, gate_, up_, head_in_, local_logits_, gathered_, dequant_;
  DevBuf<float> lat_, lat_norm_, router_logits_, route_w_, e_gate_, e_up_, e_out_;
  DevBuf<int32_t> route_ids_;  // ids (T x top_k), offsets (experts + 1), order (T x top_k)
  DevBuf<DevMatrix> experts_dev_;
  DevBuf<float> inv_freq_, keep_dev_;
  DevBuf<float> attn_part_;  // LaunchTcAttention's split keys' partial results
  DevBuf<char> blas_ws_, tc_ws_;
  DevBuf<uint16_t> xsplit_;  // split_terms_ x cap_ x split_cols_ bfloat16
  HostBuf<float> logits_host_, keep_host_;
  std::map<int, cudaGraphExec_t> graphs_;
  uint64_t graph_steps_ = 0, eager_steps_ = 0;
};

}  // namespace wsup::engine::cuda_detail
