// BindWeights (engine/model.h): a rank's tensors found by their family's
// descriptor (checkpoint/architecture/), checked against the shapes it gives
// with this rank's sizes, and viewed as the kernels read them. The CPU model
// and the CUDA rank both bind here.
#include <string>
#include <vector>

#include "checkpoint/architecture/architecture.h"
#include "engine/layout_publish.h"
#include "engine/model.h"

namespace wsup::engine {

namespace {

std::string Shape(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// The descriptor's sizes as this rank holds them (checkpoint/sharding.h
// splits the same dimensions).
Dims LocalDims(const ModelDims& d) {
  Dims x;
  const int64_t nh = d.local_heads;
  x[Dim::kVocab] = d.local_vocab;
  x[Dim::kHidden] = d.hidden;
  x[Dim::kInter] = d.local_inter;
  x[Dim::kHeadDim] = d.head_dim;
  x[Dim::kHalfHeadDim] = d.head_dim / 2;
  x[Dim::kQRows] = nh * d.head_dim;
  x[Dim::kKvRows] = d.local_kv_heads * d.head_dim;
  x[Dim::kQLora] = d.q_lora_rank;
  x[Dim::kKvLora] = d.kv_lora_rank;
  x[Dim::kKvAOut] = d.kv_lora_rank + d.qk_rope;
  x[Dim::kMlaQRows] = nh * d.q_dim;
  x[Dim::kMlaKvRows] = nh * (d.qk_nope + d.v_dim);
  x[Dim::kMlaVCols] = nh * d.v_dim;
  x[Dim::kExperts] = d.experts;
  x[Dim::kMoeInter] = d.local_moe_inter;
  x[Dim::kSharedInter] = d.local_shared_inter;
  return x;
}

}  // namespace

Result<ModelWeights> BindWeights(const ModelDims& d, const WeightSource& w, std::vector<std::string>* bound) {
  if (!d.arch) return Internal("weights: ModelDims without an architecture; make them with ModelDims::From");
  const Architecture& arch = *d.arch;
  const Dims local = LocalDims(d);
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
    if (bound) bound->push_back(name);
    return Status::Ok();
  };
  // A tensor of the family's descriptor, in layer `l` (expert `e`), with
  // this rank's shape.
  auto bind = [&](TensorId id, int64_t l, int64_t e, MatrixRef* out) -> Status {
    WSUP_ASSIGN_OR_RETURN(const std::string name, arch.Name(id, l, e));
    return get(name, ShapeOf(*arch.Find(id), local), out);
  };

