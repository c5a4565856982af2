// CudaRank's step (engine/cuda/cuda_rank.h): Forward() replays a decode
// graph or enqueues the step eagerly; EnqueueStep() is the model, layer
// by layer, on the rank's stream.
#include "engine/cuda/cuda_rank.h"

#include <algorithm>
#include <cstring>

namespace wsup::engine::cuda_detail {

Status CudaRank::Forward(const StepBatch& b, std::vector<float>* logits) {
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
    WSUP_RETURN_IF_ERROR(EnqueueStep(T, R, true, PlanAttention(b)));
    ++eager_steps_;
  }
  WSUP_CUDA_TRY(cudaStreamSynchronize(stream_), "the forward step");
  // A graph computed logits for all its rows; an eager step for R.
  ScatterLogits(g != graphs_.end() ? rows : R, R, logits);
  return Status::Ok();
}

Result<int> CudaRank::CaptureGraphs(int max_batch) {
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
    WSUP_RETURN_IF_ERROR(EnqueueStep(n, n, true, AttentionPlan{}));
    WSUP_CUDA_TRY(cudaStreamSynchronize(stream_), "the step before capture");

    cudaGraph_t graph = nullptr;
    WSUP_CUDA_TRY(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "starting a graph capture");
    Status st = EnqueueStep(n, n, true, AttentionPlan{});
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

void CudaRank::FillPadding(StepBatch& pad, int n) {
  pad.tokens.assign(static_cast<size_t>(n), 0);
  pad.positions.assign(static_cast<size_t>(n), 0);
  pad.seq.assign(static_cast<size_t>(n), max_seqs_);
  pad.logit_rows.resize(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) pad.logit_rows[static_cast<size_t>(r)] = r;
}

void CudaRank::FillMeta(const StepBatch& b, int rows) {
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

CudaRank::AttentionPlan CudaRank::PlanAttention(const StepBatch& b) {
  AttentionPlan plan;
  if (!tiled_ok_) return plan;
  int32_t* tiles = meta_host_.p + tiles_at_;
  int32_t* singles = meta_host_.p + singles_at_;
  const int T = static_cast<int>(b.tokens.size());
  for (int t = 0; t < T;) {
    // A run of one sequence's consecutive positions (the scheduler puts a
    // prompt chunk's tokens together), cut at a tile's size.
    int n = 1;
    while (t + n < T && n < cuda::kAttnTile && b.seq[static_cast<size_t>(t + n)] == b.seq[static_cast<size_t>(t)] &&
           b.positions[static_cast<size_t>(t + n)] == b.positions[static_cast<size_t>(t)] + n) {
      ++n;
    }
    if (n == 1) {
      singles[plan.singles++] = t;
    } else {
      tiles[2 * plan.tiles] = t;
      tiles[2 * plan.tiles + 1] = n;
      ++plan.tiles;
      plan.max_keys = std::max<int64_t>(plan.max_keys, int64_t{b.positions[static_cast<size_t>(t)]} + n);
    }
    t += n;
  }
  if (tc_attention_) plan.split = cuda::PlanTcSplit(plan.tiles, dims_.local_heads, plan.max_keys, sms_);
  return plan;
}

void CudaRank::Attention(int T, const AttentionPlan& plan, const cuda::DevKvLayout& kv, int64_t l) {
  const ModelDims& d = dims_;
  const int64_t group = d.heads / d.kv_heads;
  if (plan.tiles == 0) {
    cuda::LaunchAttention(q_.p, T, d.local_heads, d.head_start, group, d.kv_head_start, d.q_dim, d.v_dim,
                          d.attn_scale, meta_, kv, l, attn_.p, stream_);
    return;
  }
  if (tc_attention_) {
    cuda::LaunchTcAttention(q_.p, meta_dev_.p + tiles_at_, plan.tiles, d.local_heads, d.head_start, group,
                            d.kv_head_start, d.q_dim, d.v_dim, d.attn_scale, split_terms_, plan.split, attn_part_.p,
                            meta_, kv, l, attn_.p, stream_);
  } else {
    cuda::LaunchTiledAttention(q_.p, meta_dev_.p + tiles_at_, plan.tiles, d.local_heads, d.head_start, group,
                               d.kv_head_start, d.q_dim, d.v_dim, d.attn_scale, meta_, kv, l, attn_.p, stream_);
  }
  cuda::LaunchAttention(q_.p, plan.singles, d.local_heads, d.head_start, group, d.kv_head_start, d.q_dim, d.v_dim,
                        d.attn_scale, meta_, kv, l, attn_.p, stream_, meta_dev_.p + singles_at_);
}

void CudaRank::TensorCoreMatMul(const DevMatrix& w, const float* x, int T, float* y) {
  const size_t n = static_cast<size_t>(T) * static_cast<size_t>(w.cols);
  uint16_t* hi = xsplit_.p;
  uint16_t* lo = split_terms_ > 1 ? xsplit_.p + n : nullptr;
  cuda::LaunchSplitBf16(x, static_cast<int64_t>(n), hi, lo, stream_);
  const float one = 1.0f, zero = 0.0f;
  for (int term = 0; term < split_terms_; ++term) {
    // As Sgemm: y^T (rows x T) = w (read as cols x rows, transposed) . x^T.
    last_blas_ = cublasGemmEx(tc_blas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(w.rows), T,
                              static_cast<int>(w.cols), &one, w.data, CUDA_R_16BF, static_cast<int>(w.cols),
                              term == 0 ? hi : lo, CUDA_R_16BF, static_cast<int>(w.cols), term == 0 ? &zero : &one,
                              y, CUDA_R_32F, static_cast<int>(w.rows), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (last_blas_ != CUBLAS_STATUS_SUCCESS) blas_failed_ = last_blas_;
  }
}

void CudaRank::MatMul(const DevMatrix& w, const float* x, int T, float* y) {
  if (T <= cuda::kSmallBatch) {
    cuda::LaunchGemvSmall(w, x, T, y, stream_);
    return;
  }
  if (w.dtype == cuda::kDevBf16 && tc_blas_) {
    TensorCoreMatMul(w, x, T, y);
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

void CudaRank::Sgemm(const float* a, int64_t rows, int64_t cols, const float* x, int T, float* y, int64_t ldy) {
  const float one = 1.0f, zero = 0.0f;
  last_blas_ = cublasSgemm(blas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(rows), T, static_cast<int>(cols), &one,
                           a, static_cast<int>(cols), x, static_cast<int>(cols), &zero, y, static_cast<int>(ldy));
  if (last_blas_ != CUBLAS_STATUS_SUCCESS) blas_failed_ = last_blas_;
}

int64_t CudaRank::SliceRows(const DevMatrix& w, int64_t want) {
  int64_t n = std::clamp<int64_t>(want, 1, std::max<int64_t>(w.rows, 1));
  if (w.dtype == cuda::kDevFp8E4M3 && w.block_rows > 1 && w.block_rows < w.rows) {
    n = std::max(w.block_rows, n / w.block_rows * w.block_rows);
  }
  return n;
}

DevMatrix CudaRank::RowSlice(const DevMatrix& w, int64_t r0, int64_t n) {
  DevMatrix s = w;
  s.rows = n;
  s.data = static_cast<const uint8_t*>(w.data) + r0 * w.cols * ElemBytes(w.dtype);
  if (w.dtype == cuda::kDevFp8E4M3 && w.block_rows < w.rows) s.scale = w.scale + (r0 / w.block_rows) * w.scale_cols;
  return s;
}

int64_t CudaRank::ElemBytes(int dtype) {
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

Status CudaRank::AllReduce(float* p, size_t n) {
  if (dims_.tp == 1) return Status::Ok();
  ncclResult_t r = ncclAllReduce(p, p, n, ncclFloat, ncclSum, comm_, stream_);
  if (r != ncclSuccess) return NcclFail(r, "all-reduce");
  return Status::Ok();
}

Status CudaRank::EnqueueStep(int T, int R, bool copy_meta, const AttentionPlan& plan) {
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
  for (int64_t l = 0; l < d.layers; ++l) {
    const Layer& L = layers_[static_cast<size_t>(l)];
    cuda::LaunchRmsNorm(x_.p, L.in_norm, nullptr, T, H, d.eps, h_.p, stream_);
    if (d.family == Family::kDeepseekV3) {
      MlaProjections(L, T, kv, l);
    } else {
      QkvProjections(L, T);
      if (d.qk_norm) {
        // Qwen3: each head's q and k RMS-normalised over head_dim, in place.
        cuda::LaunchRmsNorm(q_.p, L.q_norm, nullptr, T * static_cast<int>(d.local_heads), hd, d.eps, q_.p, stream_);
        cuda::LaunchRmsNorm(k_.p, L.k_norm, nullptr, T * static_cast<int>(d.local_kv_heads), hd, d.eps, k_.p,
                            stream_);
      }
      cuda::LaunchRopeAndStore(q_.p, k_.p, v_.p, T, d.local_heads, inv_freq_.p, meta_, kv, l, stream_);
    }
    Attention(T, plan, kv, l);
    WSUP_RETURN_IF_ERROR(ProjectAdd(L.o, attn_.p, T));
    cuda::LaunchRmsNorm(x_.p, L.post_norm, nullptr, T, H, d.eps, h_.p, stream_);
    if (L.moe) {
      Experts(L, T);
      WSUP_RETURN_IF_ERROR(AllReduce(proj_.p, static_cast<size_t>(T) * H));
      cuda::LaunchAdd(x_.p, proj_.p, T * H, stream_);
    } else {
      GateUp(L.gate, L.up, d.local_inter, h_.p, T);
      WSUP_RETURN_IF_ERROR(ProjectAdd(L.down, gate_.p, T));
    }
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

void CudaRank::QkvProjections(const Layer& L, int T) {
  const DevMatrix* ws[3] = {&L.q, &L.k, &L.v};
  if (T <= cuda::kSmallBatch && cuda::GemvSmallFuses(ws, 3)) {
    float* ys[3] = {q_.p, k_.p, v_.p};
    cuda::LaunchGemvSmallMany(ws, ys, 3, h_.p, T, stream_);
    return;
  }
  MatMul(L.q, h_.p, T, q_.p);
  MatMul(L.k, h_.p, T, k_.p);
  MatMul(L.v, h_.p, T, v_.p);
}

Status CudaRank::ProjectAdd(const DevMatrix& w, const float* in, int T) {
  // With one rank there is nothing to all-reduce in between, so a small
  // batch's product adds straight into the residual.
  if (dims_.tp == 1 && T <= cuda::kSmallBatch) {
    cuda::LaunchGemvSmallAdd(w, in, T, x_.p, stream_);
    return Status::Ok();
  }
  MatMul(w, in, T, proj_.p);
  const size_t n = static_cast<size_t>(T) * static_cast<size_t>(dims_.hidden);
  WSUP_RETURN_IF_ERROR(AllReduce(proj_.p, n));
  cuda::LaunchAdd(x_.p, proj_.p, static_cast<int64_t>(n), stream_);
  return Status::Ok();
}

void CudaRank::GateUp(const DevMatrix& gate, const DevMatrix& up, int64_t inter, const float* in, int T) {
  const DevMatrix* ws[2] = {&gate, &up};
  if (T <= cuda::kSmallBatch && cuda::GemvSmallFuses(ws, 2)) {
    cuda::LaunchGemvSmallSiluGateUp(gate, up, in, T, gate_.p, stream_);
    return;
  }
  MatMul(gate, in, T, gate_.p);
  MatMul(up, in, T, up_.p);
  cuda::LaunchSiluMul(gate_.p, up_.p, static_cast<int64_t>(T) * inter, stream_);
}

void CudaRank::DenseMlp(const DevMatrix& gate, const DevMatrix& up, const DevMatrix& down, int64_t inter, const float* in,
                        int T, float* out) {
  GateUp(gate, up, inter, in, T);
  MatMul(down, gate_.p, T, out);
}

void CudaRank::MlaProjections(const Layer& L, int T, const cuda::DevKvLayout& kv, int64_t l) {
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

void CudaRank::Experts(const Layer& L, int T) {
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

void CudaRank::ScatterLogits(int rows, int R, std::vector<float>* logits) {
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

}  // namespace wsup::engine::cuda_detail
