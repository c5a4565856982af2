// config.json, read once: the sizes every family has, the quantization,
// and the keys of the families with experts or latent attention. The
// checkpoint (checkpoint.cc) reads it with the shards; the engine computes
// from the ModelConfig it gives and never reads config.json again.
#include <algorithm>
#include <optional>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "checkpoint/json_text.h"
#include "common/sha256.h"

namespace wsup {

using json = nlohmann::json;
using checkpoint_text::CheckDepth;
using checkpoint_text::Quote;

namespace {

Result<int64_t> ConfigInt(const json& j, const char* key, bool required, int64_t dflt,
                          const std::string& path) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) {
    if (required) {
      return Corrupt(path + ": key '" + key + "' is missing; a Hugging Face config.json has it: " +
                     "restore config.json from the model repository");
    }
    return dflt;
  }
  if (!it->is_number_integer() || it->get<int64_t>() <= 0) {
    return Corrupt(path + ": key '" + key + "' is " + Quote(*it) +
                   ", not a positive integer: fix config.json or restore it from the model repository");
  }
  return it->get<int64_t>();
}

// As ConfigInt, but 0 is allowed (first_k_dense_replace 0, n_shared_experts 0).
Result<int64_t> ConfigCount(const json& j, const char* key, int64_t dflt, const std::string& path) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return dflt;
  if (!it->is_number_integer() || it->get<int64_t>() < 0) {
    return Corrupt(path + ": key '" + key + "' is " + Quote(*it) +
                   ", not an integer of 0 or more: fix config.json or restore it from the model repository");
  }
  return it->get<int64_t>();
}

Result<std::string> ConfigString(const json& j, const char* key, const std::string& path) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::string();
  if (!it->is_string()) {
    return Corrupt(path + ": key '" + key + "' is " + Quote(*it) +
                   ", not a string: fix config.json or restore it from the model repository");
  }
  return it->get<std::string>();
}

Result<double> ConfigDouble(const json& j, const char* key, double dflt, const std::string& path) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return dflt;
  if (!it->is_number() || !(it->get<double>() > 0)) {
    return Corrupt(path + ": key '" + key + "' is " + Quote(*it) +
                   ", not a positive number: fix config.json or restore it from the model repository");
  }
  return it->get<double>();
}

Result<QuantConfig> ParseQuantConfig(const json& q, const std::string& path) {
  const std::string where = path + ": quantization_config";
  if (!q.is_object()) {
    return Corrupt(where + " is " + Quote(q) +
                   ", not an object: fix config.json or restore it from the model repository");
  }
  QuantConfig out;
  auto m = q.find("quant_method");
  if (m == q.end() || !m->is_string() || m->get<std::string>().empty()) {
    // Without a method nothing can tell how the weights were transformed;
    // "unknown" keeps the checkpoint openable and makes the quantization
    // check refuse it by name.
    out.method = "unknown";
  } else {
    out.method = m->get<std::string>();
  }
  WSUP_ASSIGN_OR_RETURN(out.fmt, ConfigString(q, "fmt", where));
  WSUP_ASSIGN_OR_RETURN(out.activation_scheme, ConfigString(q, "activation_scheme", where));
  auto b = q.find("weight_block_size");
  if (b != q.end() && !b->is_null()) {
    bool ok = b->is_array() && b->size() == 2;
    if (ok) {
      for (const auto& v : *b)
        ok = ok && v.is_number_integer() && v.get<int64_t>() > 0 && v.get<int64_t>() <= (1 << 20);
    }
    if (!ok) {
      return Corrupt(
          where + ".weight_block_size is " + Quote(*b) +
          ", not two positive integers like [128, 128]: fix config.json or restore it from the model "
          "repository");
    }
    for (const auto& v : *b) out.weight_block_size.push_back(v.get<int64_t>());
  }
  out.json = q.dump();
  out.json_sha256 = Sha256Hex(out.json);
  return out;
}

// An optional true/false key: nullopt when absent or null.
Result<std::optional<bool>> ConfigBool(const json& j, const char* key, const std::string& path) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::optional<bool>();
  if (!it->is_boolean()) {
    return Corrupt(path + ": key '" + key + "' is " + Quote(*it) +
                   ", not true or false: fix config.json or restore it from the model repository");
  }
  return std::optional<bool>(it->get<bool>());
}