  const int64_t H = d.hidden;
  WSUP_RETURN_IF_ERROR(bind(TensorId::kEmbed, -1, -1, &m->embed));
  WSUP_RETURN_IF_ERROR(bind(TensorId::kFinalNorm, -1, -1, &m->final_norm));
  WSUP_ASSIGN_OR_RETURN(const std::string lm_head, arch.Name(TensorId::kLmHead));
  if (w.Find(lm_head)) {
    WSUP_RETURN_IF_ERROR(bind(TensorId::kLmHead, -1, -1, &m->lm_head));
  } else if (d.tied) {
    m->lm_head = m->embed;
  } else {
    return NotFound("weights: tensor '" + lm_head + "' is missing and config.json says tie_word_embeddings is false; "
                    "restore the tensor or the matching config.json");
  }
  for (int64_t l = 0; l < d.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    // Tensors the descriptor lists as refused: the engine computes no
    // projection biases.
    for (const TensorRule& r : arch.tensors) {
      if (r.use != Use::kRefused) continue;
      WSUP_ASSIGN_OR_RETURN(const std::string name, arch.Name(r.id, l));
      if (w.Find(name)) {
        return Refused("weights: '" + p + "' has projection biases; the reference engine serves models "
                       "without biases (attention_bias and mlp_bias false)");
      }
    }
    LayerWeights L;
    WSUP_RETURN_IF_ERROR(bind(TensorId::kInputNorm, l, -1, &L.in_norm));
    WSUP_RETURN_IF_ERROR(bind(TensorId::kPostAttentionNorm, l, -1, &L.post_norm));
    if (d.family == Family::kDeepseekV3) {
      if (d.q_lora_rank > 0) {
        WSUP_RETURN_IF_ERROR(bind(TensorId::kQA, l, -1, &L.q_a));
        WSUP_RETURN_IF_ERROR(bind(TensorId::kQANorm, l, -1, &L.q_a_norm));
        WSUP_RETURN_IF_ERROR(bind(TensorId::kQB, l, -1, &L.q_b));
      } else {
        WSUP_RETURN_IF_ERROR(bind(TensorId::kQ, l, -1, &L.q));
      }
      WSUP_RETURN_IF_ERROR(bind(TensorId::kKvA, l, -1, &L.kv_a));
      WSUP_RETURN_IF_ERROR(bind(TensorId::kKvANorm, l, -1, &L.kv_a_norm));
      WSUP_RETURN_IF_ERROR(bind(TensorId::kKvB, l, -1, &L.kv_b));
      WSUP_RETURN_IF_ERROR(bind(TensorId::kO, l, -1, &L.o));
    } else {
      WSUP_RETURN_IF_ERROR(bind(TensorId::kQ, l, -1, &L.q));
      WSUP_RETURN_IF_ERROR(bind(TensorId::kK, l, -1, &L.k));
      WSUP_RETURN_IF_ERROR(bind(TensorId::kV, l, -1, &L.v));
      WSUP_RETURN_IF_ERROR(bind(TensorId::kO, l, -1, &L.o));
      if (d.qk_norm) {
        WSUP_RETURN_IF_ERROR(bind(TensorId::kQNorm, l, -1, &L.q_norm));
        WSUP_RETURN_IF_ERROR(bind(TensorId::kKNorm, l, -1, &L.k_norm));
      }
    }
    if (!d.sparse.empty() && d.sparse[static_cast<size_t>(l)]) {
      L.moe = true;
      WSUP_ASSIGN_OR_RETURN(const std::string router, arch.Name(TensorId::kRouter, l));
      const WeightTensor* rt = w.Find(router);
      if (rt && rt->shape != std::vector<int64_t>{d.experts, H}) {
        return Corrupt("weights: router '" + router + "' has shape " + Shape(rt->shape) + " but config.json implies " +
                       Shape({d.experts, H}) + " (one row of hidden_size " + std::to_string(H) + " per expert, " +
                       std::to_string(d.experts) + " experts); the config and the weights belong to different "
                       "models: restore the matching files");
      }
      WSUP_RETURN_IF_ERROR(bind(TensorId::kRouter, l, -1, &L.router));
      if (d.sigmoid_router) {
        WSUP_ASSIGN_OR_RETURN(const std::string bias, arch.Name(TensorId::kRouterBias, l));
        if (!w.Find(bias)) {
          return NotFound("weights: tensor '" + bias + "' is missing" + rank_note + "; DeepSeek-V3 chooses experts with it (" +
                          std::to_string(d.experts) + " values, one per expert): the checkpoint is incomplete, "
                          "re-download it");
        }
        WSUP_RETURN_IF_ERROR(bind(TensorId::kRouterBias, l, -1, &L.router_bias));
      }
      if (w.Find(p + "mlp.experts.gate_up_proj") || w.Find(p + "mlp.experts.gate_up_proj.weight")) {
        return Refused("weights: '" + p + "mlp.experts' holds fused experts (gate_up_proj); the reference engine "
                       "reads one gate_proj, up_proj and down_proj per expert, as checkpoints store them: "
                       "use the checkpoint's own files");
      }
      for (int64_t e = d.expert_start; e < d.expert_start + d.local_experts; ++e) {
        ExpertWeights E;
        WSUP_RETURN_IF_ERROR(bind(TensorId::kExpertGate, l, e, &E.gate));
        WSUP_RETURN_IF_ERROR(bind(TensorId::kExpertUp, l, e, &E.up));
        WSUP_RETURN_IF_ERROR(bind(TensorId::kExpertDown, l, e, &E.down));
        L.experts.push_back(E);
      }
      WSUP_ASSIGN_OR_RETURN(const std::string extra, arch.Name(TensorId::kExpertGate, l, d.experts));
      if (w.Find(extra)) {
        return Corrupt("weights: '" + extra + "' exists but config.json says " + std::to_string(d.experts) +
                       " experts; the config and the weights belong to different models: restore the matching files");
      }
      if (d.shared_inter > 0) {
        WSUP_RETURN_IF_ERROR(bind(TensorId::kSharedGate, l, -1, &L.shared.gate));
        WSUP_RETURN_IF_ERROR(bind(TensorId::kSharedUp, l, -1, &L.shared.up));
        WSUP_RETURN_IF_ERROR(bind(TensorId::kSharedDown, l, -1, &L.shared.down));
      }
      m->layers.push_back(L);
      continue;
    }
    WSUP_ASSIGN_OR_RETURN(const std::string gate, arch.Name(TensorId::kGate, l));
    WSUP_ASSIGN_OR_RETURN(const std::string up, arch.Name(TensorId::kUp, l));
    const std::string fused = FusedGateUpName(gate);
    if (w.Find(fused)) {
      // The engine's own layout (engine/layout_publish.h): gate rows, then
      // up rows, in one matrix; each is a view of its half.
      if (w.Find(gate) || w.Find(up)) {
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
      WSUP_RETURN_IF_ERROR(bind(TensorId::kGate, l, -1, &L.gate));
      WSUP_RETURN_IF_ERROR(bind(TensorId::kUp, l, -1, &L.up));
    }
    WSUP_RETURN_IF_ERROR(bind(TensorId::kDown, l, -1, &L.down));
    m->layers.push_back(L);
  }
  return mw;
}


}  // namespace wsup::engine
