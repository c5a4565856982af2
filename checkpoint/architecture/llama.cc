// Llama: grouped-query attention (with the biases some members store, which
// the reference engine refuses), a dense SwiGLU MLP in every layer. Mistral,
// Qwen2 and Qwen3 name their tensors the same way; the holder shards them,
// the reference engine computes Llama and Mistral.
#include "checkpoint/architecture/families.h"
#include "checkpoint/architecture/rule_sets.h"

namespace wsup::families {

namespace {

Architecture LlamaLike(const char* name, bool engine_computes) {
  Architecture a;
  a.name = name;
  a.family = Family::kLlama;
  a.engine_computes = engine_computes;
  a.tensors = rules::Concat({rules::Vocabulary(), rules::RotaryBuffers(), rules::LayerNorms(),
                             rules::QkNorms(), rules::GqaAttention(), rules::DenseMlp(/*with_biases=*/true)});
  // Qwen3's q/k norms are held and split like any norm; the Llama engine has
  // none to read.
  for (TensorRule& r : a.tensors) {
    if (r.id == TensorId::kQNorm || r.id == TensorId::kKNorm) r.use = Use::kIgnored;
  }
  return a;
}

}  // namespace

const Architecture& Llama() {
  static const Architecture a = LlamaLike("LlamaForCausalLM", true);
  return a;
}
const Architecture& Mistral() {
  static const Architecture a = LlamaLike("MistralForCausalLM", true);
  return a;
}
const Architecture& Qwen2() {
  static const Architecture a = LlamaLike("Qwen2ForCausalLM", false);
  return a;
}
const Architecture& Qwen3() {
  static const Architecture a = LlamaLike("Qwen3ForCausalLM", false);
  return a;
}

}  // namespace wsup::families
