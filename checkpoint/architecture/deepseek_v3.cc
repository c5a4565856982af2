// DeepSeek-V3: multi-head latent attention; the first first_k_dense_replace
// layers dense, the others a router with a score correction bias, routed
// experts and shared experts (a dense MLP every token goes through). The
// multi-token-prediction layer (model.layers.<num_hidden_layers>) adds its
// own embedding, norms, projection and head, which the holder keeps and the
// reference engine does not run.
#include "checkpoint/architecture/families.h"
#include "checkpoint/architecture/rule_sets.h"

namespace wsup::families {

const Architecture& DeepseekV3() {
  static const Architecture a = [] {
    Architecture a;
    a.name = "DeepseekV3ForCausalLM";
    a.family = Family::kDeepseekV3;
    a.moe = true;
    a.score_bias = true;
    a.tensors = rules::Concat({rules::Vocabulary(), rules::LayerNorms(), rules::LatentAttention(),
                               rules::Router(/*score_bias=*/true), rules::RoutedExperts(), rules::SharedExperts(),
                               rules::DenseMlp(/*with_biases=*/false), rules::MultiTokenPrediction()});
    return a;
  }();
  return a;
}

}  // namespace wsup::families
