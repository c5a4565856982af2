// Model-family descriptors: everything wsup knows about one architecture's
// checkpoint, in one place. A descriptor lists the family's tensors, each
// with its name pattern, its shape in config.json's terms, how tensor
// parallelism splits it, and whether the reference engine binds it. The
// holder's sharding (checkpoint/sharding.h), the checkpoint validation
// (ValidateArchitecture below) and both engine backends' weight binding
// (engine/model.h BindWeights) read these descriptors and nothing else, so
// they cannot disagree about a tensor.
//
// A descriptor is built from shared rule sets (rule_sets.h: vocabulary,
// norms, grouped-query and latent attention, dense MLP, router, experts), so
// a family states only what it is made of. Adding a family is one new
// descriptor file (see llama.cc) and its entry in Architectures()
// (architecture.cc), plus the
// engine's kernels for whatever it computes differently.
//
// Block-FP8 scales are not listed: a tensor "<w>_scale_inv" beside a weight
// "<w>" is its weight's scale, split with it (quantization rules in
// sharding.cc, checkpoint/quant.h).
//
// Descriptors are constant data with static lifetime; any thread may read
// them.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace wsup {

class Checkpoint;
struct ModelConfig;

enum class Split { kReplicate, kRows, kCols };
const char* SplitName(Split split);

// What a split dimension is made of, which decides the sizes tp may take:
// attention dimensions must be cut between heads, others anywhere even.
// The multi-head latent attention units are heads of another size:
// q_b_proj rows are per head qk_nope + qk_rope, kv_b_proj rows per head
// qk_nope + v_head, o_proj columns per head v_head.
enum class Unit { kEven, kQHeads, kKvHeads, kMlaQHeads, kMlaKvHeads, kMlaVHeads };

// A routed expert's matrix (mlp.experts.E.*): split like a dense MLP under
// tensor parallelism, held whole by one rank under expert parallelism.
enum class Role { kPlain, kRoutedExpert };

// What a tensor is, whatever a family calls it. The engine binds by these.
enum class TensorId {
  kEmbed, kLmHead, kFinalNorm, kRotaryInvFreq,
  kInputNorm, kPostAttentionNorm, kLayerRotaryInvFreq,
  kQ, kQBias, kK, kKBias, kV, kVBias, kO, kOBias, kQNorm, kKNorm,
  kQA, kQANorm, kQB, kKvA, kKvANorm, kKvB,
  kGate, kGateBias, kUp, kUpBias, kDown, kDownBias,
  kRouter, kRouterBias,
  kExpertGate, kExpertUp, kExpertDown,
  kSharedGate, kSharedUp, kSharedDown,
  kMtpEmbed, kMtpENorm, kMtpHNorm, kMtpEhProj, kMtpHeadNorm, kMtpHead,
};
const char* TensorIdName(TensorId id);

// A size from config.json a shape is made of. Dims::Global() gives the
// checkpoint's sizes, the engine gives a rank's local ones (engine/model.cc).
enum class Dim {
  kVocab, kHidden, kInter, kHeadDim, kHalfHeadDim,
  kQRows,      // num_attention_heads x head_dim
  kKvRows,     // num_key_value_heads x head_dim
  kQLora, kKvLora,
  kKvAOut,     // kv_lora_rank + qk_rope_head_dim
  kMlaQRows,   // num_attention_heads x (qk_nope_head_dim + qk_rope_head_dim)
  kMlaKvRows,  // num_attention_heads x (qk_nope_head_dim + v_head_dim)
  kMlaVCols,   // num_attention_heads x v_head_dim
  kExperts, kMoeInter, kSharedInter,
  kCount,
};

struct Dims {
  int64_t v[static_cast<int>(Dim::kCount)] = {};
  int64_t& operator[](Dim d) { return v[static_cast<int>(d)]; }
  int64_t operator[](Dim d) const { return v[static_cast<int>(d)]; }
  // The whole model's sizes from config.json (a routed expert's width is
  // moe_intermediate_size, else intermediate_size).
  static Dims Global(const ModelConfig& c);
};

// Whether the reference engine reads a tensor.
enum class Use {
  kBound,    // bound by BindWeights on every backend
  kIgnored,  // held and sharded, not read (recomputed, or a head the engine does not run)
  kRefused,  // the engine refuses a checkpoint that has it (projection biases)
};

struct TensorRule {
  TensorId id;
  const char* pattern;  // '*' matches one dotted segment: the layer, then the expert number
  Split split;
  Unit unit;
  std::vector<Dim> shape;  // in Dims; a norm is one dimension
  Use use = Use::kBound;
  Role role = Role::kPlain;
};

enum class Family { kLlama, kQwen3Moe, kDeepseekV3 };
const char* FamilyName(Family f);

struct Architecture {
  std::string name;  // config.json's architectures[0]
  Family family;
  bool engine_computes = true;  // false: the holder shards it, the reference engine refuses it
  // Mixture of experts: the checkpoint is checked against config.json's
  // expert counts and shapes before planning.
  bool moe = false;
  bool score_bias = false;  // the router has its e_score_correction_bias
  std::vector<TensorRule> tensors;

  const TensorRule* Find(TensorId id) const;
  // The first rule whose pattern matches `name`, or nullptr.
  const TensorRule* Match(std::string_view name) const;
  // The name of `id` in layer `layer` (expert `expert`), or an Internal
  // error when the family has no such tensor.
  Result<std::string> Name(TensorId id, int64_t layer = -1, int64_t expert = -1) const;
};

// Every known architecture, and the one config.json names (nullptr when
// unknown).
std::span<const Architecture* const> Architectures();
const Architecture* FindArchitecture(std::string_view name);

// '*' matches one non-empty dotted segment.
bool MatchPattern(std::string_view pattern, std::string_view name);

// The layer and expert numbers of a tensor under a routed expert
// (the family's expert pattern up to the expert number, then anything);
// false when `name` is not under one, or its numbers are not numbers.
bool RoutedExpertOf(const Architecture& arch, std::string_view name, int64_t* layer, int64_t* expert);

// The shape of `rule` with the sizes `dims`.
std::vector<int64_t> ShapeOf(const TensorRule& rule, const Dims& dims);

// Checks a mixture-of-experts checkpoint against its config.json and its
// descriptor before anything is planned: every sparse layer's router (and
// score bias), every expert's three matrices of the expected shape, no
// expert past num_experts or in a dense layer. Ok for dense families.
Status ValidateArchitecture(const Checkpoint& ckpt, const Architecture& arch);

}  // namespace wsup
