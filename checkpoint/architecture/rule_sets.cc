#include "checkpoint/architecture/rule_sets.h"

namespace wsup::rules {

namespace {

using D = Dim;
using S = Split;
using U = Unit;

}  // namespace

std::vector<TensorRule> Concat(std::initializer_list<std::vector<TensorRule>> sets) {
  std::vector<TensorRule> out;
  for (const auto& s : sets) out.insert(out.end(), s.begin(), s.end());
  return out;
}

std::vector<TensorRule> Vocabulary() {
  return {
      {TensorId::kEmbed, "model.embed_tokens.weight", S::kRows, U::kEven, {D::kVocab, D::kHidden}},
      {TensorId::kLmHead, "lm_head.weight", S::kRows, U::kEven, {D::kVocab, D::kHidden}},
      {TensorId::kFinalNorm, "model.norm.weight", S::kReplicate, U::kEven, {D::kHidden}},
  };
}

std::vector<TensorRule> LayerNorms() {
  return {
      {TensorId::kInputNorm, "model.layers.*.input_layernorm.weight", S::kReplicate, U::kEven, {D::kHidden}},
      {TensorId::kPostAttentionNorm, "model.layers.*.post_attention_layernorm.weight", S::kReplicate, U::kEven,
       {D::kHidden}},
  };
}

std::vector<TensorRule> RotaryBuffers() {
  return {
      {TensorId::kRotaryInvFreq, "model.rotary_emb.inv_freq", S::kReplicate, U::kEven, {D::kHalfHeadDim},
       Use::kIgnored},
      {TensorId::kLayerRotaryInvFreq, "model.layers.*.self_attn.rotary_emb.inv_freq", S::kReplicate, U::kEven,
       {D::kHalfHeadDim}, Use::kIgnored},
  };
}

std::vector<TensorRule> GqaAttention() {
  return {
      {TensorId::kQ, "model.layers.*.self_attn.q_proj.weight", S::kRows, U::kQHeads, {D::kQRows, D::kHidden}},
      {TensorId::kQBias, "model.layers.*.self_attn.q_proj.bias", S::kRows, U::kQHeads, {D::kQRows},
       Use::kRefused},
      {TensorId::kK, "model.layers.*.self_attn.k_proj.weight", S::kRows, U::kKvHeads, {D::kKvRows, D::kHidden}},
      {TensorId::kKBias, "model.layers.*.self_attn.k_proj.bias", S::kRows, U::kKvHeads, {D::kKvRows},
       Use::kRefused},
      {TensorId::kV, "model.layers.*.self_attn.v_proj.weight", S::kRows, U::kKvHeads, {D::kKvRows, D::kHidden}},
      {TensorId::kVBias, "model.layers.*.self_attn.v_proj.bias", S::kRows, U::kKvHeads, {D::kKvRows},
       Use::kRefused},
      {TensorId::kO, "model.layers.*.self_attn.o_proj.weight", S::kCols, U::kQHeads, {D::kHidden, D::kQRows}},
      {TensorId::kOBias, "model.layers.*.self_attn.o_proj.bias", S::kReplicate, U::kEven, {D::kHidden},
       Use::kRefused},
  };
}

std::vector<TensorRule> QkNorms() {
  return {
      {TensorId::kQNorm, "model.layers.*.self_attn.q_norm.weight", S::kReplicate, U::kEven, {D::kHeadDim}},
      {TensorId::kKNorm, "model.layers.*.self_attn.k_norm.weight", S::kReplicate, U::kEven, {D::kHeadDim}},
  };
}

std::vector<TensorRule> LatentAttention() {
  // The low-rank down-projections and their norms are small and every head
  // needs all of them; the up-projections hold the rank's heads.
  return {
      {TensorId::kQA, "model.layers.*.self_attn.q_a_proj.weight", S::kReplicate, U::kEven,
       {D::kQLora, D::kHidden}},
      {TensorId::kQANorm, "model.layers.*.self_attn.q_a_layernorm.weight", S::kReplicate, U::kEven, {D::kQLora}},
      {TensorId::kKvA, "model.layers.*.self_attn.kv_a_proj_with_mqa.weight", S::kReplicate, U::kEven,
       {D::kKvAOut, D::kHidden}},
      {TensorId::kKvANorm, "model.layers.*.self_attn.kv_a_layernorm.weight", S::kReplicate, U::kEven,
       {D::kKvLora}},
      {TensorId::kQB, "model.layers.*.self_attn.q_b_proj.weight", S::kRows, U::kMlaQHeads,
       {D::kMlaQRows, D::kQLora}},
      // q_lora_rank null: one q_proj straight from the hidden state.
      {TensorId::kQ, "model.layers.*.self_attn.q_proj.weight", S::kRows, U::kMlaQHeads,
       {D::kMlaQRows, D::kHidden}},
      {TensorId::kKvB, "model.layers.*.self_attn.kv_b_proj.weight", S::kRows, U::kMlaKvHeads,
       {D::kMlaKvRows, D::kKvLora}},
      {TensorId::kO, "model.layers.*.self_attn.o_proj.weight", S::kCols, U::kMlaVHeads,
       {D::kHidden, D::kMlaVCols}},
  };
}

std::vector<TensorRule> DenseMlp(bool with_biases) {
  std::vector<TensorRule> r = {
      {TensorId::kGate, "model.layers.*.mlp.gate_proj.weight", S::kRows, U::kEven, {D::kInter, D::kHidden}},
      {TensorId::kUp, "model.layers.*.mlp.up_proj.weight", S::kRows, U::kEven, {D::kInter, D::kHidden}},
      {TensorId::kDown, "model.layers.*.mlp.down_proj.weight", S::kCols, U::kEven, {D::kHidden, D::kInter}},
  };
  if (with_biases) {
    r.push_back({TensorId::kGateBias, "model.layers.*.mlp.gate_proj.bias", S::kRows, U::kEven, {D::kInter},
                 Use::kRefused});
    r.push_back({TensorId::kUpBias, "model.layers.*.mlp.up_proj.bias", S::kRows, U::kEven, {D::kInter},
                 Use::kRefused});
    r.push_back({TensorId::kDownBias, "model.layers.*.mlp.down_proj.bias", S::kReplicate, U::kEven,
                 {D::kHidden}, Use::kRefused});
  }
  return r;
}

std::vector<TensorRule> Router(bool score_bias) {
  // Every rank routes every token, so the router is whole everywhere.
  std::vector<TensorRule> r = {
      {TensorId::kRouter, "model.layers.*.mlp.gate.weight", S::kReplicate, U::kEven, {D::kExperts, D::kHidden}},
  };
  if (score_bias) {
    r.push_back({TensorId::kRouterBias, "model.layers.*.mlp.gate.e_score_correction_bias", S::kReplicate,
                 U::kEven, {D::kExperts}});
  }
  return r;
}

std::vector<TensorRule> RoutedExperts() {
  return {
      {TensorId::kExpertGate, "model.layers.*.mlp.experts.*.gate_proj.weight", S::kRows, U::kEven,
       {D::kMoeInter, D::kHidden}, Use::kBound, Role::kRoutedExpert},
      {TensorId::kExpertUp, "model.layers.*.mlp.experts.*.up_proj.weight", S::kRows, U::kEven,
       {D::kMoeInter, D::kHidden}, Use::kBound, Role::kRoutedExpert},
      {TensorId::kExpertDown, "model.layers.*.mlp.experts.*.down_proj.weight", S::kCols, U::kEven,
       {D::kHidden, D::kMoeInter}, Use::kBound, Role::kRoutedExpert},
  };
}

std::vector<TensorRule> SharedExperts() {
  return {
      {TensorId::kSharedGate, "model.layers.*.mlp.shared_experts.gate_proj.weight", S::kRows, U::kEven,
       {D::kSharedInter, D::kHidden}},
      {TensorId::kSharedUp, "model.layers.*.mlp.shared_experts.up_proj.weight", S::kRows, U::kEven,
       {D::kSharedInter, D::kHidden}},
      {TensorId::kSharedDown, "model.layers.*.mlp.shared_experts.down_proj.weight", S::kCols, U::kEven,
       {D::kHidden, D::kSharedInter}},
  };
}

std::vector<TensorRule> MultiTokenPrediction() {
  return {
      {TensorId::kMtpEmbed, "model.layers.*.embed_tokens.weight", S::kRows, U::kEven, {D::kVocab, D::kHidden},
       Use::kIgnored},
      {TensorId::kMtpENorm, "model.layers.*.enorm.weight", S::kReplicate, U::kEven, {D::kHidden}, Use::kIgnored},
      {TensorId::kMtpHNorm, "model.layers.*.hnorm.weight", S::kReplicate, U::kEven, {D::kHidden}, Use::kIgnored},
      // [hidden, 2 x hidden]: not read, so its shape is left unchecked.
      {TensorId::kMtpEhProj, "model.layers.*.eh_proj.weight", S::kReplicate, U::kEven, {}, Use::kIgnored},
      {TensorId::kMtpHeadNorm, "model.layers.*.shared_head.norm.weight", S::kReplicate, U::kEven, {D::kHidden},
       Use::kIgnored},
      {TensorId::kMtpHead, "model.layers.*.shared_head.head.weight", S::kRows, U::kEven, {D::kVocab, D::kHidden},
       Use::kIgnored},
  };
}

}  // namespace wsup::rules
