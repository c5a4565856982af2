// Binding a rank's weights (names, local shapes, dtypes, FP8 block
// scales) and its CPU KV cache (engine/model.h).
#include <algorithm>
#include <string>

#include "engine/model.h"

namespace wsup::engine {

namespace {

std::string Shape(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

}  // namespace

uint64_t KvStorage::BlockBytes(const ModelDims& d, int block_size) {
  return static_cast<uint64_t>(d.layers) * 2 * static_cast<uint64_t>(d.local_kv_heads) *
         static_cast<uint64_t>(block_size) * static_cast<uint64_t>(d.kv_dim) * sizeof(float);
}

Status KvStorage::Allocate(const ModelDims& d, const KvLayout& layout) {
  if (layout.id_count() <= 0 || layout.block_size <= 0) return InvalidArgument("KV cache: no blocks to allocate");
  layers_ = static_cast<size_t>(d.layers);
  heads_ = static_cast<size_t>(d.local_kv_heads);
  head_dim_ = static_cast<size_t>(d.kv_dim);
  block_size_ = layout.block_size;
  data_ = nullptr;
  mem_.reset();
  WSUP_ASSIGN_OR_RETURN(mem_, KvMemory::CreateHost(layout));
  data_ = reinterpret_cast<float*>(mem_->base());
  return Status::Ok();
}

Result<ModelWeights> BindWeights(const ModelDims& d, const WeightSource& w) {
  ModelWeights mw;
  ModelWeights* m = &mw;
  const std::string rank_note = d.tp > 1 ? " (rank " + std::to_string(d.rank) + " of " + std::to_string(d.tp) + ")" : "";

  auto get = [&](const std::string& name, std::vector<int64_t> shape, MatrixRef* out) -> Status {
    const WeightTensor* t = w.Find(name);
    if (!t) {
      return NotFound("weights: tensor '" + name + "' is missing" + rank_note +
                      "; the checkpoint is incomplete or not a " + FamilyName(d.family) +
                      " model (config.json says " + (d.family == Family::kLlama ? "Llama" : FamilyName(d.family)) +
                      "): re-download it");
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
      return Refused("weights: '" + p + "' has projection biases; the reference engine serves models "
                     "without biases (attention_bias and mlp_bias false)");
    }
    LayerWeights L;
    WSUP_RETURN_IF_ERROR(get(p + "input_layernorm.weight", {H}, &L.in_norm));
    WSUP_RETURN_IF_ERROR(get(p + "post_attention_layernorm.weight", {H}, &L.post_norm));
    if (d.family == Family::kDeepseekV3) {
      const std::string a = p + "self_attn.";
      const int64_t nh = d.local_heads;
      if (d.q_lora_rank > 0) {
        WSUP_RETURN_IF_ERROR(get(a + "q_a_proj.weight", {d.q_lora_rank, H}, &L.q_a));
        WSUP_RETURN_IF_ERROR(get(a + "q_a_layernorm.weight", {d.q_lora_rank}, &L.q_a_norm));
        WSUP_RETURN_IF_ERROR(get(a + "q_b_proj.weight", {nh * d.q_dim, d.q_lora_rank}, &L.q_b));
      } else {
        WSUP_RETURN_IF_ERROR(get(a + "q_proj.weight", {nh * d.q_dim, H}, &L.q));
      }
      WSUP_RETURN_IF_ERROR(get(a + "kv_a_proj_with_mqa.weight", {d.kv_lora_rank + d.qk_rope, H}, &L.kv_a));
      WSUP_RETURN_IF_ERROR(get(a + "kv_a_layernorm.weight", {d.kv_lora_rank}, &L.kv_a_norm));
      WSUP_RETURN_IF_ERROR(get(a + "kv_b_proj.weight", {nh * (d.qk_nope + d.v_dim), d.kv_lora_rank}, &L.kv_b));
      WSUP_RETURN_IF_ERROR(get(a + "o_proj.weight", {H, nh * d.v_dim}, &L.o));
    } else {
      WSUP_RETURN_IF_ERROR(get(p + "self_attn.q_proj.weight", {d.local_heads * hd, H}, &L.q));
      WSUP_RETURN_IF_ERROR(get(p + "self_attn.k_proj.weight", {d.local_kv_heads * hd, H}, &L.k));
      WSUP_RETURN_IF_ERROR(get(p + "self_attn.v_proj.weight", {d.local_kv_heads * hd, H}, &L.v));
      WSUP_RETURN_IF_ERROR(get(p + "self_attn.o_proj.weight", {H, d.local_heads * hd}, &L.o));
      if (d.qk_norm) {
        WSUP_RETURN_IF_ERROR(get(p + "self_attn.q_norm.weight", {hd}, &L.q_norm));
        WSUP_RETURN_IF_ERROR(get(p + "self_attn.k_norm.weight", {hd}, &L.k_norm));
      }
    }
    if (!d.sparse.empty() && d.sparse[static_cast<size_t>(l)]) {
      L.moe = true;
      const std::string router = p + "mlp.gate.weight";
      const WeightTensor* rt = w.Find(router);
      if (rt && rt->shape != std::vector<int64_t>{d.experts, H}) {
        return Corrupt("weights: router '" + router + "' has shape " + Shape(rt->shape) + " but config.json implies " +
                       Shape({d.experts, H}) + " (one row of hidden_size " + std::to_string(H) + " per expert, " +
                       std::to_string(d.experts) + " experts); the config and the weights belong to different "
                       "models: restore the matching files");
      }
      WSUP_RETURN_IF_ERROR(get(router, {d.experts, H}, &L.router));
      if (d.sigmoid_router) {
        const std::string bias = p + "mlp.gate.e_score_correction_bias";
        if (!w.Find(bias)) {
          return NotFound("weights: tensor '" + bias + "' is missing" + rank_note + "; DeepSeek-V3 chooses experts with it (" +
                          std::to_string(d.experts) + " values, one per expert): the checkpoint is incomplete, "
                          "re-download it");
        }
        WSUP_RETURN_IF_ERROR(get(bias, {d.experts}, &L.router_bias));
      }
      if (w.Find(p + "mlp.experts.gate_up_proj") || w.Find(p + "mlp.experts.gate_up_proj.weight")) {
        return Refused("weights: '" + p + "mlp.experts' holds fused experts (gate_up_proj); the reference engine "
                       "reads one gate_proj, up_proj and down_proj per expert, as checkpoints store them: "
                       "use the checkpoint's own files");
      }
      for (int64_t e = d.expert_start; e < d.expert_start + d.local_experts; ++e) {
        const std::string ep = p + "mlp.experts." + std::to_string(e) + ".";
        ExpertWeights E;
        WSUP_RETURN_IF_ERROR(get(ep + "gate_proj.weight", {d.local_moe_inter, H}, &E.gate));
        WSUP_RETURN_IF_ERROR(get(ep + "up_proj.weight", {d.local_moe_inter, H}, &E.up));
        WSUP_RETURN_IF_ERROR(get(ep + "down_proj.weight", {H, d.local_moe_inter}, &E.down));
        L.experts.push_back(E);
      }
      const std::string extra = p + "mlp.experts." + std::to_string(d.experts) + ".gate_proj.weight";
      if (w.Find(extra)) {
        return Corrupt("weights: '" + extra + "' exists but config.json says " + std::to_string(d.experts) +
                       " experts; the config and the weights belong to different models: restore the matching files");
      }
      if (d.shared_inter > 0) {
        const std::string sp = p + "mlp.shared_experts.";
        WSUP_RETURN_IF_ERROR(get(sp + "gate_proj.weight", {d.local_shared_inter, H}, &L.shared.gate));
        WSUP_RETURN_IF_ERROR(get(sp + "up_proj.weight", {d.local_shared_inter, H}, &L.shared.up));
        WSUP_RETURN_IF_ERROR(get(sp + "down_proj.weight", {H, d.local_shared_inter}, &L.shared.down));
      }
      m->layers.push_back(L);
      continue;
    }
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

}  // namespace wsup::engine
