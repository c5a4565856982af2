// RankModel's forward pass (engine/model.h): attention over the paged KV
// cache, the MLP or the experts, layer by layer, and the gathered logits.
// ModelDims from config.json is model_config.cc; binding the weights and
// the CPU KV cache, model_weights.cc.
#include "engine/model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

namespace wsup::engine {

namespace {

template <typename T>
void Grow(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
}

}  // namespace

void RankModel::Attention(const StepBatch& batch, KvStorage& kv, int64_t layer, const float* q, float* out) {
  const ModelDims& d = dims_;
  const int64_t T = static_cast<int64_t>(batch.tokens.size());
  // q and k are q_dim wide, v v_dim; a cached slot is kv_dim floats.
  const int64_t qd = d.q_dim, vd = d.v_dim, sd = d.kv_dim;
  const int64_t nq = d.local_heads * qd, nv = d.local_heads * vd;
  const int64_t group = d.heads / d.kv_heads;
  const int bs = kv.block_size();
  const float scale = d.attn_scale;
  pool_.ParallelFor(T * d.local_heads, [&](int64_t task) {
    thread_local std::vector<float> scores;
    const int64_t t = task / d.local_heads, j = task % d.local_heads;
    const int64_t kvh = (d.head_start + j) / group - d.kv_head_start;
    const int64_t pos = batch.positions[static_cast<size_t>(t)];
    const std::vector<int32_t>& table = *batch.block_tables[static_cast<size_t>(batch.seq[static_cast<size_t>(t)])];
    const float* qh = q + t * nq + j * qd;
    if (static_cast<int64_t>(scores.size()) < pos + 1) scores.resize(static_cast<size_t>(pos + 1));
    float mx = -INFINITY;
    for (int64_t p = 0; p <= pos; ++p) {
      const float* kp = kv.At(table[static_cast<size_t>(p / bs)], layer, 0, kvh) + (p % bs) * sd;
      const float s = Dot(qh, kp, qd) * scale;
      scores[static_cast<size_t>(p)] = s;
      mx = std::max(mx, s);
    }
    float sum = 0;
    for (int64_t p = 0; p <= pos; ++p) {
      const float e = std::exp(scores[static_cast<size_t>(p)] - mx);
      scores[static_cast<size_t>(p)] = e;
      sum += e;
    }
    float* o = out + t * nv + j * vd;
    std::fill(o, o + vd, 0.0f);
    const float inv = 1.0f / sum;
    for (int64_t p = 0; p <= pos; ++p) {
      const float* vp = kv.At(table[static_cast<size_t>(p / bs)], layer, 1, kvh) + (p % bs) * sd;
      const float a = scores[static_cast<size_t>(p)] * inv;
      for (int64_t i = 0; i < vd; ++i) o[i] += a * vp[i];
    }
  });
}

void RankModel::GqaProjections(const StepBatch& batch, KvStorage& kv, int64_t l, const Layer& L) {
  const ModelDims& d = dims_;
  const int64_t T = static_cast<int64_t>(batch.tokens.size());
  const int64_t hd = d.head_dim, nq = d.local_heads * hd, nkv = d.local_kv_heads * hd;
  const int bs = kv.block_size();
  MatMulT(L.q, h_.data(), T, q_.data(), pool_);
  MatMulT(L.k, h_.data(), T, k_.data(), pool_);
  MatMulT(L.v, h_.data(), T, v_.data(), pool_);
  // Qwen3: each head's q and k RMS-normalised over head_dim before rope.
  float* qn = nullptr;
  float* kn = nullptr;
  if (d.qk_norm) {
    Grow(qk_norm_w_, static_cast<size_t>(2 * hd));
    qn = qk_norm_w_.data();
    kn = qn + hd;
    LoadRow(L.q_norm, 0, qn);
    LoadRow(L.k_norm, 0, kn);
  }
  for (int64_t t = 0; t < T; ++t) {
    const int64_t pos = batch.positions[static_cast<size_t>(t)];
    for (int64_t j = 0; j < d.local_heads; ++j) {
      float* qh = q_.data() + t * nq + j * hd;
      if (qn) RmsNorm(qh, qn, hd, d.eps, qh);
      ApplyRope(qh, hd, pos, inv_freq_.data());
    }
    const std::vector<int32_t>& table = *batch.block_tables[static_cast<size_t>(batch.seq[static_cast<size_t>(t)])];
    const int block = table[static_cast<size_t>(pos / bs)];
    for (int64_t j = 0; j < d.local_kv_heads; ++j) {
      float* kh = k_.data() + t * nkv + j * hd;
      if (kn) RmsNorm(kh, kn, hd, d.eps, kh);
      ApplyRope(kh, hd, pos, inv_freq_.data());
      std::memcpy(kv.At(block, l, 0, j) + (pos % bs) * hd, kh, static_cast<size_t>(hd) * sizeof(float));
      std::memcpy(kv.At(block, l, 1, j) + (pos % bs) * hd, v_.data() + t * nkv + j * hd,
                  static_cast<size_t>(hd) * sizeof(float));
    }
  }
}

namespace {

// transformers' apply_rotary_pos_emb_interleave: the rope part's pairs are
// (2i, 2i+1); it regroups them as (evens, odds) and then rotates as
// rotate_half does. q and k are regrouped alike, so their dot product is
// that of the interleaved rotation.
void RopeInterleaved(float* x, int64_t n, int64_t pos, const float* inv_freq, bool interleave) {
  if (interleave) {
    float tmp[512];
    const int64_t half = n / 2;
    for (int64_t i = 0; i < half; ++i) {
      tmp[i] = x[2 * i];
      tmp[half + i] = x[2 * i + 1];
    }
    std::memcpy(x, tmp, static_cast<size_t>(n) * sizeof(float));
  }
  ApplyRope(x, n, pos, inv_freq);
}

}  // namespace

void RankModel::MlaProjections(const StepBatch& batch, KvStorage& kv, int64_t l, const Layer& L) {
  const ModelDims& d = dims_;
  const int64_t T = static_cast<int64_t>(batch.tokens.size());
  const size_t uT = static_cast<size_t>(T);
  const int64_t nh = d.local_heads, qd = d.q_dim, nq = nh * qd;
  const int64_t rank = d.kv_lora_rank, rope = d.qk_rope, nope = d.qk_nope;
  const int64_t kva = rank + rope, kvb = nh * (nope + d.v_dim);
  const int bs = kv.block_size();
  // q = q_b_proj(q_a_layernorm(q_a_proj(h))), or q_proj(h).
  if (d.q_lora_rank > 0) {
    Grow(lat_, uT * static_cast<size_t>(std::max(d.q_lora_rank, kva)));
    Grow(lat_norm_, uT * static_cast<size_t>(std::max(d.q_lora_rank, rank)));
    Grow(qk_norm_w_, static_cast<size_t>(std::max(d.q_lora_rank, rank)));
    MatMulT(L.q_a, h_.data(), T, lat_.data(), pool_);
    LoadRow(L.q_a_norm, 0, qk_norm_w_.data());
    for (int64_t t = 0; t < T; ++t) {
      RmsNorm(lat_.data() + t * d.q_lora_rank, qk_norm_w_.data(), d.q_lora_rank, d.latent_eps,
              lat_norm_.data() + t * d.q_lora_rank);
    }
    MatMulT(L.q_b, lat_norm_.data(), T, q_.data(), pool_);
  } else {
    MatMulT(L.q, h_.data(), T, q_.data(), pool_);
  }
  // The compressed kv and the shared rope key, then the per-head k_nope and v.
  Grow(lat_, uT * static_cast<size_t>(kva));
  Grow(lat_norm_, uT * static_cast<size_t>(rank));
  Grow(qk_norm_w_, static_cast<size_t>(rank));
  Grow(v_, uT * static_cast<size_t>(kvb));
  MatMulT(L.kv_a, h_.data(), T, lat_.data(), pool_);
  LoadRow(L.kv_a_norm, 0, qk_norm_w_.data());
  for (int64_t t = 0; t < T; ++t) {
    RmsNorm(lat_.data() + t * kva, qk_norm_w_.data(), rank, d.latent_eps, lat_norm_.data() + t * rank);
  }
  MatMulT(L.kv_b, lat_norm_.data(), T, v_.data(), pool_);
  for (int64_t t = 0; t < T; ++t) {
    const int64_t pos = batch.positions[static_cast<size_t>(t)];
    float* k_rot = lat_.data() + t * kva + rank;
    RopeInterleaved(k_rot, rope, pos, inv_freq_.data(), d.rope_interleave);
    const std::vector<int32_t>& table = *batch.block_tables[static_cast<size_t>(batch.seq[static_cast<size_t>(t)])];
    const int block = table[static_cast<size_t>(pos / bs)];
    for (int64_t j = 0; j < nh; ++j) {
      RopeInterleaved(q_.data() + t * nq + j * qd + nope, rope, pos, inv_freq_.data(), d.rope_interleave);
      const float* kvh = v_.data() + t * kvb + j * (nope + d.v_dim);
      float* kslot = kv.At(block, l, 0, j) + (pos % bs) * d.kv_dim;
      std::memcpy(kslot, kvh, static_cast<size_t>(nope) * sizeof(float));
      std::memcpy(kslot + nope, k_rot, static_cast<size_t>(rope) * sizeof(float));
      std::memcpy(kv.At(block, l, 1, j) + (pos % bs) * d.kv_dim, kvh + nope, static_cast<size_t>(d.v_dim) * sizeof(float));
    }
  }
}

void RankModel::DenseMlp(const ExpertWeights& w, int64_t inter, const float* in, int64_t rows, float* out) {
  const size_t n = static_cast<size_t>(rows * inter);
  Grow(gate_, n);
  Grow(up_, n);
  MatMulT(w.gate, in, rows, gate_.data(), pool_);
  MatMulT(w.up, in, rows, up_.data(), pool_);
  for (size_t i = 0; i < n; ++i) gate_[i] = Silu(gate_[i]) * up_[i];
  MatMulT(w.down, gate_.data(), rows, out, pool_);
}

void RankModel::Experts(const Layer& L, int64_t T) {
  const ModelDims& d = dims_;
  const int64_t H = d.hidden, E = d.experts, K = d.top_k;
  const size_t uT = static_cast<size_t>(T);
  Grow(router_logits_, uT * static_cast<size_t>(E));
  MatMulT(L.router, h_.data(), T, router_logits_.data(), pool_);
  std::vector<float> bias;
  if (d.sigmoid_router) {
    bias.resize(static_cast<size_t>(E));
    LoadRow(L.router_bias, 0, bias.data());
  }
  // Each token's chosen experts and weights, as transformers routes them;
  // ties go to the lower expert id.
  std::vector<std::vector<std::pair<int64_t, float>>> by_expert(static_cast<size_t>(E));
  std::vector<int64_t> idx(static_cast<size_t>(E));
  std::vector<float> prob(static_cast<size_t>(E)), choice(static_cast<size_t>(E));
  auto top = [&](const std::vector<float>& v, int64_t k) {
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) { return v[static_cast<size_t>(a)] > v[static_cast<size_t>(b)]; });
    return std::vector<int64_t>(idx.begin(), idx.begin() + k);
  };
  for (int64_t t = 0; t < T; ++t) {
    const float* lg = router_logits_.data() + t * E;
    std::vector<int64_t> chosen;
    if (!d.sigmoid_router) {
      // Qwen3-MoE: softmax over all experts, top-k, renormalised.
      float mx = -INFINITY;
      for (int64_t e = 0; e < E; ++e) mx = std::max(mx, lg[e]);
      float sum = 0;
      for (int64_t e = 0; e < E; ++e) sum += (prob[static_cast<size_t>(e)] = std::exp(lg[e] - mx));
      for (int64_t e = 0; e < E; ++e) prob[static_cast<size_t>(e)] /= sum;
      chosen = top(prob, K);
    } else {
      // DeepSeek-V3: sigmoid scores; the bias only chooses. Groups ranked
      // by the sum of their two best biased scores, topk_group kept, the
      // rest masked to 0, then top-k.
      for (int64_t e = 0; e < E; ++e) {
        prob[static_cast<size_t>(e)] = 1.0f / (1.0f + std::exp(-lg[e]));
        choice[static_cast<size_t>(e)] = prob[static_cast<size_t>(e)] + bias[static_cast<size_t>(e)];
      }
      const int64_t G = d.n_group, per = E / G;
      std::vector<float> gscore(static_cast<size_t>(G));
      for (int64_t g = 0; g < G; ++g) {
        float b1 = -INFINITY, b2 = -INFINITY;
        for (int64_t e = g * per; e < (g + 1) * per; ++e) {
          const float c = choice[static_cast<size_t>(e)];
          if (c > b1) {
            b2 = b1;
            b1 = c;
          } else if (c > b2) {
            b2 = c;
          }
        }
        gscore[static_cast<size_t>(g)] = b1 + b2;
      }
      std::vector<int64_t> gidx(static_cast<size_t>(G));
      std::iota(gidx.begin(), gidx.end(), 0);
      std::stable_sort(gidx.begin(), gidx.end(), [&](int64_t a, int64_t b) { return gscore[static_cast<size_t>(a)] > gscore[static_cast<size_t>(b)]; });
      std::vector<bool> keep(static_cast<size_t>(G), false);
      for (int64_t i = 0; i < d.topk_group; ++i) keep[static_cast<size_t>(gidx[static_cast<size_t>(i)])] = true;
      for (int64_t e = 0; e < E; ++e) {
        if (!keep[static_cast<size_t>(e / per)]) choice[static_cast<size_t>(e)] = 0.0f;
      }
      chosen = top(choice, K);
    }
    float wsum = 0;
    for (int64_t e : chosen) wsum += prob[static_cast<size_t>(e)];
    if (d.sigmoid_router) wsum += 1e-20f;
    for (int64_t e : chosen) {
      float w = prob[static_cast<size_t>(e)];
      if (d.norm_topk) w /= wsum;
      w *= d.routed_scale;
      by_expert[static_cast<size_t>(e)].push_back({t, w});
    }
  }
  // This rank's experts in id order, each over the tokens it was given,
  // summed into proj_ as transformers' index_add does; then the shared
  // experts. With tp > 1 this is the rank's part: the all-reduce after the
  // MLP adds the others' (their experts, or their slice of every expert).
  std::fill(proj_.begin(), proj_.begin() + static_cast<std::ptrdiff_t>(uT * H), 0.0f);
  for (int64_t e = d.expert_start; e < d.expert_start + d.local_experts; ++e) {
    const auto& toks = by_expert[static_cast<size_t>(e)];
    if (toks.empty()) continue;
    const int64_t n = static_cast<int64_t>(toks.size());
    Grow(expert_in_, static_cast<size_t>(n * H));
    Grow(expert_out_, static_cast<size_t>(n * H));
    for (int64_t i = 0; i < n; ++i) {
      std::memcpy(expert_in_.data() + i * H, h_.data() + toks[static_cast<size_t>(i)].first * H,
                  static_cast<size_t>(H) * sizeof(float));
    }
    DenseMlp(L.experts[static_cast<size_t>(e - d.expert_start)], d.local_moe_inter, expert_in_.data(), n,
             expert_out_.data());
    for (int64_t i = 0; i < n; ++i) {
      const auto [t, w] = toks[static_cast<size_t>(i)];
      float* dst = proj_.data() + t * H;
      const float* src = expert_out_.data() + i * H;
      for (int64_t c = 0; c < H; ++c) dst[c] += src[c] * w;
    }
  }
  if (d.shared_inter > 0) {
    Grow(expert_out_, uT * H);
    DenseMlp(L.shared, d.local_shared_inter, h_.data(), T, expert_out_.data());
    for (size_t i = 0; i < uT * H; ++i) proj_[i] += expert_out_[i];
  }
}

