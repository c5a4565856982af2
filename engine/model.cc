#include "engine/model.h"

#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstring>

namespace wsup::engine {

namespace {

std::string Shape(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

template <typename T>
void Grow(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
}

}  // namespace

Result<ModelDims> ModelDims::From(const ModelConfig& cfg, int tp, int rank) {
  const std::string where = "config.json";
  if (!cfg.architecture.empty() && cfg.architecture != "LlamaForCausalLM" && cfg.architecture != "MistralForCausalLM") {
    return Refused(where + ": architecture '" + cfg.architecture +
                   "' is not a Llama-family model; the reference engine serves LlamaForCausalLM checkpoints");
  }
  ModelDims d;
  d.vocab = cfg.vocab_size;
  d.hidden = cfg.hidden_size;
  d.inter = cfg.intermediate_size;
  d.layers = cfg.num_hidden_layers;
  d.heads = cfg.num_attention_heads;
  d.kv_heads = cfg.num_key_value_heads > 0 ? cfg.num_key_value_heads : cfg.num_attention_heads;
  d.head_dim = cfg.head_dim > 0 ? cfg.head_dim : (d.heads > 0 ? d.hidden / d.heads : 0);
  d.max_pos = cfg.max_position_embeddings > 0 ? cfg.max_position_embeddings : 2048;
  d.eps = static_cast<float>(cfg.rms_norm_eps);
  d.theta = cfg.rope_theta;
  d.tied = cfg.tie_word_embeddings;
  if (cfg.quant.weight_block_size.size() == 2) {
    d.block_rows = cfg.quant.weight_block_size[0];
    d.block_cols = cfg.quant.weight_block_size[1];
  }
  auto positive = [&](int64_t v, const char* key) -> Status {
    if (v <= 0) return Corrupt(where + ": " + key + " is " + std::to_string(v) + "; it must be positive: fix config.json");
    return Status::Ok();
  };
  WSUP_RETURN_IF_ERROR(positive(d.vocab, "vocab_size"));
  WSUP_RETURN_IF_ERROR(positive(d.hidden, "hidden_size"));
  WSUP_RETURN_IF_ERROR(positive(d.inter, "intermediate_size"));
  WSUP_RETURN_IF_ERROR(positive(d.layers, "num_hidden_layers"));
  WSUP_RETURN_IF_ERROR(positive(d.heads, "num_attention_heads"));
  WSUP_RETURN_IF_ERROR(positive(d.head_dim, "head_dim"));
  WSUP_RETURN_IF_ERROR(positive(d.block_rows, "quantization_config.weight_block_size[0]"));
  WSUP_RETURN_IF_ERROR(positive(d.block_cols, "quantization_config.weight_block_size[1]"));
  if (d.head_dim % 2 != 0) return Corrupt(where + ": head_dim " + std::to_string(d.head_dim) + " is odd; rotary embeddings need an even head_dim");
  if (d.heads % d.kv_heads != 0) {
    return Corrupt(where + ": num_attention_heads " + std::to_string(d.heads) + " is not a multiple of num_key_value_heads " +
                   std::to_string(d.kv_heads) + "; fix config.json");
  }
  if (!(std::isfinite(d.theta) && d.theta > 1.0)) return Corrupt(where + ": rope_theta must be a finite number above 1");
  if (tp < 1 || rank < 0 || rank >= tp) return InvalidArgument("tensor parallel rank " + std::to_string(rank) + " of " + std::to_string(tp) + " is out of range");
  auto divisible = [&](int64_t v, const char* key) -> Status {
    if (v % tp != 0) {
      return InvalidArgument("--tp " + std::to_string(tp) + " does not divide " + key + " " + std::to_string(v) +
                             "; choose a tp that divides it");
    }
    return Status::Ok();
  };
  WSUP_RETURN_IF_ERROR(divisible(d.heads, "num_attention_heads"));
  WSUP_RETURN_IF_ERROR(divisible(d.inter, "intermediate_size"));
  WSUP_RETURN_IF_ERROR(divisible(d.vocab, "vocab_size"));
  d.tp = tp;
  d.rank = rank;
  d.local_heads = d.heads / tp;
  d.head_start = rank * d.local_heads;
  if (tp <= d.kv_heads) {
    WSUP_RETURN_IF_ERROR(divisible(d.kv_heads, "num_key_value_heads"));
    d.local_kv_heads = d.kv_heads / tp;
    d.kv_head_start = rank * d.local_kv_heads;
  } else {
    if (tp % d.kv_heads != 0) {
      return InvalidArgument("--tp " + std::to_string(tp) + " exceeds num_key_value_heads " + std::to_string(d.kv_heads) +
                             " but is not a multiple of it, so KV heads cannot be replicated evenly; choose a tp "
                             "that divides it or is a multiple of it");
    }
    d.local_kv_heads = 1;
    d.kv_head_start = rank * d.kv_heads / tp;
  }
  d.local_inter = d.inter / tp;
  d.local_vocab = d.vocab / tp;
  d.vocab_start = rank * d.local_vocab;
  return d;
}

uint64_t KvStorage::BlockBytes(const ModelDims& d, int block_size) {
  return static_cast<uint64_t>(d.layers) * 2 * static_cast<uint64_t>(d.local_kv_heads) *
         static_cast<uint64_t>(block_size) * static_cast<uint64_t>(d.head_dim) * sizeof(float);
}

Status KvStorage::Allocate(const ModelDims& d, int num_blocks, int block_size) {
  if (num_blocks <= 0 || block_size <= 0) return InvalidArgument("KV cache: no blocks to allocate");
  layers_ = static_cast<size_t>(d.layers);
  heads_ = static_cast<size_t>(d.local_kv_heads);
  head_dim_ = static_cast<size_t>(d.head_dim);
  block_size_ = block_size;
  num_blocks_ = num_blocks;
  const size_t bytes = static_cast<size_t>(BlockBytes(d, block_size)) * static_cast<size_t>(num_blocks);
  if (data_) ::munmap(data_, bytes_);
  data_ = nullptr;
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    return Unavailable("KV cache: cannot allocate " + std::to_string(bytes) +
                       " bytes; lower --kv-cache-mib or free memory");
  }
  ::madvise(p, bytes, MADV_HUGEPAGE);  // a hint: without huge pages it still works
  // Touch every page now: the memory is really there from startup on.
  auto* bytes_p = static_cast<volatile char*>(p);
  for (size_t off = 0; off < bytes; off += 4096) bytes_p[off] = 0;
  data_ = static_cast<float*>(p);
  bytes_ = bytes;
  return Status::Ok();
}

KvStorage::~KvStorage() {
  if (data_) ::munmap(data_, bytes_);
}

Result<ModelWeights> BindWeights(const ModelDims& d, const WeightSource& w) {
  ModelWeights mw;
  ModelWeights* m = &mw;
  const std::string rank_note = d.tp > 1 ? " (rank " + std::to_string(d.rank) + " of " + std::to_string(d.tp) + ")" : "";

  auto get = [&](const std::string& name, std::vector<int64_t> shape, MatrixRef* out) -> Status {
    const WeightTensor* t = w.Find(name);
    if (!t) {
      return NotFound("weights: tensor '" + name + "' is missing" + rank_note +
                      "; the checkpoint is incomplete or not a Llama-family model: re-download it");
    }
    if (t->shape != shape) {
      return Corrupt("weights: tensor '" + name + "' has shape " + Shape(t->shape) + rank_note + " but config.json implies " +
                     Shape(shape) + "; the config and the weights belong to different models: restore the matching files");
    }
    if (!KernelSupports(t->dtype)) {
      return Refused("weights: tensor '" + name + "' is " + DTypeName(t->dtype) +
                     "; the reference engine reads F32, BF16, F16 and block FP8 (F8_E4M3): convert the checkpoint");
    }
    MatrixRef r;
    r.dtype = t->dtype;
    r.rows = shape[0];
    r.cols = shape.size() > 1 ? shape[1] : 1;
    if (shape.size() == 1) {  // a norm: one row
      r.rows = 1;
      r.cols = shape[0];
    }
    r.data = t->data;
    if (t->dtype == DType::kF8E4M3) {
      const std::string sname = name + "_scale_inv";
      const WeightTensor* s = w.Find(sname);
      if (!s) {
        return Refused("weights: tensor '" + name + "' is F8_E4M3 without a block scale '" + sname +
                       "'; only block FP8 (one float32 scale per block) is supported: use a block-FP8 or unquantized checkpoint");
      }
      std::vector<int64_t> want = {(r.rows + d.block_rows - 1) / d.block_rows, (r.cols + d.block_cols - 1) / d.block_cols};
      if (s->dtype != DType::kF32 || s->shape != want) {
        return Corrupt("weights: block scale '" + sname + "' is " + DTypeName(s->dtype) + " " + Shape(s->shape) +
                       rank_note + "; expected F32 " + Shape(want) + " for blocks of " + std::to_string(d.block_rows) +
                       "x" + std::to_string(d.block_cols) + ": the checkpoint is damaged, re-download it");
      }
      r.block_scale = static_cast<const float*>(s->data);
      r.block_rows = d.block_rows;
      r.block_cols = d.block_cols;
    }
    *out = r;
    return Status::Ok();
  };

  const int64_t H = d.hidden, hd = d.head_dim;
  WSUP_RETURN_IF_ERROR(get("model.embed_tokens.weight", {d.local_vocab, H}, &m->embed));
  WSUP_RETURN_IF_ERROR(get("model.norm.weight", {H}, &m->final_norm));
  if (w.Find("lm_head.weight")) {
    WSUP_RETURN_IF_ERROR(get("lm_head.weight", {d.local_vocab, H}, &m->lm_head));
  } else if (d.tied) {
    m->lm_head = m->embed;
  } else {
    return NotFound("weights: tensor 'lm_head.weight' is missing and config.json says tie_word_embeddings is false; "
                    "restore the tensor or the matching config.json");
  }
  for (int64_t l = 0; l < d.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    if (w.Find(p + "self_attn.q_proj.bias") || w.Find(p + "mlp.gate_proj.bias")) {
      return Refused("weights: '" + p + "' has projection biases; the reference engine serves Llama models "
                     "without biases (attention_bias and mlp_bias false)");
    }
    LayerWeights L;
    WSUP_RETURN_IF_ERROR(get(p + "input_layernorm.weight", {H}, &L.in_norm));
    WSUP_RETURN_IF_ERROR(get(p + "post_attention_layernorm.weight", {H}, &L.post_norm));
    WSUP_RETURN_IF_ERROR(get(p + "self_attn.q_proj.weight", {d.local_heads * hd, H}, &L.q));
    WSUP_RETURN_IF_ERROR(get(p + "self_attn.k_proj.weight", {d.local_kv_heads * hd, H}, &L.k));
    WSUP_RETURN_IF_ERROR(get(p + "self_attn.v_proj.weight", {d.local_kv_heads * hd, H}, &L.v));
    WSUP_RETURN_IF_ERROR(get(p + "self_attn.o_proj.weight", {H, d.local_heads * hd}, &L.o));
    const std::string fused = p + "mlp.gate_up_proj.weight";
    if (w.Find(fused)) {
      // The engine's own layout (engine/layout_publish.h): gate rows, then
      // up rows, in one matrix; each is a view of its half.
      if (w.Find(p + "mlp.gate_proj.weight") || w.Find(p + "mlp.up_proj.weight")) {
        return Corrupt("weights: '" + fused + "' and a separate gate_proj or up_proj are both present" + rank_note +
                       "; a layout holds one or the other: publish the layout again");
      }
      MatrixRef gu;
      WSUP_RETURN_IF_ERROR(get(fused, {2 * d.local_inter, H}, &gu));
      if (gu.dtype == DType::kF8E4M3) {
        return Refused("weights: '" + fused + "' is F8_E4M3; the reference engine fuses only unquantized "
                       "projections: publish the layout again from this engine");
      }
      L.gate = gu;
      L.gate.rows = d.local_inter;
      L.up = L.gate;
      L.up.data = static_cast<const uint8_t*>(gu.data) +
                  static_cast<size_t>(d.local_inter * H) * DTypeSize(gu.dtype);
    } else {
      WSUP_RETURN_IF_ERROR(get(p + "mlp.gate_proj.weight", {d.local_inter, H}, &L.gate));
      WSUP_RETURN_IF_ERROR(get(p + "mlp.up_proj.weight", {d.local_inter, H}, &L.up));
    }
    WSUP_RETURN_IF_ERROR(get(p + "mlp.down_proj.weight", {H, d.local_inter}, &L.down));
    m->layers.push_back(L);
  }
  return mw;
}

Result<std::unique_ptr<RankModel>> RankModel::Bind(const ModelDims& d, const WeightSource& w, int threads) {
  if (w.device() >= 0) {
    return Refused("weights are in GPU memory (cuda:" + std::to_string(w.device()) +
                   ") but this rank computes on the CPU; use --device cuda:N or a host-backend holder");
  }
  WSUP_ASSIGN_OR_RETURN(ModelWeights mw, BindWeights(d, w));
  std::unique_ptr<RankModel> m(new RankModel(d, threads));
  m->embed_ = mw.embed;
  m->lm_head_ = mw.lm_head;
  m->final_norm_ = mw.final_norm;
  m->layers_ = std::move(mw.layers);
  m->inv_freq_ = RopeInvFreq(d.head_dim, d.theta);
  return m;
}

void RankModel::Attention(const StepBatch& batch, KvStorage& kv, int64_t layer, const float* q, float* out) {
  const ModelDims& d = dims_;
  const int64_t T = static_cast<int64_t>(batch.tokens.size());
  const int64_t hd = d.head_dim, nq = d.local_heads * hd;
  const int64_t group = d.heads / d.kv_heads;
  const int bs = kv.block_size();
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  pool_.ParallelFor(T * d.local_heads, [&](int64_t task) {
    thread_local std::vector<float> scores;
    const int64_t t = task / d.local_heads, j = task % d.local_heads;
    const int64_t kvh = (d.head_start + j) / group - d.kv_head_start;
    const int64_t pos = batch.positions[static_cast<size_t>(t)];
    const std::vector<int32_t>& table = *batch.block_tables[static_cast<size_t>(batch.seq[static_cast<size_t>(t)])];
    const float* qh = q + t * nq + j * hd;
    if (static_cast<int64_t>(scores.size()) < pos + 1) scores.resize(static_cast<size_t>(pos + 1));
    float mx = -INFINITY;
    for (int64_t p = 0; p <= pos; ++p) {
      const float* kp = kv.At(table[static_cast<size_t>(p / bs)], layer, 0, kvh) + (p % bs) * hd;
      const float s = Dot(qh, kp, hd) * scale;
      scores[static_cast<size_t>(p)] = s;
      mx = std::max(mx, s);
    }
    float sum = 0;
    for (int64_t p = 0; p <= pos; ++p) {
      const float e = std::exp(scores[static_cast<size_t>(p)] - mx);
      scores[static_cast<size_t>(p)] = e;
      sum += e;
    }
    float* o = out + t * nq + j * hd;
    std::fill(o, o + hd, 0.0f);
    const float inv = 1.0f / sum;
    for (int64_t p = 0; p <= pos; ++p) {
      const float* vp = kv.At(table[static_cast<size_t>(p / bs)], layer, 1, kvh) + (p % bs) * hd;
      const float a = scores[static_cast<size_t>(p)] * inv;
      for (int64_t i = 0; i < hd; ++i) o[i] += a * vp[i];
    }
  });
}

Status RankModel::Forward(const StepBatch& batch, KvStorage& kv, Communicator& comm, std::vector<float>* logits) {
  const ModelDims& d = dims_;
  const int64_t T = static_cast<int64_t>(batch.tokens.size());
  const int64_t H = d.hidden, hd = d.head_dim;
  const int64_t nq = d.local_heads * hd, nkv = d.local_kv_heads * hd;
  const int bs = kv.block_size();
  const size_t uT = static_cast<size_t>(T);
  Grow(x_, uT * H);
  Grow(h_, uT * H);
  Grow(q_, uT * nq);
  Grow(k_, uT * nkv);
  Grow(v_, uT * nkv);
  Grow(attn_, uT * nq);
  Grow(proj_, uT * H);
  Grow(gate_, uT * d.local_inter);
  Grow(up_, uT * d.local_inter);
  Grow(norm_w_, static_cast<size_t>(H));

  // Embedding: each rank fills the tokens of its vocabulary slice; the sum
  // over ranks completes every row.
  for (int64_t t = 0; t < T; ++t) {
    const int64_t id = batch.tokens[static_cast<size_t>(t)] - d.vocab_start;
    if (id >= 0 && id < d.local_vocab) {
      LoadRow(embed_, id, x_.data() + t * H);
    } else {
      std::fill(x_.data() + t * H, x_.data() + (t + 1) * H, 0.0f);
    }
  }
  WSUP_RETURN_IF_ERROR(comm.AllReduceSum(x_.data(), uT * H));

  auto norm_rows = [&](const MatrixRef& w, const float* in, float* out, int64_t rows) {
    LoadRow(w, 0, norm_w_.data());
    for (int64_t t = 0; t < rows; ++t) RmsNorm(in + t * H, norm_w_.data(), H, d.eps, out + t * H);
  };

  for (int64_t l = 0; l < d.layers; ++l) {
    const Layer& L = layers_[static_cast<size_t>(l)];
    norm_rows(L.in_norm, x_.data(), h_.data(), T);
    MatMulT(L.q, h_.data(), T, q_.data(), pool_);
    MatMulT(L.k, h_.data(), T, k_.data(), pool_);
    MatMulT(L.v, h_.data(), T, v_.data(), pool_);
    for (int64_t t = 0; t < T; ++t) {
      const int64_t pos = batch.positions[static_cast<size_t>(t)];
      for (int64_t j = 0; j < d.local_heads; ++j) ApplyRope(q_.data() + t * nq + j * hd, hd, pos, inv_freq_.data());
      const std::vector<int32_t>& table = *batch.block_tables[static_cast<size_t>(batch.seq[static_cast<size_t>(t)])];
      const int block = table[static_cast<size_t>(pos / bs)];
      for (int64_t j = 0; j < d.local_kv_heads; ++j) {
        float* kh = k_.data() + t * nkv + j * hd;
        ApplyRope(kh, hd, pos, inv_freq_.data());
        std::memcpy(kv.At(block, l, 0, j) + (pos % bs) * hd, kh, static_cast<size_t>(hd) * sizeof(float));
        std::memcpy(kv.At(block, l, 1, j) + (pos % bs) * hd, v_.data() + t * nkv + j * hd,
                    static_cast<size_t>(hd) * sizeof(float));
      }
    }
    Attention(batch, kv, l, q_.data(), attn_.data());
    MatMulT(L.o, attn_.data(), T, proj_.data(), pool_);
    WSUP_RETURN_IF_ERROR(comm.AllReduceSum(proj_.data(), uT * H));
    for (size_t i = 0; i < uT * H; ++i) x_[i] += proj_[i];

    norm_rows(L.post_norm, x_.data(), h_.data(), T);
    MatMulT(L.gate, h_.data(), T, gate_.data(), pool_);
    MatMulT(L.up, h_.data(), T, up_.data(), pool_);
    for (size_t i = 0; i < uT * static_cast<size_t>(d.local_inter); ++i) gate_[i] = Silu(gate_[i]) * up_[i];
    MatMulT(L.down, gate_.data(), T, proj_.data(), pool_);
    WSUP_RETURN_IF_ERROR(comm.AllReduceSum(proj_.data(), uT * H));
    for (size_t i = 0; i < uT * H; ++i) x_[i] += proj_[i];
  }

  // Logits only for the rows that sample.
  const int64_t R = static_cast<int64_t>(batch.logit_rows.size());
  if (R == 0) {
    logits->clear();
    return Status::Ok();
  }
  Grow(head_in_, static_cast<size_t>(R * H));
  LoadRow(final_norm_, 0, norm_w_.data());
  for (int64_t r = 0; r < R; ++r) {
    const int64_t t = batch.logit_rows[static_cast<size_t>(r)];
    RmsNorm(x_.data() + t * H, norm_w_.data(), H, d.eps, head_in_.data() + r * H);
  }
  const size_t local = static_cast<size_t>(R * d.local_vocab);
  Grow(local_logits_, local);
  MatMulT(lm_head_, head_in_.data(), R, local_logits_.data(), pool_);
  Grow(gathered_, local * static_cast<size_t>(d.tp));
  WSUP_RETURN_IF_ERROR(comm.AllGather(local_logits_.data(), local, gathered_.data()));
  logits->resize(static_cast<size_t>(R * d.vocab));
  for (int rank = 0; rank < d.tp; ++rank) {
    for (int64_t r = 0; r < R; ++r) {
      std::memcpy(logits->data() + r * d.vocab + rank * d.local_vocab,
                  gathered_.data() + rank * local + static_cast<size_t>(r * d.local_vocab),
                  static_cast<size_t>(d.local_vocab) * sizeof(float));
    }
  }
  return Status::Ok();
}

}  // namespace wsup::engine
