// The rule sets descriptors are built from (architecture.h): each is the
// tensors of one part of a decoder, with their names, shapes and splits, as
// the Hugging Face checkpoints of every family that has that part name them.
//
// Splits, in short: q/k/v/gate/up projections on their rows (output), o and
// down projections on their columns (input), embed_tokens and lm_head on the
// vocabulary; norms, routers and the latent down-projections replicated. A
// row-parallel layer adds its bias once after the reduction, so its bias is
// whole on every rank.
#pragma once

#include <initializer_list>
#include <vector>

#include "checkpoint/architecture/architecture.h"

namespace wsup::rules {

// Builds a descriptor's tensor list from rule sets, in order.
std::vector<TensorRule> Concat(std::initializer_list<std::vector<TensorRule>> sets);

// embed_tokens, lm_head and the final norm.
std::vector<TensorRule> Vocabulary();
// input_layernorm and post_attention_layernorm.
std::vector<TensorRule> LayerNorms();
// Stored rotary frequencies (older Llama checkpoints): recomputed, not read.
std::vector<TensorRule> RotaryBuffers();
// Grouped-query attention: q/k/v/o and their biases.
std::vector<TensorRule> GqaAttention();
// Per-head RMSNorm of q and k (Qwen3).
std::vector<TensorRule> QkNorms();
// Multi-head latent attention (DeepSeek-V2/V3): low-rank q and kv.
std::vector<TensorRule> LatentAttention();
// A dense SwiGLU MLP; with_biases adds gate/up/down biases.
std::vector<TensorRule> DenseMlp(bool with_biases);
// The router, and (score_bias) its e_score_correction_bias.
std::vector<TensorRule> Router(bool score_bias);
// Routed experts, mlp.experts.E.{gate,up,down}_proj.
std::vector<TensorRule> RoutedExperts();
// Shared experts, mlp.shared_experts.{gate,up,down}_proj.
std::vector<TensorRule> SharedExperts();
// DeepSeek's multi-token-prediction layer (model.layers.<num_hidden_layers>):
// held, not run by the reference engine.
std::vector<TensorRule> MultiTokenPrediction();

}  // namespace wsup::rules