Status RankModel::Forward(const StepBatch& batch, KvStorage& kv, Communicator& comm, std::vector<float>* logits) {
  const ModelDims& d = dims_;
  const int64_t T = static_cast<int64_t>(batch.tokens.size());
  const int64_t H = d.hidden;
  const int64_t nq = d.local_heads * d.q_dim, nkv = d.local_kv_heads * d.head_dim;
  const size_t uT = static_cast<size_t>(T);
  Grow(x_, uT * H);
  Grow(h_, uT * H);
  Grow(q_, uT * nq);
  Grow(k_, uT * nkv);
  Grow(v_, uT * nkv);
  Grow(attn_, uT * d.local_heads * d.v_dim);
  Grow(proj_, uT * H);
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
    if (d.family == Family::kDeepseekV3) {
      MlaProjections(batch, kv, l, L);
    } else {
      GqaProjections(batch, kv, l, L);
    }
    Attention(batch, kv, l, q_.data(), attn_.data());
    MatMulT(L.o, attn_.data(), T, proj_.data(), pool_);
    WSUP_RETURN_IF_ERROR(comm.AllReduceSum(proj_.data(), uT * H));
    for (size_t i = 0; i < uT * H; ++i) x_[i] += proj_[i];

    norm_rows(L.post_norm, x_.data(), h_.data(), T);
    if (L.moe) {
      Experts(L, T);
    } else {
      DenseMlp(ExpertWeights{L.gate, L.up, L.down}, d.local_inter, h_.data(), T, proj_.data());
    }
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
