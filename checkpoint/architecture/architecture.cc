#include "checkpoint/architecture/architecture.h"

#include "checkpoint/architecture/families.h"
#include "checkpoint/checkpoint.h"
#include "common/enum_names.h"

namespace wsup {

const char* SplitName(Split split) {
  static constexpr EnumNames<Split::kCols> kNames{"replicate", "rows", "cols"};
  return kNames(split);
}

const char* FamilyName(Family f) {
  static constexpr EnumNames<Family::kDeepseekV3> kNames{"Llama", "Qwen3-MoE", "DeepSeek-V3"};
  return kNames(f);
}

const char* TensorIdName(TensorId id) {
  static constexpr EnumNames<TensorId::kMtpHead> kNames{"embed",
                                                        "lm_head",
                                                        "final norm",
                                                        "rotary frequencies",
                                                        "input norm",
                                                        "post-attention norm",
                                                        "layer rotary frequencies",
                                                        "q projection",
                                                        "q bias",
                                                        "k projection",
                                                        "k bias",
                                                        "v projection",
                                                        "v bias",
                                                        "o projection",
                                                        "o bias",
                                                        "q norm",
                                                        "k norm",
                                                        "q_a projection",
                                                        "q_a norm",
                                                        "q_b projection",
                                                        "kv_a projection",
                                                        "kv_a norm",
                                                        "kv_b projection",
                                                        "gate projection",
                                                        "gate bias",
                                                        "up projection",
                                                        "up bias",
                                                        "down projection",
                                                        "down bias",
                                                        "router",
                                                        "router score bias",
                                                        "expert gate projection",
                                                        "expert up projection",
                                                        "expert down projection",
                                                        "shared expert gate projection",
                                                        "shared expert up projection",
                                                        "shared expert down projection",
                                                        "prediction layer embed",
                                                        "prediction layer enorm",
                                                        "prediction layer hnorm",
                                                        "prediction layer projection",
                                                        "prediction layer head norm",
                                                        "prediction layer head"};
  return kNames(id);
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
