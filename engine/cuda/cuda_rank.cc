// The CUDA rank: weights bound as DevMatrix views, step buffers and KV cache
// in device memory, cuBLAS for wide products, NCCL for the collectives,
// decode steps replayed from CUDA graphs.
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
  };

  CudaRank(const ModelDims& d, int device) : dims_(d), device_(device) {}
  ~CudaRank() override {
    cudaSetDevice(device_);
    for (auto& [b, g] : graphs_) cudaGraphExecDestroy(g);
    if (comm_) ncclCommDestroy(comm_);
    if (blas_) cublasDestroy(blas_);
    if (stream_) cudaStreamDestroy(stream_);
  }

  Status Init(const WeightSource& w) {
    WSUP_CUDA_TRY(cudaSetDevice(device_), "selecting cuda:" + std::to_string(device_));
    if (dims_.head_dim > cuda::kMaxHeadDim) {
      return Refused("config.json: head_dim " + std::to_string(dims_.head_dim) + " exceeds the " +
                     std::to_string(cuda::kMaxHeadDim) + " the CUDA attention kernel supports; use --device cpu");
    }
    WSUP_ASSIGN_OR_RETURN(ModelWeights mw, BindWeights(dims_, w));
    WSUP_ASSIGN_OR_RETURN(embed_, ToDev(mw.embed));
    WSUP_ASSIGN_OR_RETURN(lm_head_, ToDev(mw.lm_head));
    WSUP_ASSIGN_OR_RETURN(final_norm_, ToDev(mw.final_norm));
    int64_t widest = 0;
    auto conv = [&](const MatrixRef& m, DevMatrix* out) -> Status {
      WSUP_ASSIGN_OR_RETURN(*out, ToDev(m));
      if (out->dtype != cuda::kDevF32) widest = std::max(widest, out->rows * out->cols);
      return Status::Ok();
    };
    for (const auto& L : mw.layers) {
      Layer D;
      WSUP_RETURN_IF_ERROR(conv(L.in_norm, &D.in_norm));
      WSUP_RETURN_IF_ERROR(conv(L.post_norm, &D.post_norm));
      WSUP_RETURN_IF_ERROR(conv(L.q, &D.q));
      WSUP_RETURN_IF_ERROR(conv(L.k, &D.k));
      WSUP_RETURN_IF_ERROR(conv(L.v, &D.v));
      WSUP_RETURN_IF_ERROR(conv(L.o, &D.o));
      WSUP_RETURN_IF_ERROR(conv(L.gate, &D.gate));
      WSUP_RETURN_IF_ERROR(conv(L.up, &D.up));
      WSUP_RETURN_IF_ERROR(conv(L.down, &D.down));
      layers_.push_back(D);
    }
    if (lm_head_.dtype != cuda::kDevF32) widest = std::max(widest, lm_head_.rows * lm_head_.cols);
    dequant_elems_ = static_cast<size_t>(widest);

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

  Status AllocateKv(int num_blocks, int block_size, int max_tokens, int max_seqs) override {
    WSUP_CUDA_TRY(cudaSetDevice(device_), "selecting cuda:" + std::to_string(device_));
    const ModelDims& d = dims_;
    num_blocks_ = num_blocks;
    block_size_ = block_size;
    cap_ = std::max(max_tokens, 1);
    max_seqs_ = std::max(max_seqs, 1);
    const int64_t ctx = std::min<int64_t>(d.max_pos, static_cast<int64_t>(num_blocks) * block_size);
    max_blocks_ = static_cast<int>((ctx + block_size - 1) / block_size);

    // One extra block: padded rows of a replayed decode batch write there.
    const size_t kv_floats = KvBlockBytes(block_size) / sizeof(float) * static_cast<size_t>(num_blocks + 1);
    WSUP_RETURN_IF_ERROR(kv_.Alloc(kv_floats, "the KV cache"));
    WSUP_CUDA_TRY(cudaMemsetAsync(kv_.p, 0, kv_floats * sizeof(float), stream_), "clearing the KV cache");

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
    const size_t H = static_cast<size_t>(d.hidden), nq = static_cast<size_t>(d.local_heads * d.head_dim),
                 nkv = static_cast<size_t>(d.local_kv_heads * d.head_dim), I = static_cast<size_t>(d.local_inter),
                 lv = static_cast<size_t>(d.local_vocab);
    WSUP_RETURN_IF_ERROR(x_.Alloc(T * H, "activations"));
    WSUP_RETURN_IF_ERROR(h_.Alloc(T * H, "activations"));
    WSUP_RETURN_IF_ERROR(proj_.Alloc(T * H, "activations"));
    WSUP_RETURN_IF_ERROR(q_.Alloc(T * nq, "activations"));
    WSUP_RETURN_IF_ERROR(attn_.Alloc(T * nq, "activations"));
    WSUP_RETURN_IF_ERROR(k_.Alloc(T * nkv, "activations"));
    WSUP_RETURN_IF_ERROR(v_.Alloc(T * nkv, "activations"));
    WSUP_RETURN_IF_ERROR(gate_.Alloc(T * I, "activations"));
    WSUP_RETURN_IF_ERROR(up_.Alloc(T * I, "activations"));
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
      std::fill(row + n, row + max_blocks_, num_blocks_);
    };
    for (int s = 0; s < S; ++s) fill(s, b.block_tables[static_cast<size_t>(s)]);
    fill(max_seqs_, nullptr);
  }

  void MatMul(const DevMatrix& w, const float* x, int T, float* y) {
    if (T <= cuda::kSmallBatch) {
      cuda::LaunchGemvSmall(w, x, T, y, stream_);
      return;
    }
    const float* a = static_cast<const float*>(w.data);
    if (w.dtype != cuda::kDevF32) {
      cuda::LaunchDequant(w, dequant_.p, stream_);
      a = dequant_.p;
    }
    const float one = 1.0f, zero = 0.0f;
    // Row-major y (T x rows) = x (T x cols) . w^T; in cuBLAS's column-major
    // terms: y^T (rows x T) = w^T^T . x^T, with w read as cols x rows.
    last_blas_ = cublasSgemm(blas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(w.rows), T, static_cast<int>(w.cols),
                             &one, a, static_cast<int>(w.cols), x, static_cast<int>(w.cols), &zero, y,
                             static_cast<int>(w.rows));
    if (last_blas_ != CUBLAS_STATUS_SUCCESS) blas_failed_ = last_blas_;
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
    const cuda::DevKvLayout kv{kv_.p, d.layers, d.local_kv_heads, hd, block_size_};
    cuda::LaunchEmbed(embed_, meta_, T, d.vocab_start, x_.p, stream_);
    WSUP_RETURN_IF_ERROR(AllReduce(x_.p, static_cast<size_t>(T) * H));
    const int64_t group = d.heads / d.kv_heads;
    for (int64_t l = 0; l < d.layers; ++l) {
      const Layer& L = layers_[static_cast<size_t>(l)];
      cuda::LaunchRmsNorm(x_.p, L.in_norm, nullptr, T, H, d.eps, h_.p, stream_);
      MatMul(L.q, h_.p, T, q_.p);
      MatMul(L.k, h_.p, T, k_.p);
      MatMul(L.v, h_.p, T, v_.p);
      cuda::LaunchRopeAndStore(q_.p, k_.p, v_.p, T, d.local_heads, inv_freq_.p, meta_, kv, l, stream_);
      cuda::LaunchAttention(q_.p, T, d.local_heads, d.head_start, group, d.kv_head_start, meta_, kv, l, attn_.p,
                            stream_);
      MatMul(L.o, attn_.p, T, proj_.p);
      WSUP_RETURN_IF_ERROR(AllReduce(proj_.p, static_cast<size_t>(T) * H));
      cuda::LaunchAdd(x_.p, proj_.p, T * H, stream_);
      cuda::LaunchRmsNorm(x_.p, L.post_norm, nullptr, T, H, d.eps, h_.p, stream_);
      MatMul(L.gate, h_.p, T, gate_.p);
      MatMul(L.up, h_.p, T, up_.p);
      cuda::LaunchSiluMul(gate_.p, up_.p, static_cast<int64_t>(T) * d.local_inter, stream_);
      MatMul(L.down, gate_.p, T, proj_.p);
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

  int num_blocks_ = 0, block_size_ = 0, cap_ = 0, max_seqs_ = 0, max_blocks_ = 0;
  size_t meta_ints_ = 0;
  cuda::DevStepMeta meta_;
  DevBuf<int32_t> meta_dev_;
  HostBuf<int32_t> meta_host_;
  DevBuf<float> kv_, x_, h_, proj_, q_, attn_, k_, v_, gate_, up_, head_in_, local_logits_, gathered_, dequant_;
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

Result<std::unique_ptr<RankEngine>> MakeCudaRank(const ModelDims& dims, const WeightSource& weights, int device) {
  if (weights.device() != device) {
    WSUP_RETURN_IF_ERROR(CheckWeightsDevice(weights, device));
  }
  auto r = std::make_unique<CudaRank>(dims, device);
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

Status InitCudaCommunicators(const std::vector<RankEngine*>& ranks) {
  std::vector<CudaRank*> cr;
  std::vector<int> devs;
  for (RankEngine* r : ranks) {
    auto* c = dynamic_cast<CudaRank*>(r);
    if (!c) return Internal("InitCudaCommunicators: a rank is not a CUDA rank");
    cr.push_back(c);
    devs.push_back(c->device());
  }
  std::vector<ncclComm_t> comms(cr.size(), nullptr);
  ncclResult_t res = ncclCommInitAll(comms.data(), static_cast<int>(comms.size()), devs.data());
  if (res != ncclSuccess) return NcclFail(res, "creating the communicators of " + std::to_string(cr.size()) + " rank(s)");
  for (size_t i = 0; i < cr.size(); ++i) cr[i]->SetComm(comms[i]);
  return Status::Ok();
}

}  // namespace wsup::engine