Status ParseMoeConfig(const json& j, const std::string& path, ModelConfig* c) {
  // The first key that gives a positive count, else the first present; the
  // engine names it in its messages.
  for (const char* key : {"num_local_experts", "num_experts", "n_routed_experts"}) {
    if (auto it = j.find(key); it == j.end() || it->is_null()) continue;
    WSUP_ASSIGN_OR_RETURN(int64_t n, ConfigCount(j, key, 0, path));
    if (c->experts_key.empty() || (c->num_experts == 0 && n > 0)) {
      c->experts_key = key;
      c->num_experts = n;
    }
  }
  WSUP_ASSIGN_OR_RETURN(c->num_experts_per_tok, ConfigCount(j, "num_experts_per_tok", 0, path));
  WSUP_ASSIGN_OR_RETURN(c->norm_topk_prob, ConfigBool(j, "norm_topk_prob", path));
  WSUP_ASSIGN_OR_RETURN(c->n_group, ConfigInt(j, "n_group", false, 1, path));
  WSUP_ASSIGN_OR_RETURN(c->topk_group, ConfigInt(j, "topk_group", false, 1, path));
  WSUP_ASSIGN_OR_RETURN(c->routed_scaling_factor, ConfigDouble(j, "routed_scaling_factor", 1.0, path));
  WSUP_ASSIGN_OR_RETURN(c->moe_intermediate_size, ConfigCount(j, "moe_intermediate_size", 0, path));
  WSUP_ASSIGN_OR_RETURN(c->n_shared_experts, ConfigCount(j, "n_shared_experts", 0, path));
  WSUP_ASSIGN_OR_RETURN(c->first_k_dense_replace, ConfigCount(j, "first_k_dense_replace", 0, path));
  WSUP_ASSIGN_OR_RETURN(c->moe_layer_freq, ConfigInt(j, "moe_layer_freq", false, 1, path));
  WSUP_ASSIGN_OR_RETURN(c->decoder_sparse_step, ConfigInt(j, "decoder_sparse_step", false, 1, path));
  if (auto it = j.find("mlp_only_layers"); it != j.end() && !it->is_null()) {
    bool ok = it->is_array();
    for (size_t i = 0; ok && i < it->size(); ++i) {
      ok = (*it)[i].is_number_integer() && (*it)[i].get<int64_t>() >= 0;
      if (ok) c->mlp_only_layers.push_back((*it)[i].get<int64_t>());
    }
    if (!ok) {
      return Corrupt(
          path + ": key 'mlp_only_layers' is " + Quote(*it) +
          ", not a list of layer numbers: fix config.json or restore it from the model repository");
    }
  }
  WSUP_ASSIGN_OR_RETURN(c->q_lora_rank, ConfigCount(j, "q_lora_rank", 0, path));
  WSUP_ASSIGN_OR_RETURN(c->kv_lora_rank, ConfigCount(j, "kv_lora_rank", 0, path));
  WSUP_ASSIGN_OR_RETURN(c->qk_nope_head_dim, ConfigCount(j, "qk_nope_head_dim", 0, path));
  WSUP_ASSIGN_OR_RETURN(c->qk_rope_head_dim, ConfigCount(j, "qk_rope_head_dim", 0, path));
  WSUP_ASSIGN_OR_RETURN(c->v_head_dim, ConfigCount(j, "v_head_dim", 0, path));
  WSUP_ASSIGN_OR_RETURN(c->rope_interleave, ConfigBool(j, "rope_interleave", path));
  return Status::Ok();
}

}  // namespace

