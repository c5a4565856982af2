// The CUDA rank: weights bound as DevMatrix views, step buffers and KV cache
// in device memory, cuBLAS for wide products, NCCL for the collectives,
// decode steps replayed from CUDA graphs. It computes the families the CPU
// model does (engine/model.h): Llama, Qwen3-MoE (q/k norms, routed SwiGLU
// experts) and DeepSeek-V3 (MLA, group-limited routing, shared experts),
// with the same KV cache layout; mixture-of-experts routing runs on the
// device (engine/cuda/kernels.h), so MoE decode steps replay graphs too.
//
// A step is one function (Enqueue) that only enqueues work on the rank's
// stream, reading every per-step value (tokens, positions, block tables,
// logit rows) from a device buffer filled by one copy from pinned memory.
// So the same enqueue runs eagerly for any step and is captured once per
// decode batch size; a replay only rewrites the pinned buffer.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <map>

#include "engine/cuda/cuda_engine.h"
#include "engine/cuda/kernels.h"

namespace wsup::engine {

namespace {

using cuda::DevMatrix;

Error CudaFail(cudaError_t e, const std::string& what) {
  const Code code = e == cudaErrorMemoryAllocation ? Code::kUnavailable : Code::kInternal;
  std::string fix = e == cudaErrorMemoryAllocation ? "; lower --kv-cache-mib or free GPU memory" : "";
  return Error(code, "cuda: " + what + ": " + cudaGetErrorString(e) + fix);
}

#define WSUP_CUDA_TRY(expr, what)                              \
  do {                                                         \
    cudaError_t wsup_e_ = (expr);                              \
    if (wsup_e_ != cudaSuccess) return CudaFail(wsup_e_, what); \
  } while (0)

Error BlasFail(cublasStatus_t s, const std::string& what) {
  return Internal("cuBLAS: " + what + ": " + cublasGetStatusString(s));
}

Error NcclFail(ncclResult_t r, const std::string& what) {
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

Result<DevMatrix> ToDev(const MatrixRef& m) {
  DevMatrix d;
  switch (m.dtype) {
    case DType::kF32:
      d.dtype = cuda::kDevF32;
      break;
    case DType::kBF16:
      d.dtype = cuda::kDevBf16;
      break;
    case DType::kF16:
      d.dtype = cuda::kDevF16;
      break;
    case DType::kF8E4M3:
      d.dtype = cuda::kDevFp8E4M3;
      break;
    default:
      return Refused(std::string("weights: dtype ") + DTypeName(m.dtype) + " has no CUDA kernel; convert the checkpoint");
  }
  d.rows = m.rows;
  d.cols = m.cols;
  d.data = m.data;
  d.scale = m.block_scale;
  if (m.block_scale) {
    d.block_rows = m.block_rows;
    d.block_cols = m.block_cols;
    d.scale_cols = (m.cols + m.block_cols - 1) / m.block_cols;
  }
  return d;
}

class DeviceWeights : public WeightSource {
 public:
  ~DeviceWeights() override {
    if (memory_) {
      cudaSetDevice(device_);
      cudaFree(memory_);
    }
  }
  const char* source() const override { return "disk"; }
  int device() const override { return device_; }
  int device_ = 0;
  void* memory_ = nullptr;
  using WeightSource::Index;
  using WeightSource::tensors_;
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

  CudaRank(const ModelDims& d, int device, uint64_t dequant_scratch_bytes)
      : dims_(d), device_(device), dequant_cap_elems_(std::max<uint64_t>(dequant_scratch_bytes / sizeof(float), 1)) {}
  ~CudaRank() override {
    cudaSetDevice(device_);
    for (auto& [b, g] : graphs_) cudaGraphExecDestroy(g);
    if (comm_) ncclCommDestroy(comm_);
    if (blas_) cublasDestroy(blas_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  Status Init(const WeightSource& w) {
    WSUP_CUDA_TRY(cudaSetDevice(device_), "selecting cuda:" + std::to_string(device_));
    const ModelDims& d = dims_;
    for (auto [v, key] : {std::pair{d.q_dim, "the query/key head width"}, {d.v_dim, "the value head width"}}) {
      if (v > cuda::kMaxHeadDim) {
        return Refused("config.json: " + std::string(key) + " " + std::to_string(v) + " exceeds the " +
                       std::to_string(cuda::kMaxHeadDim) + " the CUDA attention kernel supports; use --device cpu");
      }
    }
    // The expert kernels compute every expert of a layer whole: the CPU path
    // splits them over ranks (tp or ep), this one does not yet.
    if (d.family != Family::kLlama && d.tp > 1) {
      return Refused(std::string(FamilyName(d.family)) + " on " + std::to_string(d.tp) +
                     " GPUs: mixture-of-experts models run on one GPU for now; list one device "
                     "(--device cuda:N), or run tensor and expert parallel on the CPU (--device cpu --tp N)");
    }
    const bool any_moe = std::find(d.sparse.begin(), d.sparse.end(), true) != d.sparse.end();
    if (any_moe && (d.experts > cuda::kMaxExperts || d.top_k > cuda::kMaxTopK)) {
      return Refused("config.json: " + std::to_string(d.experts) + " experts, " + std::to_string(d.top_k) +
                     " per token exceed the " + std::to_string(cuda::kMaxExperts) + " and " +
                     std::to_string(cuda::kMaxTopK) + " the CUDA routing kernels support; use --device cpu");
    }
    WSUP_ASSIGN_OR_RETURN(ModelWeights mw, BindWeights(dims_, w));
    WSUP_ASSIGN_OR_RETURN(embed_, ToDev(mw.embed));
    WSUP_ASSIGN_OR_RETURN(lm_head_, ToDev(mw.lm_head));
    WSUP_ASSIGN_OR_RETURN(final_norm_, ToDev(mw.final_norm));
    // Matrices that go through MatMul (all but the experts') may need the
    // dequantization scratch: the widest, and the largest smallest slice
    // (one scale block of rows); a tensor the family does not have stays
    // empty.
    int64_t widest = 0, narrowest_slice = 0;
    auto note = [&](const DevMatrix& m) {
      if (m.dtype == cuda::kDevF32) return;
      widest = std::max(widest, m.rows * m.cols);
      narrowest_slice = std::max(narrowest_slice, SliceRows(m, 1) * m.cols);
    };
    auto conv = [&](const MatrixRef& m, DevMatrix* out) -> Status {
      if (!m.data) return Status::Ok();
      WSUP_ASSIGN_OR_RETURN(*out, ToDev(m));
      note(*out);
      return Status::Ok();
    };
    // The experts' DevMatrix arrays: [layer][gate|up|down][expert], copied
    // to the device once the layers are bound.
    std::vector<DevMatrix> experts_host;
    std::vector<size_t> experts_at;  // per MoE layer: its first entry
    for (size_t li = 0; li < mw.layers.size(); ++li) {
      const LayerWeights& L = mw.layers[li];
      Layer D;
      for (auto [src, dst] : {std::pair{&L.in_norm, &D.in_norm}, {&L.post_norm, &D.post_norm}, {&L.q, &D.q},
                              {&L.k, &D.k}, {&L.v, &D.v}, {&L.o, &D.o}, {&L.gate, &D.gate}, {&L.up, &D.up},
                              {&L.down, &D.down}, {&L.q_norm, &D.q_norm}, {&L.k_norm, &D.k_norm}, {&L.q_a, &D.q_a},
                              {&L.q_a_norm, &D.q_a_norm}, {&L.q_b, &D.q_b}, {&L.kv_a, &D.kv_a},
                              {&L.kv_a_norm, &D.kv_a_norm}, {&L.kv_b, &D.kv_b}, {&L.router, &D.router},
                              {&L.router_bias, &D.router_bias}, {&L.shared.gate, &D.s_gate},
                              {&L.shared.up, &D.s_up}, {&L.shared.down, &D.s_down}}) {
        WSUP_RETURN_IF_ERROR(conv(*src, dst));
      }
      D.moe = L.moe;
      if (L.moe) {
        experts_at.push_back(experts_host.size());
        const std::string where = "weights: layer " + std::to_string(li) + "'s experts ";
        for (int which = 0; which < 3; ++which) {
          const size_t first = experts_host.size();
          for (const ExpertWeights& e : L.experts) {
            const MatrixRef& m = which == 0 ? e.gate : (which == 1 ? e.up : e.down);
            WSUP_ASSIGN_OR_RETURN(DevMatrix dm, ToDev(m));
            if (experts_host.size() > first && dm.dtype != experts_host[first].dtype) {
              return Refused(where + "mix dtypes in one projection; the CUDA expert kernel reads one dtype per "
                             "projection: convert the checkpoint to one dtype");
            }
            experts_host.push_back(dm);
          }
        }
      }
      layers_.push_back(D);
    }
    if (!experts_host.empty()) {
      WSUP_RETURN_IF_ERROR(experts_dev_.Alloc(experts_host.size(), "the experts' matrix table"));
      WSUP_CUDA_TRY(cudaMemcpy(experts_dev_.p, experts_host.data(), experts_host.size() * sizeof(DevMatrix),
                               cudaMemcpyHostToDevice),
                    "copying the experts' matrix table");
      size_t next = 0;
      const size_t E = static_cast<size_t>(d.experts);
      for (Layer& D : layers_) {
        if (!D.moe) continue;
        const size_t at = experts_at[next++];
        D.e_gate = experts_dev_.p + at;
        D.e_up = experts_dev_.p + at + E;
        D.e_down = experts_dev_.p + at + 2 * E;
        D.e_gate_dtype = experts_host[at].dtype;
        D.e_up_dtype = experts_host[at + E].dtype;
        D.e_down_dtype = experts_host[at + 2 * E].dtype;
      }
    }
    note(lm_head_);
    // Bounded: a wider matrix is widened and multiplied a row slice at a
    // time (MatMul), and a slice is never less than one scale block.
    dequant_elems_ = std::min(static_cast<size_t>(widest), static_cast<size_t>(dequant_cap_elems_));
    dequant_elems_ = std::max(dequant_elems_, static_cast<size_t>(narrowest_slice));

    WSUP_CUDA_TRY(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "creating a stream");
    cublasStatus_t bs = cublasCreate(&blas_);
    if (bs != CUBLAS_STATUS_SUCCESS) return BlasFail(bs, "creating a handle on cuda:" + std::to_string(device_));
    cublasSetStream(blas_, stream_);
    // Plain float32 products: the golden outputs are float32 computations.
    cublasSetMathMode(blas_, CUBLAS_PEDANTIC_MATH);
    // A fixed workspace, so products can be captured into graphs.
    WSUP_RETURN_IF_ERROR(blas_ws_.Alloc(32u << 20, "the cuBLAS workspace"));
    cublasSetWorkspace(blas_, blas_ws_.p, blas_ws_.n);

    std::vector<float> inv = RopeInvFreq(dims_.head_dim, dims_.theta);
    WSUP_RETURN_IF_ERROR(inv_freq_.Alloc(inv.size(), "rotary frequencies"));
    WSUP_CUDA_TRY(cudaMemcpy(inv_freq_.p, inv.data(), inv.size() * sizeof(float), cudaMemcpyHostToDevice),
                  "copying rotary frequencies");
    WSUP_RETURN_IF_ERROR(keep_dev_.Alloc(64, "the keepalive buffer"));
    WSUP_RETURN_IF_ERROR(keep_host_.Alloc(64, "the keepalive buffer"));
    return Status::Ok();
  }

  void SetComm(ncclComm_t c) { comm_ = c; }
  int device() const { return device_; }

  const ModelDims& dims() const override { return dims_; }
  std::string device_name() const override { return "cuda:" + std::to_string(device_); }

  uint64_t KvBlockBytes(int block_size) const override { return KvStorage::BlockBytes(dims_, block_size); }

  Status AllocateKv(const KvLayout& layout, int max_tokens, int max_seqs) override {
    WSUP_CUDA_TRY(cudaSetDevice(device_), "selecting cuda:" + std::to_string(device_));
    const ModelDims& d = dims_;
    const int block_size = layout.block_size;
    spare_block_ = layout.spare();
    block_size_ = block_size;
    cap_ = std::max(max_tokens, 1);
    max_seqs_ = std::max(max_seqs, 1);
    // A sequence may hold every usable block, pool and scratch.
    const int64_t usable = static_cast<int64_t>(layout.pool_blocks) + layout.scratch_blocks;
    const int64_t ctx = std::min<int64_t>(d.max_pos, usable * block_size);
    max_blocks_ = static_cast<int>((ctx + block_size - 1) / block_size);

    // The layout's spare block takes the padded rows of a replayed decode
    // batch; the scratch (with the spare) is zeroed, the pool is the node's.
    kv_mem_.reset();
    WSUP_ASSIGN_OR_RETURN(kv_mem_, KvMemory::CreateCuda(layout, device_));

    // Step metadata: tokens, positions, seq, logit rows, then block tables
    // (max_seqs rows and one padding row).
    meta_ints_ = static_cast<size_t>(cap_) * 3 + static_cast<size_t>(max_seqs_) +
                 static_cast<size_t>(max_seqs_ + 1) * static_cast<size_t>(max_blocks_);
    WSUP_RETURN_IF_ERROR(meta_dev_.Alloc(meta_ints_, "step metadata"));
    WSUP_RETURN_IF_ERROR(meta_host_.Alloc(meta_ints_, "step metadata"));
    meta_.tokens = meta_dev_.p;
    meta_.positions = meta_dev_.p + cap_;
    meta_.seq = meta_dev_.p + 2 * static_cast<size_t>(cap_);
    meta_.logit_rows = meta_dev_.p + 3 * static_cast<size_t>(cap_);
    meta_.block_table = meta_dev_.p + 3 * static_cast<size_t>(cap_) + static_cast<size_t>(max_seqs_);
    meta_.max_blocks = max_blocks_;

    const size_t T = static_cast<size_t>(cap_), R = static_cast<size_t>(max_seqs_);
    const size_t H = static_cast<size_t>(d.hidden), nq = static_cast<size_t>(d.local_heads * d.q_dim),
                 nkv = static_cast<size_t>(d.local_kv_heads * d.head_dim),
                 I = static_cast<size_t>(std::max(d.local_inter, d.shared_inter)),
                 lv = static_cast<size_t>(d.local_vocab);
    // DeepSeek-V3: kv_b_proj's output lives in v_, the latents in lat_.
    const size_t kvb = static_cast<size_t>(d.local_heads * (d.qk_nope + d.v_dim));
    const size_t lat = static_cast<size_t>(std::max(d.q_lora_rank, d.kv_lora_rank + d.qk_rope));
    WSUP_RETURN_IF_ERROR(x_.Alloc(T * H, "activations"));
    WSUP_RETURN_IF_ERROR(h_.Alloc(T * H, "activations"));
    WSUP_RETURN_IF_ERROR(proj_.Alloc(T * H, "activations"));
    WSUP_RETURN_IF_ERROR(q_.Alloc(T * nq, "activations"));
    WSUP_RETURN_IF_ERROR(attn_.Alloc(T * static_cast<size_t>(d.local_heads * d.v_dim), "activations"));
    WSUP_RETURN_IF_ERROR(k_.Alloc(T * nkv, "activations"));
    WSUP_RETURN_IF_ERROR(v_.Alloc(T * std::max(nkv, d.family == Family::kDeepseekV3 ? kvb : 0), "activations"));
    WSUP_RETURN_IF_ERROR(gate_.Alloc(T * I, "activations"));
    WSUP_RETURN_IF_ERROR(up_.Alloc(T * I, "activations"));
    if (d.family == Family::kDeepseekV3) {
      WSUP_RETURN_IF_ERROR(lat_.Alloc(T * lat, "latent activations"));
      WSUP_RETURN_IF_ERROR(lat_norm_.Alloc(T * lat, "latent activations"));
    }
    if (std::find(d.sparse.begin(), d.sparse.end(), true) != d.sparse.end()) {
      // Per routed slot (T x top_k): the expert's gate and up rows and its
      // down output; this is where a MoE step's memory goes.
      const size_t P = T * static_cast<size_t>(d.top_k), E = static_cast<size_t>(d.experts);
      WSUP_RETURN_IF_ERROR(router_logits_.Alloc(T * E, "router logits"));
      WSUP_RETURN_IF_ERROR(route_w_.Alloc(P, "routing weights"));
      WSUP_RETURN_IF_ERROR(route_ids_.Alloc(P + (E + 1) + P, "routing lists"));
      WSUP_RETURN_IF_ERROR(e_gate_.Alloc(P * static_cast<size_t>(d.moe_inter), "expert activations"));
      WSUP_RETURN_IF_ERROR(e_up_.Alloc(P * static_cast<size_t>(d.moe_inter), "expert activations"));
      WSUP_RETURN_IF_ERROR(e_out_.Alloc(std::max(P, T) * H, "expert activations"));
    }
    WSUP_RETURN_IF_ERROR(head_in_.Alloc(R * H, "activations"));
    WSUP_RETURN_IF_ERROR(local_logits_.Alloc(R * lv, "logits"));
    if (d.tp > 1) WSUP_RETURN_IF_ERROR(gathered_.Alloc(R * lv * static_cast<size_t>(d.tp), "logits"));
    WSUP_RETURN_IF_ERROR(logits_host_.Alloc(R * lv * static_cast<size_t>(d.tp), "logits"));
    if (dequant_elems_ > 0) WSUP_RETURN_IF_ERROR(dequant_.Alloc(dequant_elems_, "the dequantization scratch"));
    WSUP_CUDA_TRY(cudaStreamSynchronize(stream_), "allocating the KV cache");
    return Status::Ok();
  }

  Status AllReduceHost(float* v, size_t n) override {
    if (!comm_) return Internal("keepalive before the NCCL communicator exists");
    if (n > keep_host_.n) return Internal("keepalive of " + std::to_string(n) + " values; at most 64");
    WSUP_CUDA_TRY(cudaSetDevice(device_), "selecting cuda:" + std::to_string(device_));
    std::memcpy(keep_host_.p, v, n * sizeof(float));
    WSUP_CUDA_TRY(cudaMemcpyAsync(keep_dev_.p, keep_host_.p, n * sizeof(float), cudaMemcpyHostToDevice, stream_),
                  "keepalive copy");
    ncclResult_t r = ncclAllReduce(keep_dev_.p, keep_dev_.p, n, ncclFloat, ncclSum, comm_, stream_);
    if (r != ncclSuccess) return NcclFail(r, "keepalive all-reduce");
    WSUP_CUDA_TRY(cudaMemcpyAsync(keep_host_.p, keep_dev_.p, n * sizeof(float), cudaMemcpyDeviceToHost, stream_),
                  "keepalive copy");
    WSUP_CUDA_TRY(cudaStreamSynchronize(stream_), "keepalive");
    std::memcpy(v, keep_host_.p, n * sizeof(float));
    return Status::Ok();
  }

  Status MapKvPool(const std::vector<UniqueFd>& fds) override {
    if (!kv_mem_) return Internal("MapKvPool() before AllocateKv()");
    return kv_mem_->MapPool(fds);
  }
  KvMemory* kv_memory() override { return kv_mem_.get(); }
  Status UnmapKvPool() override {
    if (!kv_mem_) return Internal("UnmapKvPool() before AllocateKv()");
    // Every step ends with a synchronize, but a captured graph's replay is
    // the stream's too: wait for all of it before the pages go.
    WSUP_CUDA_TRY(cudaSetDevice(device_), "selecting cuda:" + std::to_string(device_));
    WSUP_CUDA_TRY(cudaStreamSynchronize(stream_), "waiting for the steps that used the KV pool");
    return kv_mem_->UnmapPool();
  }

  Status Forward(const StepBatch& b, std::vector<float>* logits) override {
    WSUP_CUDA_TRY(cudaSetDevice(device_), "selecting cuda:" + std::to_string(device_));
    const int T = static_cast<int>(b.tokens.size());
    const int R = static_cast<int>(b.logit_rows.size());
    const int S = static_cast<int>(b.block_tables.size());
    if (T == 0) return Internal("an empty step");
    if (T > cap_ || R > max_seqs_ || S > max_seqs_) {
      return Internal("a step of " + std::to_string(T) + " tokens, " + std::to_string(S) +
                      " sequences exceeds the buffers made for " + std::to_string(cap_) + " and " +
                      std::to_string(max_seqs_));
    }
    // A pure decode step (every token samples, one per sequence) replays a graph.
    bool decode = R == T;
    for (int r = 0; decode && r < R; ++r) decode = b.logit_rows[static_cast<size_t>(r)] == r;
    auto g = decode ? graphs_.lower_bound(T) : graphs_.end();

    const int rows = g != graphs_.end() ? g->first : T;
    FillMeta(b, rows);
    if (g != graphs_.end()) {
      WSUP_CUDA_TRY(cudaGraphLaunch(g->second, stream_), "replaying the decode graph");
      ++graph_steps_;
    } else {
      WSUP_RETURN_IF_ERROR(EnqueueStep(T, R, true));
      ++eager_steps_;
    }
    WSUP_CUDA_TRY(cudaStreamSynchronize(stream_), "the forward step");
    // A graph computed logits for all its rows; an eager step for R.
    ScatterLogits(g != graphs_.end() ? rows : R, R, logits);
    return Status::Ok();
  }

  Result<int> CaptureGraphs(int max_batch) override {
    WSUP_CUDA_TRY(cudaSetDevice(device_), "selecting cuda:" + std::to_string(device_));
    std::vector<int> sizes;
    const int top = std::min({max_batch, max_seqs_, cap_});
    for (int n = 1; n < top; n *= 2) sizes.push_back(n);
    if (top >= 1) sizes.push_back(top);
    for (int n : sizes) {
      // One eager run first: cuBLAS picks and loads its kernels outside the
      // capture. Every row is padding, so only the spare block is written.
      StepBatch pad;
      FillPadding(pad, n);
      FillMeta(pad, n);
      WSUP_RETURN_IF_ERROR(EnqueueStep(n, n, true));
      WSUP_CUDA_TRY(cudaStreamSynchronize(stream_), "the step before capture");

      cudaGraph_t graph = nullptr;
      WSUP_CUDA_TRY(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "starting a graph capture");
      Status st = EnqueueStep(n, n, true);
      cudaError_t end = cudaStreamEndCapture(stream_, &graph);
      if (!st.ok()) {
        if (graph) cudaGraphDestroy(graph);
        return st.error();
      }
      WSUP_CUDA_TRY(end, "capturing the decode step of " + std::to_string(n) + " sequences");
      cudaGraphExec_t exec = nullptr;
      cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
      cudaGraphDestroy(graph);
      WSUP_CUDA_TRY(inst, "instantiating the decode graph of " + std::to_string(n) + " sequences");
      graphs_[n] = exec;
    }
    return static_cast<int>(graphs_.size());
  }

  uint64_t graph_steps() const override { return graph_steps_; }
  uint64_t eager_steps() const override { return eager_steps_; }

 private:
  // A decode step of n padding rows: each writes position 0 of the spare block.
  void FillPadding(StepBatch& pad, int n) {
    pad.tokens.assign(static_cast<size_t>(n), 0);
    pad.positions.assign(static_cast<size_t>(n), 0);
    pad.seq.assign(static_cast<size_t>(n), max_seqs_);
    pad.logit_rows.resize(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) pad.logit_rows[static_cast<size_t>(r)] = r;
  }

  // Writes the step's metadata to pinned memory; rows beyond the batch's
  // tokens (a replayed graph's padding) point at the spare block.
  void FillMeta(const StepBatch& b, int rows) {
    int32_t* m = meta_host_.p;
    int32_t* tokens = m;
    int32_t* positions = m + cap_;
    int32_t* seq = m + 2 * static_cast<size_t>(cap_);
    int32_t* logit_rows = m + 3 * static_cast<size_t>(cap_);
    int32_t* tables = logit_rows + max_seqs_;
    const int T = static_cast<int>(b.tokens.size());
    for (int t = 0; t < rows; ++t) {
      const bool real = t < T;
      tokens[t] = real ? b.tokens[static_cast<size_t>(t)] : 0;
      positions[t] = real ? b.positions[static_cast<size_t>(t)] : 0;
      seq[t] = real ? b.seq[static_cast<size_t>(t)] : max_seqs_;
    }
    const int R = static_cast<int>(b.logit_rows.size());
    for (int r = 0; r < std::max(R, std::min(rows, max_seqs_)); ++r) {
      logit_rows[r] = r < R ? b.logit_rows[static_cast<size_t>(r)] : r;
    }
    // Tables of the step's sequences, then the padding row.
    const int S = static_cast<int>(b.block_tables.size());
    auto fill = [&](int s, const std::vector<int32_t>* src) {
      int32_t* row = tables + static_cast<size_t>(s) * static_cast<size_t>(max_blocks_);
      const int n = src ? std::min<int>(static_cast<int>(src->size()), max_blocks_) : 0;
      if (n) std::memcpy(row, src->data(), static_cast<size_t>(n) * sizeof(int32_t));
      std::fill(row + n, row + max_blocks_, spare_block_);
    };
    for (int s = 0; s < S; ++s) fill(s, b.block_tables[static_cast<size_t>(s)]);
    fill(max_seqs_, nullptr);
  }

  void MatMul(const DevMatrix& w, const float* x, int T, float* y) {
    if (T <= cuda::kSmallBatch) {
      cuda::LaunchGemvSmall(w, x, T, y, stream_);
      return;
    }
    if (w.dtype == cuda::kDevF32) {
      Sgemm(static_cast<const float*>(w.data), w.rows, w.cols, x, T, y, w.rows);
      return;
    }
    // Widened into the scratch a row slice at a time: rows [r0, r0 + n)
    // of w give columns [r0, r0 + n) of y.
    const int64_t step = SliceRows(w, static_cast<int64_t>(dequant_elems_) / w.cols);
    for (int64_t r0 = 0; r0 < w.rows; r0 += step) {
      const int64_t n = std::min(step, w.rows - r0);
      cuda::LaunchDequant(RowSlice(w, r0, n), dequant_.p, stream_);
      Sgemm(dequant_.p, n, w.cols, x, T, y + r0, w.rows);
    }
  }

  // Row-major y (T x rows, row stride ldy) = x (T x cols) . a^T for a
  // row-major rows x cols; in cuBLAS's column-major terms: y^T (rows x T)
  // = a^T^T . x^T, with a read as cols x rows.
  void Sgemm(const float* a, int64_t rows, int64_t cols, const float* x, int T, float* y, int64_t ldy) {
    const float one = 1.0f, zero = 0.0f;
    last_blas_ = cublasSgemm(blas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(rows), T, static_cast<int>(cols), &one,
                             a, static_cast<int>(cols), x, static_cast<int>(cols), &zero, y, static_cast<int>(ldy));
    if (last_blas_ != CUBLAS_STATUS_SUCCESS) blas_failed_ = last_blas_;
  }

  // The rows of a slice of w that fit `want` rows: at least one, and whole
  // scale blocks (an FP8 matrix's scales go by block_rows; a per-tensor
  // scale, block_rows >= rows, allows any slice).
  static int64_t SliceRows(const DevMatrix& w, int64_t want) {
    int64_t n = std::clamp<int64_t>(want, 1, std::max<int64_t>(w.rows, 1));
    if (w.dtype == cuda::kDevFp8E4M3 && w.block_rows > 1 && w.block_rows < w.rows) {
      n = std::max(w.block_rows, n / w.block_rows * w.block_rows);
    }
    return n;
  }

  // Rows [r0, r0 + n) of w as a matrix of its own (r0 a multiple of the
  // slice size SliceRows gave).
  static DevMatrix RowSlice(const DevMatrix& w, int64_t r0, int64_t n) {
    DevMatrix s = w;
    s.rows = n;
    s.data = static_cast<const uint8_t*>(w.data) + r0 * w.cols * ElemBytes(w.dtype);
    if (w.dtype == cuda::kDevFp8E4M3 && w.block_rows < w.rows) s.scale = w.scale + (r0 / w.block_rows) * w.scale_cols;
    return s;
  }

  static int64_t ElemBytes(int dtype) {
    switch (dtype) {
      case cuda::kDevBf16:
      case cuda::kDevF16:
        return 2;
      case cuda::kDevFp8E4M3:
        return 1;
      default:
        return 4;
    }
  }

  Status AllReduce(float* p, size_t n) {
    if (dims_.tp == 1) return Status::Ok();
    ncclResult_t r = ncclAllReduce(p, p, n, ncclFloat, ncclSum, comm_, stream_);
    if (r != ncclSuccess) return NcclFail(r, "all-reduce");
    return Status::Ok();
  }

  // Enqueues a whole step over `T` tokens and `R` logit rows: the metadata
  // copy in, the model, the logits copy out.
  Status EnqueueStep(int T, int R, bool copy_meta) {
    const ModelDims& d = dims_;
    const int64_t H = d.hidden, hd = d.head_dim;
    blas_failed_ = CUBLAS_STATUS_SUCCESS;
    if (copy_meta) {
      WSUP_CUDA_TRY(cudaMemcpyAsync(meta_dev_.p, meta_host_.p, meta_ints_ * sizeof(int32_t), cudaMemcpyHostToDevice,
                                    stream_),
                    "copying step metadata");
    }
    const cuda::DevKvLayout kv{reinterpret_cast<float*>(kv_mem_->base()), d.layers, d.local_kv_heads, d.kv_dim,
                               block_size_};
    cuda::LaunchEmbed(embed_, meta_, T, d.vocab_start, x_.p, stream_);
    WSUP_RETURN_IF_ERROR(AllReduce(x_.p, static_cast<size_t>(T) * H));
    const int64_t group = d.heads / d.kv_heads;
    for (int64_t l = 0; l < d.layers; ++l) {
      const Layer& L = layers_[static_cast<size_t>(l)];
      cuda::LaunchRmsNorm(x_.p, L.in_norm, nullptr, T, H, d.eps, h_.p, stream_);
      if (d.family == Family::kDeepseekV3) {
        MlaProjections(L, T, kv, l);
      } else {
        MatMul(L.q, h_.p, T, q_.p);
        MatMul(L.k, h_.p, T, k_.p);
        MatMul(L.v, h_.p, T, v_.p);
        if (d.qk_norm) {
          // Qwen3: each head's q and k RMS-normalised over head_dim, in place.
          cuda::LaunchRmsNorm(q_.p, L.q_norm, nullptr, T * static_cast<int>(d.local_heads), hd, d.eps, q_.p, stream_);
          cuda::LaunchRmsNorm(k_.p, L.k_norm, nullptr, T * static_cast<int>(d.local_kv_heads), hd, d.eps, k_.p,
                              stream_);
        }
        cuda::LaunchRopeAndStore(q_.p, k_.p, v_.p, T, d.local_heads, inv_freq_.p, meta_, kv, l, stream_);
      }
      cuda::LaunchAttention(q_.p, T, d.local_heads, d.head_start, group, d.kv_head_start, d.q_dim, d.v_dim,
                            d.attn_scale, meta_, kv, l, attn_.p, stream_);
      MatMul(L.o, attn_.p, T, proj_.p);
      WSUP_RETURN_IF_ERROR(AllReduce(proj_.p, static_cast<size_t>(T) * H));
      cuda::LaunchAdd(x_.p, proj_.p, T * H, stream_);
      cuda::LaunchRmsNorm(x_.p, L.post_norm, nullptr, T, H, d.eps, h_.p, stream_);
      if (L.moe) {
        Experts(L, T);
      } else {
        DenseMlp(L.gate, L.up, L.down, d.local_inter, h_.p, T, proj_.p);
      }
      WSUP_RETURN_IF_ERROR(AllReduce(proj_.p, static_cast<size_t>(T) * H));
      cuda::LaunchAdd(x_.p, proj_.p, T * H, stream_);
    }
    if (R > 0) {
      cuda::LaunchRmsNorm(x_.p, final_norm_, meta_.logit_rows, R, H, d.eps, head_in_.p, stream_);
      MatMul(lm_head_, head_in_.p, R, local_logits_.p);
      const size_t local = static_cast<size_t>(R) * static_cast<size_t>(d.local_vocab);
      const float* src = local_logits_.p;
      if (d.tp > 1) {
        ncclResult_t r = ncclAllGather(local_logits_.p, gathered_.p, local, ncclFloat, comm_, stream_);
        if (r != ncclSuccess) return NcclFail(r, "all-gather of the logits");
        src = gathered_.p;
      }
      WSUP_CUDA_TRY(cudaMemcpyAsync(logits_host_.p, src, local * static_cast<size_t>(d.tp) * sizeof(float),
                                    cudaMemcpyDeviceToHost, stream_),
                    "copying logits");
    }
    if (blas_failed_ != CUBLAS_STATUS_SUCCESS) return BlasFail(blas_failed_, "a matrix product");
    WSUP_CUDA_TRY(cudaGetLastError(), "launching the step's kernels");
    return Status::Ok();
  }

  // gate_ = silu(gate(in)) * up(in); out = down(gate_).
  void DenseMlp(const DevMatrix& gate, const DevMatrix& up, const DevMatrix& down, int64_t inter, const float* in,
                int T, float* out) {
    MatMul(gate, in, T, gate_.p);
    MatMul(up, in, T, up_.p);
    cuda::LaunchSiluMul(gate_.p, up_.p, static_cast<int64_t>(T) * inter, stream_);
    MatMul(down, gate_.p, T, out);
  }

  // RankModel::MlaProjections on the device: q_ gets the rotated queries,
  // the cache each head's k and v.
  void MlaProjections(const Layer& L, int T, const cuda::DevKvLayout& kv, int64_t l) {
    const ModelDims& d = dims_;
    const int64_t rank = d.kv_lora_rank, kva = rank + d.qk_rope;
    if (d.q_lora_rank > 0) {
      MatMul(L.q_a, h_.p, T, lat_.p);
      cuda::LaunchRmsNorm(lat_.p, L.q_a_norm, nullptr, T, d.q_lora_rank, d.latent_eps, lat_norm_.p, stream_);
      MatMul(L.q_b, lat_norm_.p, T, q_.p);
    } else {
      MatMul(L.q, h_.p, T, q_.p);
    }
    MatMul(L.kv_a, h_.p, T, lat_.p);
    cuda::LaunchRmsNorm(lat_.p, L.kv_a_norm, nullptr, T, rank, d.latent_eps, lat_norm_.p, stream_, kva);
    MatMul(L.kv_b, lat_norm_.p, T, v_.p);
    cuda::LaunchMlaRopeStore(q_.p, lat_.p, kva, rank, v_.p, T, d.local_heads, d.qk_nope, d.qk_rope, d.v_dim,
                             d.rope_interleave, inv_freq_.p, meta_, kv, l, stream_);
  }

  // RankModel::Experts on the device: proj_ = the routed experts' weighted
  // sum (plus the shared experts) of h_.
  void Experts(const Layer& L, int T) {
    const ModelDims& d = dims_;
    const int64_t H = d.hidden, E = d.experts, K = d.top_k;
    const int P = T * static_cast<int>(K);
    int32_t* ids = route_ids_.p;
    int32_t* offsets = ids + P;
    int32_t* order = offsets + (E + 1);
    MatMul(L.router, h_.p, T, router_logits_.p);
    cuda::DevRouting r;
    r.experts = E;
    r.top_k = K;
    r.sigmoid = d.sigmoid_router;
    r.n_group = d.n_group;
    r.topk_group = d.topk_group;
    r.norm_topk = d.norm_topk;
    r.routed_scale = d.routed_scale;
    cuda::LaunchRoute(router_logits_.p, L.router_bias, r, T, ids, route_w_.p, stream_);
    cuda::LaunchExpertLists(ids, P, E, offsets, order, stream_);
    cuda::LaunchExpertGemv(L.e_gate, L.e_gate_dtype, E, d.moe_inter, offsets, order, h_.p, static_cast<int>(K),
                           e_gate_.p, stream_);
    cuda::LaunchExpertGemv(L.e_up, L.e_up_dtype, E, d.moe_inter, offsets, order, h_.p, static_cast<int>(K), e_up_.p,
                           stream_);
    cuda::LaunchSiluMul(e_gate_.p, e_up_.p, static_cast<int64_t>(P) * d.moe_inter, stream_);
    cuda::LaunchExpertGemv(L.e_down, L.e_down_dtype, E, H, offsets, order, e_gate_.p, 1, e_out_.p, stream_);
    cuda::LaunchExpertCombine(e_out_.p, ids, route_w_.p, T, K, H, proj_.p, stream_);
    if (d.shared_inter > 0) {
      DenseMlp(L.s_gate, L.s_up, L.s_down, d.shared_inter, h_.p, T, e_out_.p);
      cuda::LaunchAdd(proj_.p, e_out_.p, static_cast<int64_t>(T) * H, stream_);
    }
  }

  // logits_host_ holds, per rank, `rows` x local_vocab; the caller wants
  // the first R rows with the whole vocabulary.
  void ScatterLogits(int rows, int R, std::vector<float>* logits) {
    const ModelDims& d = dims_;
    logits->resize(static_cast<size_t>(R) * static_cast<size_t>(d.vocab));
    const size_t lv = static_cast<size_t>(d.local_vocab);
    const size_t per_rank = static_cast<size_t>(rows) * lv;
    for (int rank = 0; rank < d.tp; ++rank) {
      for (int r = 0; r < R; ++r) {
        std::memcpy(logits->data() + static_cast<size_t>(r) * static_cast<size_t>(d.vocab) + rank * lv,
                    logits_host_.p + rank * per_rank + static_cast<size_t>(r) * lv, lv * sizeof(float));
      }
    }
  }

  ModelDims dims_;
  int device_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  ncclComm_t comm_ = nullptr;
  cublasStatus_t last_blas_ = CUBLAS_STATUS_SUCCESS, blas_failed_ = CUBLAS_STATUS_SUCCESS;

  DevMatrix embed_, lm_head_, final_norm_;
  std::vector<Layer> layers_;
  size_t dequant_elems_ = 0;
  uint64_t dequant_cap_elems_ = 0;

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
  DevBuf<char> blas_ws_;
  HostBuf<float> logits_host_, keep_host_;
  std::map<int, cudaGraphExec_t> graphs_;
  uint64_t graph_steps_ = 0, eager_steps_ = 0;
};

}  // namespace

bool CudaEngineBuilt() { return true; }

Result<std::vector<std::string>> InitCudaDevices(const std::vector<int>& devices) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    return Unavailable(std::string("--device cuda: no usable GPU (") + (e != cudaSuccess ? cudaGetErrorString(e) : "none found") +
                       "); check the NVIDIA driver with nvidia-smi, or use --device cpu");
  }
  std::vector<std::string> out;
  for (int dev : devices) {
    if (dev < 0 || dev >= count) {
      return InvalidArgument("--device cuda:" + std::to_string(dev) + ": this machine has " + std::to_string(count) +
                             " GPU(s), cuda:0 to cuda:" + std::to_string(count - 1));
    }
    WSUP_CUDA_TRY(cudaSetDevice(dev), "selecting cuda:" + std::to_string(dev));
    WSUP_CUDA_TRY(cudaFree(nullptr), "creating the context on cuda:" + std::to_string(dev));
    cudaDeviceProp prop{};
    WSUP_CUDA_TRY(cudaGetDeviceProperties(&prop, dev), "reading the properties of cuda:" + std::to_string(dev));
    out.push_back("cuda:" + std::to_string(dev) + " " + prop.name + " (sm " + std::to_string(prop.major) + "." +
                  std::to_string(prop.minor) + ")");
  }
  return out;
}

Result<std::unique_ptr<RankEngine>> MakeCudaRank(const ModelDims& dims, const WeightSource& weights, int device,
                                                 uint64_t dequant_scratch_bytes) {
  if (weights.device() != device) {
    WSUP_RETURN_IF_ERROR(CheckWeightsDevice(weights, device));
  }
  auto r = std::make_unique<CudaRank>(dims, device, dequant_scratch_bytes);
  WSUP_RETURN_IF_ERROR(r->Init(weights));
  return std::unique_ptr<RankEngine>(std::move(r));
}

Result<std::unique_ptr<WeightSource>> UploadWeights(std::unique_ptr<WeightSource> host, int device) {
  if (!host) return Internal("UploadWeights: no weights");
  if (host->device() >= 0) return host;
  constexpr uint64_t kAlign = 256;
  uint64_t total = 0;
  for (const auto& t : host->tensors()) total += (t.nbytes + kAlign - 1) / kAlign * kAlign;
  auto w = std::make_unique<DeviceWeights>();
  w->device_ = device;
  WSUP_CUDA_TRY(cudaSetDevice(device), "selecting cuda:" + std::to_string(device));
  WSUP_CUDA_TRY(cudaMalloc(&w->memory_, std::max<uint64_t>(total, kAlign)),
                "allocating " + std::to_string(total) + " bytes of weights on cuda:" + std::to_string(device));
  auto* base = static_cast<uint8_t*>(w->memory_);
  uint64_t off = 0;
  for (const auto& t : host->tensors()) {
    WSUP_CUDA_TRY(cudaMemcpy(base + off, t.data, t.nbytes, cudaMemcpyHostToDevice), "copying tensor '" + t.name + "'");
    WeightTensor d = t;
    d.data = base + off;
    w->tensors_.push_back(std::move(d));
    off += (t.nbytes + kAlign - 1) / kAlign * kAlign;
  }
  w->Index();
  return std::unique_ptr<WeightSource>(std::move(w));
}

Status InitCudaCommunicators(const std::vector<RankEngine*>& ranks, int max_ctas) {
  std::vector<CudaRank*> cr;
  std::vector<int> devs;
  for (RankEngine* r : ranks) {
    auto* c = dynamic_cast<CudaRank*>(r);
    if (!c) return Internal("InitCudaCommunicators: a rank is not a CUDA rank");
    cr.push_back(c);
    devs.push_back(c->device());
  }
  std::vector<ncclComm_t> comms(cr.size(), nullptr);
  const std::string what = "creating the communicators of " + std::to_string(cr.size()) + " rank(s)";
  // All ranks of this process in one group: each rank's init on its device.
  ncclUniqueId id;
  ncclResult_t res = ncclGetUniqueId(&id);
  if (res != ncclSuccess) return NcclFail(res, what);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  if (max_ctas > 0) config.maxCTAs = max_ctas;
  res = ncclGroupStart();
  if (res != ncclSuccess) return NcclFail(res, what);
  for (size_t i = 0; i < cr.size() && res == ncclSuccess; ++i) {
    if (cudaSetDevice(devs[i]) != cudaSuccess) return Internal(what + ": selecting cuda:" + std::to_string(devs[i]));
    res = ncclCommInitRankConfig(&comms[i], static_cast<int>(cr.size()), id, static_cast<int>(i), &config);
  }
  ncclResult_t end = ncclGroupEnd();
  if (res == ncclSuccess) res = end;
  if (res != ncclSuccess) {
    for (ncclComm_t c : comms) {
      if (c) ncclCommDestroy(c);
    }
    return NcclFail(res, what);
  }
  for (size_t i = 0; i < cr.size(); ++i) cr[i]->SetComm(comms[i]);
  return Status::Ok();
}

}  // namespace wsup::engine
