#include "checkpoint/architecture/architecture.h"

#include "checkpoint/architecture/families.h"
#include "checkpoint/checkpoint.h"

namespace wsup {

const char* SplitName(Split split) {
  switch (split) {
    case Split::kReplicate:
      return "replicate";
    case Split::kRows:
      return "rows";
    case Split::kCols:
      return "cols";
  }
  return "?";
}

const char* FamilyName(Family f) {
  switch (f) {
    case Family::kLlama: return "Llama";
    case Family::kQwen3Moe: return "Qwen3-MoE";
    case Family::kDeepseekV3: return "DeepSeek-V3";
  }
  return "?";
}

const char* TensorIdName(TensorId id) {
  switch (id) {
    case TensorId::kEmbed: return "embed";
    case TensorId::kLmHead: return "lm_head";
    case TensorId::kFinalNorm: return "final norm";
    case TensorId::kRotaryInvFreq: return "rotary frequencies";
    case TensorId::kInputNorm: return "input norm";
    case TensorId::kPostAttentionNorm: return "post-attention norm";
    case TensorId::kLayerRotaryInvFreq: return "layer rotary frequencies";
    case TensorId::kQ: return "q projection";
    case TensorId::kQBias: return "q bias";
    case TensorId::kK: return "k projection";
    case TensorId::kKBias: return "k bias";
    case TensorId::kV: return "v projection";
    case TensorId::kVBias: return "v bias";
    case TensorId::kO: return "o projection";
    case TensorId::kOBias: return "o bias";
    case TensorId::kQNorm: return "q norm";
    case TensorId::kKNorm: return "k norm";
    case TensorId::kQA: return "q_a projection";
    case TensorId::kQANorm: return "q_a norm";
    case TensorId::kQB: return "q_b projection";
    case TensorId::kKvA: return "kv_a projection";
    case TensorId::kKvANorm: return "kv_a norm";
    case TensorId::kKvB: return "kv_b projection";
    case TensorId::kGate: return "gate projection";
    case TensorId::kGateBias: return "gate bias";
    case TensorId::kUp: return "up projection";
    case TensorId::kUpBias: return "up bias";
    case TensorId::kDown: return "down projection";
    case TensorId::kDownBias: return "down bias";
    case TensorId::kRouter: return "router";
    case TensorId::kRouterBias: return "router score bias";
    case TensorId::kExpertGate: return "expert gate projection";
    case TensorId::kExpertUp: return "expert up projection";
    case TensorId::kExpertDown: return "expert down projection";
    case TensorId::kSharedGate: return "shared expert gate projection";
    case TensorId::kSharedUp: return "shared expert up projection";
    case TensorId::kSharedDown: return "shared expert down projection";
    case TensorId::kMtpEmbed: return "prediction layer embed";
    case TensorId::kMtpENorm: return "prediction layer enorm";
    case TensorId::kMtpHNorm: return "prediction layer hnorm";
    case TensorId::kMtpEhProj: return "prediction layer projection";
    case TensorId::kMtpHeadNorm: return "prediction layer head norm";
    case TensorId::kMtpHead: return "prediction layer head";
  }
  return "?";
}

Dims Dims::Global(const ModelConfig& c) {
  Dims d;
  const int64_t kv_heads = c.num_key_value_heads > 0 ? c.num_key_value_heads : c.num_attention_heads;
  const int64_t moe_inter = c.moe_intermediate_size > 0 ? c.moe_intermediate_size : c.intermediate_size;
  d[Dim::kVocab] = c.vocab_size;
  d[Dim::kHidden] = c.hidden_size;
  d[Dim::kInter] = c.intermediate_size;
  d[Dim::kHeadDim] = c.head_dim;
  d[Dim::kHalfHeadDim] = c.head_dim / 2;
  d[Dim::kQRows] = c.num_attention_heads * c.head_dim;
  d[Dim::kKvRows] = kv_heads * c.head_dim;
  d[Dim::kQLora] = c.q_lora_rank;
  d[Dim::kKvLora] = c.kv_lora_rank;
  d[Dim::kKvAOut] = c.kv_lora_rank + c.qk_rope_head_dim;
  d[Dim::kMlaQRows] = c.num_attention_heads * (c.qk_nope_head_dim + c.qk_rope_head_dim);
  d[Dim::kMlaKvRows] = c.num_attention_heads * (c.qk_nope_head_dim + c.v_head_dim);
  d[Dim::kMlaVCols] = c.num_attention_heads * c.v_head_dim;
  d[Dim::kExperts] = c.num_experts;
  d[Dim::kMoeInter] = moe_inter;
  d[Dim::kSharedInter] = c.n_shared_experts * moe_inter;
  return d;
}

bool MatchPattern(std::string_view pattern, std::string_view name) {
  size_t p = 0, n = 0;
  while (p < pattern.size()) {
    if (pattern[p] == '*') {
      size_t start = n;
      while (n < name.size() && name[n] != '.') ++n;
      if (n == start) return false;
      ++p;
      continue;
    }
    if (n >= name.size() || name[n] != pattern[p]) return false;
    ++p;
    ++n;
  }
  return n == name.size();
}

bool RoutedExpertOf(const Architecture& arch, std::string_view name, int64_t* layer, int64_t* expert) {
  const TensorRule* r = arch.Find(TensorId::kExpertGate);
  if (!r) return false;
  int64_t numbers[2] = {-1, -1};
  int star = 0;
  size_t n = 0;
  for (const char* c = r->pattern; *c && star < 2; ++c) {
    if (*c != '*') {
      if (n >= name.size() || name[n] != *c) return false;
      ++n;
      continue;
    }
    int64_t v = 0;
    const size_t first = n;
    for (; n < name.size() && name[n] >= '0' && name[n] <= '9'; ++n) {
      if (v > (int64_t{1} << 40)) return false;
      v = v * 10 + (name[n] - '0');
    }
    if (n == first) return false;
    numbers[star++] = v;
  }
  if (star < 2 || n >= name.size() || name[n] != '.') return false;
  *layer = numbers[0];
  *expert = numbers[1];
  return true;
}

std::vector<int64_t> ShapeOf(const TensorRule& rule, const Dims& dims) {
  std::vector<int64_t> shape;
  shape.reserve(rule.shape.size());
  for (Dim d : rule.shape) shape.push_back(dims[d]);
  return shape;
}

const TensorRule* Architecture::Find(TensorId id) const {
  for (const TensorRule& r : tensors) {
    if (r.id == id) return &r;
  }
  return nullptr;
}

const TensorRule* Architecture::Match(std::string_view tensor) const {
  for (const TensorRule& r : tensors) {
    if (MatchPattern(r.pattern, tensor)) return &r;
  }
  return nullptr;
}

Result<std::string> Architecture::Name(TensorId id, int64_t layer, int64_t expert) const {
  const TensorRule* r = Find(id);
  if (!r) {
    return Internal("architecture " + name + " has no " + TensorIdName(id) +
                    " tensor in its descriptor (checkpoint/architecture/); add it there");
  }
  std::string out;
  int star = 0;
  for (const char* c = r->pattern; *c; ++c) {
    if (*c != '*') {
      out += *c;
      continue;
    }
    const int64_t v = star++ == 0 ? layer : expert;
    if (v < 0) {
      return Internal(std::string("tensor pattern '") + r->pattern + "' of " + name + " needs a " +
                      (star == 1 ? "layer" : "expert") + " number");
    }
    out += std::to_string(v);
  }
  return out;
}

std::span<const Architecture* const> Architectures() {
  static const Architecture* const kAll[] = {
      &families::Llama(), &families::Mistral(),  &families::Qwen2(),
      &families::Qwen3(), &families::Qwen3Moe(), &families::DeepseekV3(),
  };
  return kAll;
}

const Architecture* FindArchitecture(std::string_view name) {
  for (const Architecture* a : Architectures()) {
    if (a->name == name) return a;
  }
  return nullptr;
}

}  // namespace wsup
