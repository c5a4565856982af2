// Qwen3-MoE: Llama attention with per-head q/k norms; every sparse layer a
// router and routed experts (mlp_only_layers and decoder_sparse_step keep
// some layers a dense MLP, as in Llama).
#include "checkpoint/architecture/families.h"
#include "checkpoint/architecture/rule_sets.h"

namespace wsup::families {

const Architecture& Qwen3Moe() {
  static const Architecture a = [] {
    Architecture a;
    a.name = "Qwen3MoeForCausalLM";
    a.family = Family::kQwen3Moe;
    a.moe = true;
    a.tensors = rules::Concat({rules::Vocabulary(), rules::LayerNorms(), rules::QkNorms(), rules::GqaAttention(),
                               rules::Router(/*score_bias=*/false), rules::RoutedExperts(),
                               rules::DenseMlp(/*with_biases=*/false)});
    return a;
  }();
  return a;
}

}  // namespace wsup::families
