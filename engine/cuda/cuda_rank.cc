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
#include "engine/cuda/cuda_rank.h"

#include <algorithm>
#include <cstring>

namespace wsup::engine {

namespace {

using cuda::DevMatrix;
using cuda_detail::CudaFail;
using cuda_detail::CudaRank;
using cuda_detail::NcclFail;

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

}  // namespace

namespace cuda_detail {

CudaRank::~CudaRank() {
  cudaSetDevice(device_);
  for (auto& [b, g] : graphs_) cudaGraphExecDestroy(g);
  if (comm_) ncclCommDestroy(comm_);
  if (blas_) cublasDestroy(blas_);
  if (tc_blas_) cublasDestroy(tc_blas_);
  if (stream_) cudaStreamDestroy(stream_);
}

Status CudaRank::Init(const WeightSource& w) {
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
    if (m.dtype == cuda::kDevBf16) {
      split_cols_ = std::max(split_cols_, m.cols);
      return;
    }
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
  if (split_cols_ > 0) {
    bs = cublasCreate(&tc_blas_);
    if (bs != CUBLAS_STATUS_SUCCESS) return BlasFail(bs, "creating a handle on cuda:" + std::to_string(device_));
    cublasSetStream(tc_blas_, stream_);
    WSUP_RETURN_IF_ERROR(tc_ws_.Alloc(32u << 20, "the cuBLAS workspace"));
    cublasSetWorkspace(tc_blas_, tc_ws_.p, tc_ws_.n);
  }
  tc_attention_ = !float32_attention_ && cuda::TcAttentionFits(d.q_dim, d.v_dim, split_terms_);
  WSUP_CUDA_TRY(cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, device_),
                "reading the multiprocessor count of cuda:" + std::to_string(device_));
  tiled_ok_ = tc_attention_ || cuda::TiledAttentionFits(d.q_dim, d.v_dim);

  std::vector<float> inv = RopeInvFreq(dims_.head_dim, dims_.theta);
  WSUP_RETURN_IF_ERROR(inv_freq_.Alloc(inv.size(), "rotary frequencies"));
  WSUP_CUDA_TRY(cudaMemcpy(inv_freq_.p, inv.data(), inv.size() * sizeof(float), cudaMemcpyHostToDevice),
                "copying rotary frequencies");
  WSUP_RETURN_IF_ERROR(keep_dev_.Alloc(64, "the keepalive buffer"));
  WSUP_RETURN_IF_ERROR(keep_host_.Alloc(64, "the keepalive buffer"));
  return Status::Ok();
}

Status CudaRank::AllocateKv(const KvLayout& layout, int max_tokens, int max_seqs) {
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
  // (max_seqs rows and one padding row), then an eager step's attention
  // plan: query tiles (pairs) and lone tokens.
  tiles_at_ = static_cast<size_t>(cap_) * 3 + static_cast<size_t>(max_seqs_) +
              static_cast<size_t>(max_seqs_ + 1) * static_cast<size_t>(max_blocks_);
  singles_at_ = tiles_at_ + 2 * static_cast<size_t>(cap_);
  meta_ints_ = singles_at_ + static_cast<size_t>(cap_);
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
  if (tc_attention_) {
    WSUP_RETURN_IF_ERROR(
        attn_part_.Alloc(static_cast<size_t>(cuda::TcAttentionScratchFloats(d.v_dim)), "attention's partial results"));
  }
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
  if (split_cols_ > 0) {
    WSUP_RETURN_IF_ERROR(xsplit_.Alloc(static_cast<size_t>(split_terms_) * T * static_cast<size_t>(split_cols_),
                                       "the bfloat16 activations of wide products"));
  }
  WSUP_CUDA_TRY(cudaStreamSynchronize(stream_), "allocating the KV cache");
  return Status::Ok();
}

Status CudaRank::AllReduceHost(float* v, size_t n) {
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

Status CudaRank::MapKvPool(const std::vector<UniqueFd>& fds) {
  if (!kv_mem_) return Internal("MapKvPool() before AllocateKv()");
  return kv_mem_->MapPool(fds);
}

Status CudaRank::UnmapKvPool() {
  if (!kv_mem_) return Internal("UnmapKvPool() before AllocateKv()");
  // Every step ends with a synchronize, but a captured graph's replay is
  // the stream's too: wait for all of it before the pages go.
  WSUP_CUDA_TRY(cudaSetDevice(device_), "selecting cuda:" + std::to_string(device_));
  WSUP_CUDA_TRY(cudaStreamSynchronize(stream_), "waiting for the steps that used the KV pool");
  return kv_mem_->UnmapPool();
}

}  // namespace cuda_detail

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
                                                 const CudaRankOptions& options) {
  if (weights.device() != device) {
    WSUP_RETURN_IF_ERROR(CheckWeightsDevice(weights, device));
  }
  auto r = std::make_unique<CudaRank>(dims, device, options);
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
