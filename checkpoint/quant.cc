#include "checkpoint/quant.h"

#include <string_view>

namespace wsup {

namespace {

struct Refusal {
  const char* method;  // quant_method as config.json spells it
  const char* why;     // the post-load transform the engine applies
};

// Formats whose stored bytes are not what an engine computes with. The list
// only sharpens messages: whatever is not allowed is refused anyway.
constexpr Refusal kRefusals[] = {
    {"awq",
     "engines repack AWQ's packed int4 weights (qweight, qzeros) into their kernels' layout after loading"},
    {"awq_marlin",
     "engines repack the int4 weights into Marlin's tile layout and permute the scales after loading"},
    {"gptq", "engines reorder GPTQ's rows by g_idx (act-order) and repack the int4 weights after loading"},
    {"gptq_marlin",
     "engines repack the int4 weights into Marlin's tile layout and permute the scales after loading"},
    {"marlin", "engines repack the weights into Marlin's tile layout and permute the scales after loading"},
    {"compressed-tensors",
     "engines decompress or repack each scheme's weights and transform its scales after loading"},
    {"compressed_tensors",
     "engines decompress or repack each scheme's weights and transform its scales after loading"},
    {"bitsandbytes", "bitsandbytes quantizes or repacks the weights into its own blocks while they load"},
    {"fbgemm_fp8", "engines transform the per-channel FP8 scales after loading"},
};

constexpr const char* kPerTensorFp8Why =
    "engines fold per-tensor FP8 weight scales after loading (fused q/k/v and gate/up projections are "
    "requantized "
    "to one shared scale)";

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

Error Refuse(const std::string& where, const std::string& method, const std::string& why) {
  return Refused(
      where + ": quantization method '" + method + "' cannot be shared zero-copy: " + why +
      ", and a client that only maps the holder's memory cannot reproduce that transform; set "
      "weight-cache mode `off` to load this model without the weight cache, or use an unquantized or "
      "block-wise FP8 (weight_block_size) checkpoint");
}

// Tensor names that only quantized formats have.
const char* QuantizedTensorKind(std::string_view name) {
  if (EndsWith(name, ".weight_scale_inv")) return "a block FP8 scale";
  if (EndsWith(name, ".weight_scale")) return "a per-tensor FP8 scale";
  if (EndsWith(name, ".qweight") || EndsWith(name, ".qzeros") || EndsWith(name, ".g_idx") ||
      EndsWith(name, ".scales")) {
    return "a packed int4 (AWQ/GPTQ) tensor";
  }
  if (EndsWith(name, ".weight_packed") || EndsWith(name, ".weight_zero_point"))
    return "a compressed-tensors tensor";
  if (EndsWith(name, ".SCB") || name.find(".absmax") != std::string_view::npos ||
      name.find(".quant_state") != std::string_view::npos) {
    return "a bitsandbytes tensor";
  }
  return nullptr;
}

}  // namespace

Status CheckZeroCopyAllowed(const ModelConfig& config, const std::vector<std::string>& tensor_names,
                            const std::string& where) {
  const QuantConfig& q = config.quant;
  if (q.method == "none") {
    // No quantization_config, yet quantized tensors: the config is not the
    // checkpoint's, and guessing the format would be worse than refusing.
    for (const std::string& name : tensor_names) {
      if (const char* kind = QuantizedTensorKind(name)) {
        return Refused(where + ": tensor '" + name + "' is " + kind +
                       " but config.json has no quantization_config, so the format is unknown; restore the "
                       "checkpoint's own config.json, or set weight-cache mode `off`");
      }
    }
    return Status::Ok();
  }
  if (q.method == "fp8") {
    if (q.weight_block_size.empty()) return Refuse(where, "fp8 (per-tensor)", kPerTensorFp8Why);
    for (const std::string& name : tensor_names) {
      if (EndsWith(name, ".weight_scale")) {
        return Refuse(where, "fp8 (per-tensor)",
                      std::string(kPerTensorFp8Why) + "; tensor '" + name + "' is a per-tensor scale");
      }
    }
    return Status::Ok();  // block-wise: engines use the stored bytes and scales as they are
  }
  for (const Refusal& r : kRefusals) {
    if (q.method == r.method) return Refuse(where, q.method, r.why);
  }
  return Refuse(
      where, q.method,
      "wsup does not know which transforms engines apply to this format after loading, so it cannot "
      "vouch that the stored bytes are what they compute with");
}

Status CheckZeroCopyAllowed(const Checkpoint& ckpt) {
  std::vector<std::string> names;
  names.reserve(ckpt.tensors().size());
  for (const TensorInfo& t : ckpt.tensors()) {
    names.push_back(t.name);
    if ((t.dtype == DType::kF8E4M3 || t.dtype == DType::kF8E5M2) && ckpt.config().quant.method == "none") {
      return Refused(ckpt.dir() + ": tensor '" + t.name + "' is " + DTypeName(t.dtype) +
                     " but config.json has no quantization_config, so its scales are unknown; restore the "
                     "checkpoint's own config.json, or set weight-cache mode `off`");
    }
  }
  return CheckZeroCopyAllowed(ckpt.config(), names, ckpt.dir());
}

}  // namespace wsup
