// ModelDims from the ModelConfig (config.json, read once by
// checkpoint/model_config.cc): the family by its descriptor, its sizes, and
// this rank's slice (engine/model.h).
#include <algorithm>
#include <cmath>
#include <string>

#include "checkpoint/architecture/architecture.h"
#include "engine/model.h"

namespace wsup::engine {

namespace {

// The mixture-of-experts and MLA sizes of config.json (read once, by
// checkpoint/model_config.cc) into d, with what this engine can compute.
Status ReadFamilyConfig(const ModelConfig& cfg, ModelDims& d) {
  const std::string where = "config.json";
  const std::string fix = "; fix config.json or restore it from the model repository";
  auto needed = [&](int64_t v, const char* key) -> Status {
    if (v > 0) return Status::Ok();
    return Corrupt(where + ": key '" + key + "' is missing (or 0); " + cfg.architecture + " needs it" + fix);
  };
  // Only the default rope: a scaled one (yarn and its mscale) would change
  // the answers, so it is refused rather than ignored.
  if (!cfg.rope_type.empty()) {
    return Refused(where + ": " + cfg.rope_type_key + " is \"" + cfg.rope_type + "\"; the reference engine computes " +
                   cfg.architecture + " with the default rope only: use a checkpoint without rope scaling");
  }
  d.sparse.assign(static_cast<size_t>(std::max<int64_t>(d.layers, 0)), false);
  for (int64_t l = 0; l < d.layers; ++l) d.sparse[static_cast<size_t>(l)] = cfg.IsMoeLayer(l);
  WSUP_RETURN_IF_ERROR(needed(cfg.num_experts_per_tok, "num_experts_per_tok"));
  WSUP_RETURN_IF_ERROR(needed(cfg.moe_intermediate_size, "moe_intermediate_size"));
  d.top_k = cfg.num_experts_per_tok;
  d.moe_inter = cfg.moe_intermediate_size;
  d.norm_topk = cfg.norm_topk_prob.value_or(d.family == Family::kDeepseekV3);
  d.experts = cfg.num_experts;
  if (d.family == Family::kQwen3Moe) {
    if (cfg.experts_key != "num_local_experts" && cfg.experts_key != "num_experts") {
      return Corrupt(where + ": key 'num_experts' (or 'num_local_experts') is missing; " + cfg.architecture + " needs it" + fix);
    }
    d.qk_norm = true;
    d.q_dim = d.v_dim = d.kv_dim = d.head_dim;
  } else {
    if (cfg.experts_key != "n_routed_experts") {
      return Corrupt(where + ": key 'n_routed_experts' is missing; " + cfg.architecture + " needs it" + fix);
    }
    d.n_group = cfg.n_group;
    d.topk_group = cfg.topk_group;
    d.routed_scale = static_cast<float>(cfg.routed_scaling_factor);
    d.shared_inter = cfg.n_shared_experts * d.moe_inter;
    d.sigmoid_router = true;
    d.q_lora_rank = cfg.q_lora_rank;
    d.kv_lora_rank = cfg.kv_lora_rank;
    d.qk_nope = cfg.qk_nope_head_dim;
    d.qk_rope = cfg.qk_rope_head_dim;
    d.v_dim = cfg.v_head_dim;
    d.rope_interleave = cfg.rope_interleave.value_or(true);
    for (auto [v, key] : {std::pair{d.kv_lora_rank, "kv_lora_rank"}, {d.qk_nope, "qk_nope_head_dim"},
                          {d.qk_rope, "qk_rope_head_dim"}, {d.v_dim, "v_head_dim"}}) {
      WSUP_RETURN_IF_ERROR(needed(v, key));
    }
    if (d.qk_rope > 512) return Refused(where + ": qk_rope_head_dim " + std::to_string(d.qk_rope) + " exceeds the 512 the reference engine supports");
    if (d.qk_rope % 2 != 0) return Corrupt(where + ": qk_rope_head_dim " + std::to_string(d.qk_rope) + " is odd; rotary embeddings need it even" + fix);
    // Rope runs over the rope part of each head only; every head has its
    // own k and v (the cache holds them expanded).
    d.head_dim = d.qk_rope;
    d.kv_heads = d.heads;
    d.q_dim = d.qk_nope + d.qk_rope;
    d.kv_dim = std::max(d.q_dim, d.v_dim);
    if (d.experts > 0) {
      if (d.experts % d.n_group != 0 || d.experts / d.n_group < 2) {
        return Corrupt(where + ": n_group " + std::to_string(d.n_group) + " does not split n_routed_experts " +
                       std::to_string(d.experts) + " into groups of at least 2" + fix);
      }
      if (d.topk_group > d.n_group) {
        return Corrupt(where + ": topk_group " + std::to_string(d.topk_group) + " must be between 1 and n_group " +
                       std::to_string(d.n_group) + fix);
      }
      if (d.top_k > d.topk_group * (d.experts / d.n_group)) {
        return Corrupt(where + ": num_experts_per_tok " + std::to_string(d.top_k) + " exceeds the experts of the " +
                       std::to_string(d.topk_group) + " groups kept (topk_group)" + fix);
      }
    }
  }
  const bool any_sparse = std::find(d.sparse.begin(), d.sparse.end(), true) != d.sparse.end();
  if (any_sparse) {
    if (d.experts <= 0 || d.top_k <= 0 || d.top_k > d.experts) {
      return Corrupt(where + ": num_experts_per_tok " + std::to_string(d.top_k) + " must be between 1 and the " +
                     std::to_string(d.experts) + " experts" + fix);
    }
    if (d.moe_inter <= 0) return Corrupt(where + ": moe_intermediate_size is " + std::to_string(d.moe_inter) + "; it must be positive" + fix);
  }
  d.attn_scale = 1.0f / std::sqrt(static_cast<float>(d.q_dim));
  return Status::Ok();
}

}  // namespace

Result<ModelDims> ModelDims::From(const ModelConfig& cfg, int tp, int rank, int ep) {
  const std::string where = "config.json";
  ModelDims d;
  // A config.json without architectures is read as Llama.
  d.arch = FindArchitecture(cfg.architecture.empty() ? "LlamaForCausalLM" : cfg.architecture);
  if (d.arch && d.arch->engine_computes) {
    d.family = d.arch->family;
  } else {
    return Refused(where + ": architecture '" + cfg.architecture +
                   "' is not one the reference engine computes; it serves LlamaForCausalLM (and Mistral), "
                   "Qwen3MoeForCausalLM and DeepseekV3ForCausalLM checkpoints");
  }
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
  WSUP_RETURN_IF_ERROR(positive(d.layers, "num_hidden_layers"));
  WSUP_RETURN_IF_ERROR(positive(d.heads, "num_attention_heads"));
  d.q_dim = d.v_dim = d.kv_dim = d.head_dim;
  if (d.family != Family::kLlama) WSUP_RETURN_IF_ERROR(ReadFamilyConfig(cfg, d));
  d.attn_scale = 1.0f / std::sqrt(static_cast<float>(d.q_dim));
  // A model whose every layer is sparse needs no intermediate_size.
  const bool any_dense = std::find(d.sparse.begin(), d.sparse.end(), false) != d.sparse.end() || d.family == Family::kLlama;
  const bool any_sparse = std::find(d.sparse.begin(), d.sparse.end(), true) != d.sparse.end();
  if (any_dense) WSUP_RETURN_IF_ERROR(positive(d.inter, "intermediate_size"));
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
  if (ep != 1 && ep != tp) {
    return InvalidArgument("expert parallel size " + std::to_string(ep) + " with --tp " + std::to_string(tp) +
                           ": expert parallelism spans the tensor-parallel ranks (ep = tp), so pass --ep-size " +
                           std::to_string(tp) + " (or --expert-parallel), or --ep-size 1");
  }
  if (ep > 1 && !any_sparse) {
    return InvalidArgument("--ep-size " + std::to_string(ep) + ": " + FamilyName(d.family) + " (" +
                           (cfg.architecture.empty() ? std::string("LlamaForCausalLM") : cfg.architecture) +
                           ") has no routed experts to partition; drop --ep-size / --expert-parallel");
  }
  // The sizes that would work, for the refusals below: a tp must cut
  // attention between heads and every split dimension evenly.
  auto sizes_that_divide = [&](const std::vector<int64_t>& dims) {
    std::string out;
    for (int s = 1; s <= 64; ++s) {
      bool ok = true;
      for (int64_t v : dims) ok = ok && v % s == 0;
      if (ok) out += (out.empty() ? "" : ", ") + std::to_string(s);
    }
    return out;
  };
  auto divisible = [&](int64_t v, const char* key) -> Status {
    if (v % tp != 0) {
      return InvalidArgument("--tp " + std::to_string(tp) + " does not divide " + key + " " + std::to_string(v) +
                             "; choose a tp that divides it (" + sizes_that_divide({v}) + ")");
    }
    return Status::Ok();
  };
  WSUP_RETURN_IF_ERROR(divisible(d.heads, "num_attention_heads"));
  if (any_dense && d.inter > 0) WSUP_RETURN_IF_ERROR(divisible(d.inter, "intermediate_size"));
  WSUP_RETURN_IF_ERROR(divisible(d.vocab, "vocab_size"));
  if (any_sparse) {
    if (ep > 1) {
      if (d.experts % ep != 0) {
        return InvalidArgument("expert parallelism at --tp " + std::to_string(tp) + ": num_experts " +
                               std::to_string(d.experts) + " is not divisible by the expert-parallel size " +
                               std::to_string(ep) + ", so the ranks cannot hold equal shares of whole experts; "
                               "choose a tp that divides both num_attention_heads and num_experts (" +
                               sizes_that_divide({d.heads, d.experts, d.vocab}) +
                               "), or drop --expert-parallel to split every expert instead");
      }
    } else if (d.moe_inter % tp != 0) {
      return InvalidArgument("--tp " + std::to_string(tp) + " does not divide moe_intermediate_size " +
                             std::to_string(d.moe_inter) + " (each routed expert's width); choose a tp that divides it (" +
                             sizes_that_divide({d.moe_inter}) + "), or hold whole experts per rank with --expert-parallel");
    }
    if (d.shared_inter % tp != 0) {
      return InvalidArgument("--tp " + std::to_string(tp) + " does not divide the shared experts' width " +
                             std::to_string(d.shared_inter) + " (n_shared_experts x moe_intermediate_size); choose a "
                             "tp that divides it (" + sizes_that_divide({d.shared_inter}) + ")");
    }
  }
  d.tp = tp;
  d.rank = rank;
  d.ep = ep;
  d.local_moe_inter = ep > 1 ? d.moe_inter : d.moe_inter / tp;
  d.local_shared_inter = d.shared_inter / tp;
  d.local_experts = d.experts / ep;
  d.expert_start = ep > 1 ? rank * d.local_experts : 0;
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
  d.local_inter = any_dense && d.inter > 0 ? d.inter / tp : 0;
  d.local_vocab = d.vocab / tp;
  d.vocab_start = rank * d.local_vocab;
  return d;
}

}  // namespace wsup::engine