Result<ModelConfig> ParseModelConfig(std::string_view json_text, const std::string& path) {
  const std::string fix = "fix config.json or restore it from the model repository";
  WSUP_RETURN_IF_ERROR(CheckDepth(json_text, path, fix));
  json j;
  try {
    j = json::parse(json_text);
  } catch (const json::exception& e) {
    return Corrupt(path + ": not valid JSON (" + e.what() + "); " + fix);
  }
  if (!j.is_object()) return Corrupt(path + ": is " + Quote(j) + ", not a JSON object; " + fix);

  ModelConfig c;
  auto arch = j.find("architectures");
  if (arch != j.end() && !arch->is_null()) {
    if (!arch->is_array() || arch->empty() || !(*arch)[0].is_string()) {
      return Corrupt(path + ": key 'architectures' is " + Quote(*arch) +
                     ", not a list of names like [\"LlamaForCausalLM\"]; " + fix);
    }
    c.architecture = (*arch)[0].get<std::string>();
  }
  WSUP_ASSIGN_OR_RETURN(c.model_type, ConfigString(j, "model_type", path));
  WSUP_ASSIGN_OR_RETURN(c.torch_dtype, ConfigString(j, "dtype", path));
  if (c.torch_dtype.empty()) {
    WSUP_ASSIGN_OR_RETURN(c.torch_dtype, ConfigString(j, "torch_dtype", path));
  }
  WSUP_ASSIGN_OR_RETURN(c.vocab_size, ConfigInt(j, "vocab_size", true, 0, path));
  WSUP_ASSIGN_OR_RETURN(c.hidden_size, ConfigInt(j, "hidden_size", true, 0, path));
  WSUP_ASSIGN_OR_RETURN(c.intermediate_size, ConfigInt(j, "intermediate_size", false, 0, path));
  WSUP_ASSIGN_OR_RETURN(c.num_hidden_layers, ConfigInt(j, "num_hidden_layers", true, 0, path));
  WSUP_ASSIGN_OR_RETURN(c.num_attention_heads, ConfigInt(j, "num_attention_heads", true, 0, path));
  WSUP_ASSIGN_OR_RETURN(c.num_key_value_heads,
                        ConfigInt(j, "num_key_value_heads", false, c.num_attention_heads, path));
  if (j.contains("head_dim") && !j["head_dim"].is_null()) {
    WSUP_ASSIGN_OR_RETURN(c.head_dim, ConfigInt(j, "head_dim", true, 0, path));
  } else {
    if (c.hidden_size % c.num_attention_heads != 0) {
      return Corrupt(path + ": hidden_size " + std::to_string(c.hidden_size) +
                     " is not divisible by num_attention_heads " + std::to_string(c.num_attention_heads) +
                     " and head_dim is absent; " + fix);
    }
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return Corrupt(path + ": num_attention_heads " + std::to_string(c.num_attention_heads) +
                   " is not a multiple of num_key_value_heads " + std::to_string(c.num_key_value_heads) +
                   "; " + fix);
  }
  WSUP_ASSIGN_OR_RETURN(c.max_position_embeddings, ConfigInt(j, "max_position_embeddings", false, 0, path));
  WSUP_ASSIGN_OR_RETURN(c.rms_norm_eps, ConfigDouble(j, "rms_norm_eps", c.rms_norm_eps, path));
  WSUP_ASSIGN_OR_RETURN(c.rope_theta, ConfigDouble(j, "rope_theta", c.rope_theta, path));
  auto rp = j.find("rope_parameters");
  if (rp != j.end() && rp->is_object() && rp->contains("rope_theta")) {
    WSUP_ASSIGN_OR_RETURN(c.rope_theta,
                          ConfigDouble(*rp, "rope_theta", c.rope_theta, path + ": rope_parameters"));
  }
  // rope_parameters (transformers 5) or rope_scaling (older): which rope,
  // "" for the default one. A scaled rope (yarn and its mscale) changes the
  // answers, so an engine that computes only the default one must know.
  for (const char* key : {"rope_parameters", "rope_scaling"}) {
    auto it = j.find(key);
    if (it == j.end() || !it->is_object() || !c.rope_type.empty()) continue;
    auto type = it->find("rope_type");
    if (type == it->end()) type = it->find("type");
    if (type != it->end() && type->is_string() && *type != "default") {
      c.rope_type = type->get<std::string>();
      c.rope_type_key = std::string(key) + ".rope_type";
    }
  }
  auto tie = j.find("tie_word_embeddings");
  if (tie != j.end() && !tie->is_null()) {
    if (!tie->is_boolean()) {
      return Corrupt(path + ": key 'tie_word_embeddings' is " + Quote(*tie) + ", not true or false; " + fix);
    }
    c.tie_word_embeddings = tie->get<bool>();
  }
  WSUP_RETURN_IF_ERROR(ParseMoeConfig(j, path, &c));
  auto q = j.find("quantization_config");
  if (q != j.end() && !q->is_null()) {
    WSUP_ASSIGN_OR_RETURN(c.quant, ParseQuantConfig(*q, path));
  } else if (auto cc = j.find("compression_config"); cc != j.end() && cc->is_object()) {
    // Older compressed-tensors checkpoints put their config under this key.
    json copy = *cc;
    if (!copy.contains("quant_method")) copy["quant_method"] = "compressed-tensors";
    WSUP_ASSIGN_OR_RETURN(c.quant, ParseQuantConfig(copy, path));
  }
  return c;
}

bool ModelConfig::IsMoeLayer(int64_t layer) const {
  if (num_experts <= 0) return false;
  if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) != mlp_only_layers.end()) return false;
  // Each family leaves the other's keys at their defaults, so the rules combine.
  return layer >= first_k_dense_replace && layer % moe_layer_freq == 0 &&
         (layer + 1) % decoder_sparse_step == 0;
}

}  // namespace wsup
