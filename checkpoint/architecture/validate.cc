// ValidateArchitecture: a mixture-of-experts checkpoint checked against its
// config.json before anything is planned, so that a missing or misshapen
// expert is an error naming it rather than a slice that does not fit, or an
// engine that fails much later. The names and shapes come from the
// family's descriptor.
#include "checkpoint/architecture/architecture.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/json_text.h"

namespace wsup {

namespace {

using checkpoint_text::QuoteTensor;

std::string ShapeStr(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

Status ValidateArchitecture(const Checkpoint& ckpt, const Architecture& arch) {
  if (!arch.moe) return Status::Ok();
  const ModelConfig& c = ckpt.config();
  const std::string& dir = ckpt.dir();
  const std::string redownload = "; the checkpoint is incomplete or damaged: re-download it";
  const std::string mismatch =
      "; the config and the weights belong to different models: restore the matching "
      "config.json";
  if (c.num_experts <= 0) {
    return Corrupt(dir + ": config.json names " + c.architecture +
                   ", a mixture-of-experts model, but has no expert count (num_experts, num_local_experts or "
                   "n_routed_experts)" +
                   mismatch);
  }
  const Dims dims = Dims::Global(c);
  const int64_t experts = dims[Dim::kExperts];
  const int64_t inter = dims[Dim::kMoeInter];
  if (inter <= 0) {
    return Corrupt(dir + ": config.json has no moe_intermediate_size, the width of each expert" + mismatch);
  }
  // Packed formats (int4 and the like) store other shapes than the matrix's.
  const bool check_shapes = c.quant.method == "none" || c.quant.method == "fp8";

  for (const TensorInfo& t : ckpt.tensors()) {
    int64_t layer = -1, e = -1;
    // Not a per-expert name (a fused layout): no rule matches it when split.
    if (!RoutedExpertOf(arch, t.name, &layer, &e)) continue;
    if (e >= experts) {
      return Corrupt(dir + ": tensor " + QuoteTensor(t.name) + " belongs to expert " + std::to_string(e) +
                     ", but config.json has " + std::to_string(experts) + " experts (0 to " +
                     std::to_string(experts - 1) + ")" + mismatch);
    }
    if (layer < c.num_hidden_layers && !c.IsMoeLayer(layer)) {
      return Corrupt(dir + ": tensor " + QuoteTensor(t.name) +
                     " is a routed expert, but config.json makes layer " + std::to_string(layer) +
                     " dense (first_k_dense_replace, moe_layer_freq, decoder_sparse_step, mlp_only_layers)" +
                     mismatch);
    }
  }

  const TensorRule* router_rule = arch.Find(TensorId::kRouter);
  const TensorRule* bias_rule = arch.score_bias ? arch.Find(TensorId::kRouterBias) : nullptr;
  for (int64_t layer = 0; layer < c.num_hidden_layers; ++layer) {
    if (!c.IsMoeLayer(layer)) continue;
    if (router_rule) {
      WSUP_ASSIGN_OR_RETURN(const std::string router_name, arch.Name(TensorId::kRouter, layer));
      const TensorInfo* router = ckpt.Find(router_name);
      if (!router) {
        return Corrupt(dir + ": layer " + std::to_string(layer) +
                       " is sparse by config.json but has no router " + QuoteTensor(router_name) +
                       redownload);
      }
      const std::vector<int64_t> router_shape = ShapeOf(*router_rule, dims);
      if (check_shapes && router->shape != router_shape) {
        return Corrupt(dir + ": router " + QuoteTensor(router_name) + " is " + ShapeStr(router->shape) +
                       ", but a router over " + std::to_string(experts) + " experts and hidden_size " +
                       std::to_string(c.hidden_size) + " is " + ShapeStr(router_shape) + mismatch);
      }
    }
    if (bias_rule) {
      WSUP_ASSIGN_OR_RETURN(const std::string bias_name, arch.Name(TensorId::kRouterBias, layer));
      const TensorInfo* bias = ckpt.Find(bias_name);
      if (!bias) {
        return Corrupt(dir + ": layer " + std::to_string(layer) + " has a router but no " +
                       QuoteTensor(bias_name) + ", which " + c.architecture +
                       " adds to every expert's routing score" + redownload);
      }
      if (bias->shape != ShapeOf(*bias_rule, dims)) {
        return Corrupt(dir + ": " + QuoteTensor(bias_name) + " is " + ShapeStr(bias->shape) +
                       ", not one value per expert [" + std::to_string(experts) + "]" + mismatch);
      }
    }
    for (int64_t e = 0; e < experts; ++e) {
      for (TensorId id : {TensorId::kExpertGate, TensorId::kExpertUp, TensorId::kExpertDown}) {
        const TensorRule* rule = arch.Find(id);
        if (!rule) continue;
        WSUP_ASSIGN_OR_RETURN(const std::string name, arch.Name(id, layer, e));
        const TensorInfo* t = ckpt.Find(name);
        if (!t) {
          return Corrupt(dir + ": expert " + std::to_string(e) + " of layer " + std::to_string(layer) +
                         " has no " + QuoteTensor(name) + " (config.json: " + std::to_string(experts) +
                         " experts)" + redownload);
        }
        const std::vector<int64_t> want = ShapeOf(*rule, dims);
        if (check_shapes && t->shape != want) {
          // The projection as the checkpoint names it: "gate_proj", "up_proj", "down_proj".
          std::string_view proj = name;
          proj.remove_suffix(std::string_view(".weight").size());
          proj = proj.substr(proj.rfind('.') + 1);
          return Corrupt(dir + ": tensor " + QuoteTensor(name) + " is " + ShapeStr(t->shape) +
                         ", but an expert of " +
                         (c.moe_intermediate_size > 0 ? "moe_intermediate_size " : "intermediate_size ") +
                         std::to_string(inter) + " over hidden_size " + std::to_string(c.hidden_size) +
                         " has " + std::string(proj) + " " + ShapeStr(want) + mismatch);
        }
      }
    }
  }
  return Status::Ok();
}

}  // namespace wsup
