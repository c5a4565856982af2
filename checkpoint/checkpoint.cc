#include "checkpoint/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "common/fs.h"
#include "common/json_limits.h"
#include "common/sha256.h"

namespace wsup {

using json = nlohmann::json;

namespace {

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";
constexpr const char* kConfigFile = "config.json";

struct DTypeEntry {
  DType dtype;
  const char* name;
  const char* torch_name;
  size_t size;
};

constexpr DTypeEntry kDTypes[] = {
    {DType::kF64, "F64", "float64", 8},
    {DType::kF32, "F32", "float32", 4},
    {DType::kF16, "F16", "float16", 2},
    {DType::kBF16, "BF16", "bfloat16", 2},
    {DType::kF8E4M3, "F8_E4M3", "float8_e4m3fn", 1},
    {DType::kF8E5M2, "F8_E5M2", "float8_e5m2", 1},
    {DType::kI64, "I64", "int64", 8},
    {DType::kI32, "I32", "int32", 4},
    {DType::kI16, "I16", "int16", 2},
    {DType::kI8, "I8", "int8", 1},
    {DType::kU8, "U8", "uint8", 1},
    {DType::kBool, "BOOL", "bool", 1},
};

std::string KnownDTypeNames() {
  std::string s;
  for (const auto& e : kDTypes) {
    if (!s.empty()) s += ", ";
    s += e.name;
  }
  return s;
}

// Writes at most about `limit` characters of v. Each level of nesting adds a
// character before recursing, so the recursion is as shallow as the limit.
void Brief(const json& v, std::string& out, size_t limit) {
  if (out.size() > limit) return;
  if (v.is_array() || v.is_object()) {
    out += v.is_array() ? '[' : '{';
    bool first = true;
    for (auto it = v.begin(); it != v.end() && out.size() <= limit; ++it) {
      if (!first) out += ',';
      first = false;
      if (v.is_object()) out += json(it.key()).dump(-1, ' ', false, json::error_handler_t::replace) + ':';
      Brief(*it, out, limit);
    }
    out += v.is_array() ? ']' : '}';
    return;
  }
  out += v.dump(-1, ' ', false, json::error_handler_t::replace);
}

// Shortens what a header or config says before quoting it in a message, so a
// hostile file cannot fill a log line.
std::string Quote(const json& v) {
  std::string s;
  Brief(v, s, 80);
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

// Real headers and configs nest a few levels; refusing deep nesting before
// parsing (common/json_limits.h) keeps every later walk over the value (dump,
// compare, destroy) shallow whatever the input. Sizes are bounded by the
// readers (kMaxConfigBytes, the header length check), with their own messages.
Status CheckDepth(std::string_view text, const std::string& what, const std::string& fix) {
  Status limits = CheckJsonLimits(text, what, fix, SIZE_MAX);
  if (!limits.ok()) return Corrupt(limits.error().message());
  return Status::Ok();
}

std::string QuoteName(std::string_view name) {
  std::string s(name.substr(0, std::min<size_t>(name.size(), 200)));
  if (name.size() > 200) s += "...";
  return "'" + s + "'";
}

// pread until `len` bytes arrived; a short file is reported, not retried.
Status PreadFull(int fd, void* dst, uint64_t len, uint64_t offset, const std::string& path) {
  auto* p = static_cast<uint8_t*>(dst);
  uint64_t done = 0;
  while (done < len) {
    // Linux transfers at most ~2 GiB per call; ask for 1 GiB at a time.
    size_t want = static_cast<size_t>(std::min<uint64_t>(len - done, 1ull << 30));
    ssize_t n = ::pread(fd, p + done, want, static_cast<off_t>(offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(path + ": read of " + std::to_string(len) + " bytes at offset " +
                            std::to_string(offset) + " failed",
                        errno);
    }
    if (n == 0) {
      return Corrupt(path + ": the file ended at byte " + std::to_string(offset + done) + " while reading " +
                     std::to_string(len) + " bytes at offset " + std::to_string(offset) +
                     "; it shrank after it was opened (is something rewriting it?): restore the file");
    }
    done += static_cast<uint64_t>(n);
  }
  return Status::Ok();
}

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

// Reads and parses a small JSON file; `what` says what it is for messages.
Result<json> ReadJsonFile(const std::string& path, const char* fix) {
  auto text = ReadFile(path, kMaxConfigBytes);
  if (!text.ok()) {
    if (text.error().code() == Code::kIo) {
      struct stat st {};
      if (::stat(path.c_str(), &st) != 0 && errno == ENOENT) return NotFound(path + ": missing; " + fix);
    }
    return text.error();
  }
  WSUP_RETURN_IF_ERROR(CheckDepth(*text, path, fix));
  try {
    return json::parse(*text);
  } catch (const json::exception& e) {
    return Corrupt(path + ": not valid JSON (" + e.what() + "); " + fix);
  }
}

}  // namespace

Result<DType> ParseDType(std::string_view name) {
  for (const auto& e : kDTypes) {
    if (name == e.name) return e.dtype;
  }
  return Corrupt("unknown dtype " + QuoteName(name) + " (known: " + KnownDTypeNames() + ")");
}

const char* DTypeName(DType dtype) {
  for (const auto& e : kDTypes) {
    if (e.dtype == dtype) return e.name;
  }
  return "?";
}

size_t DTypeSize(DType dtype) {
  for (const auto& e : kDTypes) {
    if (e.dtype == dtype) return e.size;
  }
  return 0;
}

Result<DType> DTypeFromTorchName(std::string_view name) {
  std::string_view n = name;
  if (n.substr(0, 6) == "torch.") n.remove_prefix(6);
  for (const auto& e : kDTypes) {
    if (n == e.torch_name) return e.dtype;
  }
  if (n == "float") return DType::kF32;
  if (n == "half") return DType::kF16;
  return InvalidArgument(
      "unknown torch dtype " + QuoteName(name) +
      "; use one of float64, float32, float16, bfloat16, float8_e4m3fn, float8_e5m2, int64, "
      "int32, int16, int8, uint8, bool");
}

bool ModelConfig::IsMoeLayer(int64_t layer) const {
  if (num_experts <= 0) return false;
  if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) != mlp_only_layers.end()) return false;
  // Each family leaves the other's keys at their defaults, so the rules combine.
  return layer >= first_k_dense_replace && layer % moe_layer_freq == 0 &&
         (layer + 1) % decoder_sparse_step == 0;
}

int64_t TensorInfo::numel() const {
  uint64_t n = 1;  // unsigned: a hand-built TensorInfo must not make this undefined
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return static_cast<int64_t>(n);
}

namespace {

Status ParseMoeConfig(const json& j, const std::string& path, ModelConfig* c) {
  for (const char* key : {"num_experts", "num_local_experts", "n_routed_experts"}) {
    WSUP_ASSIGN_OR_RETURN(int64_t n, ConfigCount(j, key, 0, path));
    if (n > 0) {
      c->num_experts = n;
      break;
    }
  }
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
  c.json = std::string(json_text);
  return c;
}

Result<SafetensorsHeader> ParseSafetensorsHeader(const uint8_t* data, size_t len, uint64_t file_size,
                                                 const std::string& file_name) {
  const std::string& f = file_name;
  const std::string redownload = "the file is damaged or not a safetensors file: re-download it";
  if (file_size < 8) {
    return Corrupt(f + ": the file is " + std::to_string(file_size) +
                   " bytes, shorter than the 8-byte header length; the file is truncated: re-download it");
  }
  if (len < 8) {
    return Internal(f + ": only " + std::to_string(len) +
                    " bytes of the file were passed to the header parser");
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | data[i];  // little-endian
  if (n > file_size - 8) {
    return Corrupt(f + ": the header length " + std::to_string(n) + " runs past the file's " +
                   std::to_string(file_size) +
                   " bytes; the file is truncated or not a safetensors file: "
                   "re-download it");
  }
  if (n > kMaxSafetensorsHeaderBytes) {
    return Corrupt(f + ": the header length " + std::to_string(n) + " is more than the " +
                   std::to_string(kMaxSafetensorsHeaderBytes) + " bytes wsup accepts; " + redownload);
  }
  if (n < 2) {
    return Corrupt(f + ": the header length is " + std::to_string(n) + ", too short for a JSON object; " +
                   redownload);
  }
  if (len - 8 < n) {
    return Internal(f + ": the header parser was given " + std::to_string(len) +
                    " bytes but the header needs " + std::to_string(8 + n));
  }
  const char* text = reinterpret_cast<const char*>(data + 8);

  // Duplicate keys would silently replace each other in the parsed object;
  // note them while parsing instead.
  std::string duplicate;
  std::set<std::string> seen;
  json::parser_callback_t cb = [&](int depth, json::parse_event_t ev, json& parsed) {
    if (ev == json::parse_event_t::key && depth == 1 && parsed.is_string() && duplicate.empty()) {
      if (!seen.insert(parsed.get<std::string>()).second) duplicate = parsed.get<std::string>();
    }
    return true;
  };
  WSUP_RETURN_IF_ERROR(CheckDepth(std::string_view(text, n), f + ": the header", "not a safetensors header; " + redownload));
  json h;
  try {
    h = json::parse(text, text + n, cb);
  } catch (const json::exception& e) {
    return Corrupt(f + ": the header is not valid JSON (" + e.what() + "); " + redownload);
  }
  if (!h.is_object()) {
    return Corrupt(f + ": the header is " + Quote(h) + ", not a JSON object of tensors; " + redownload);
  }
  if (!duplicate.empty()) {
    return Corrupt(f + ": tensor " + QuoteName(duplicate) + " appears twice in the header; " + redownload);
  }

  SafetensorsHeader out;
  out.header_len = n;
  const uint64_t data_start = 8 + n;
  const uint64_t data_size = file_size - data_start;
  out.tensors.reserve(h.size());
  for (auto it = h.begin(); it != h.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      bool strings = v.is_object();
      for (auto m = v.begin(); strings && m != v.end(); ++m) strings = m->is_string();
      if (!strings) {
        return Corrupt(f + ": __metadata__ is " + Quote(v) + ", not an object of strings; " + redownload);
      }
      out.metadata_json = v.dump(-1, ' ', false, json::error_handler_t::replace);
      continue;
    }
    const std::string t = f + ": tensor " + QuoteName(name);
    if (!v.is_object()) return Corrupt(t + ": entry is " + Quote(v) + ", not an object; " + redownload);
    auto dt = v.find("dtype");
    auto sh = v.find("shape");
    auto off = v.find("data_offsets");
    if (dt == v.end() || !dt->is_string()) {
      return Corrupt(t + ": 'dtype' is missing or not a string; " + redownload);
    }
    auto dtype = ParseDType(dt->get<std::string>());
    if (!dtype.ok()) {
      return Corrupt(t + ": " + dtype.error().message() +
                     "; the file was written for a format wsup does not read: convert the checkpoint to a "
                     "known dtype or re-download it");
    }
    if (sh == v.end() || !sh->is_array()) {
      return Corrupt(t + ": 'shape' is missing or not a list; " + redownload);
    }
    if (sh->size() > 16) {
      return Corrupt(t + ": 'shape' has " + std::to_string(sh->size()) + " dimensions, more than 16; " +
                     redownload);
    }
    TensorInfo info;
    info.name = name;
    info.dtype = *dtype;
    info.file = 0;
    uint64_t numel = 1;
    bool overflow = false;
    for (size_t d = 0; d < sh->size(); ++d) {
      const json& e = (*sh)[d];
      if (e.is_number_integer() && !e.is_number_unsigned()) {
        return Corrupt(t + ": dimension " + std::to_string(d) + " is " + Quote(e) + ", negative; " +
                       redownload);
      }
      if (!e.is_number_unsigned()) {
        return Corrupt(t + ": dimension " + std::to_string(d) + " is " + Quote(e) + ", not an integer; " +
                       redownload);
      }
      uint64_t dim = e.get<uint64_t>();
      if (dim > static_cast<uint64_t>(INT64_MAX)) {
        overflow = true;
      } else {
        info.shape.push_back(static_cast<int64_t>(dim));
        overflow = overflow || __builtin_mul_overflow(numel, dim, &numel);
      }
    }
    uint64_t nbytes = 0;
    if (overflow || __builtin_mul_overflow(numel, static_cast<uint64_t>(DTypeSize(*dtype)), &nbytes) ||
        numel > static_cast<uint64_t>(INT64_MAX)) {
      return Corrupt(t + ": shape " + Quote(*sh) + " holds more elements than 2^63 bytes can; " + redownload);
    }
    if (off == v.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
        !(*off)[1].is_number_unsigned()) {
      return Corrupt(t + ": 'data_offsets' is " + (off == v.end() ? std::string("missing") : Quote(*off)) +
                     ", not two non-negative integers [begin, end]; " + redownload);
    }
    uint64_t begin = (*off)[0].get<uint64_t>();
    uint64_t end = (*off)[1].get<uint64_t>();
    if (end < begin) {
      return Corrupt(t + ": data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                     "] end before they begin; " + redownload);
    }
    if (end - begin != nbytes) {
      return Corrupt(t + ": shape " + Quote(*sh) + " of " + DTypeName(*dtype) + " needs " +
                     std::to_string(nbytes) + " bytes but data_offsets [" + std::to_string(begin) + ", " +
                     std::to_string(end) + "] hold " + std::to_string(end - begin) + "; " + redownload);
    }
    if (end > data_size) {
      uint64_t abs_end = 0;
      if (__builtin_add_overflow(end, data_start, &abs_end)) abs_end = UINT64_MAX;
      return Corrupt(t + ": data ends at byte " + std::to_string(abs_end) + " past the file's " +
                     std::to_string(file_size) + " bytes; the file is truncated: re-download it");
    }
    info.offset = data_start + begin;
    info.nbytes = nbytes;
    out.tensors.push_back(std::move(info));
  }

  // Overlapping ranges would let one tensor's bytes alias another's; sort by
  // where they begin and compare neighbours.
  std::sort(out.tensors.begin(), out.tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.offset != b.offset ? a.offset < b.offset : a.nbytes < b.nbytes;
  });
  for (size_t i = 1; i < out.tensors.size(); ++i) {
    const TensorInfo& a = out.tensors[i - 1];
    const TensorInfo& b = out.tensors[i];
    if (b.offset < a.offset + a.nbytes && b.nbytes > 0 && a.nbytes > 0) {
      return Corrupt(f + ": tensor " + QuoteName(b.name) + " (bytes " +
                     std::to_string(b.offset - data_start) + ".." +
                     std::to_string(b.offset - data_start + b.nbytes) + ") overlaps tensor " +
                     QuoteName(a.name) + " (bytes " + std::to_string(a.offset - data_start) + ".." +
                     std::to_string(a.offset - data_start + a.nbytes) + "); " + redownload);
    }
  }
  return out;
}

namespace {

// One opened shard: its fd, size and parsed header.
struct OpenedFile {
  std::shared_ptr<int> fd;
  ShardFile file;
  SafetensorsHeader header;
};

std::shared_ptr<int> ShareFd(int fd) {
  return std::shared_ptr<int>(new int(fd), [](int* p) {
    if (*p >= 0) ::close(*p);
    delete p;
  });
}

// Opens one safetensors file and reads its header: one pread of the 8-byte
// length and one of the header; never tensor data.
Result<OpenedFile> OpenShard(const std::string& dir, const std::string& name) {
  OpenedFile o;
  o.file.name = name;
  o.file.path = JoinPath(dir, name);
  const std::string& path = o.file.path;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    if (e == ENOENT) {
      return NotFound(path + ": missing; the checkpoint is incomplete: re-download it");
    }
    return ErrnoError(path + ": cannot open", e);
  }
  o.fd = ShareFd(fd);
  struct stat st {};
  if (::fstat(fd, &st) != 0) return ErrnoError(path + ": cannot stat", errno);
  if (!S_ISREG(st.st_mode)) {
    return Corrupt(path + ": not a regular file; point the model path at a checkpoint folder of files");
  }
  o.file.size = static_cast<uint64_t>(st.st_size);
  uint8_t prefix[8] = {};
  if (o.file.size < 8) {
    auto r = ParseSafetensorsHeader(prefix, sizeof prefix, o.file.size, path);
    return r.error();
  }
  WSUP_RETURN_IF_ERROR(PreadFull(fd, prefix, 8, 0, path));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | prefix[i];
  // Bounds first, so a corrupt length never sizes an allocation.
  if (n > o.file.size - 8 || n > kMaxSafetensorsHeaderBytes) {
    auto r = ParseSafetensorsHeader(prefix, sizeof prefix, o.file.size, path);
    if (!r.ok()) return r.error();
  }
  std::vector<uint8_t> buf(8 + n);
  std::memcpy(buf.data(), prefix, 8);
  WSUP_RETURN_IF_ERROR(PreadFull(fd, buf.data() + 8, n, 8, path));
  WSUP_ASSIGN_OR_RETURN(o.header, ParseSafetensorsHeader(buf.data(), buf.size(), o.file.size, path));
  o.file.header_len = n;
  o.file.header_sha256 = Sha256Hex(buf.data() + 8, n);
  return o;
}

bool IsPlainFileName(const std::string& s) {
  return !s.empty() && s != "." && s != ".." && s.find('/') == std::string::npos &&
         s.find('\0') == std::string::npos;
}

}  // namespace

Result<Checkpoint> Checkpoint::Open(const std::string& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    return NotFound(dir + ": checkpoint folder not found; check the model path");
  }
  if (!S_ISDIR(st.st_mode)) {
    return InvalidArgument(dir +
                           ": not a folder; the model path names a checkpoint folder (config.json plus "
                           "*.safetensors)");
  }
  Checkpoint ck;
  ck.dir_ = dir;

  const std::string config_path = JoinPath(dir, kConfigFile);
  auto config_text = ReadFile(config_path, kMaxConfigBytes);
  if (!config_text.ok()) {
    if (::stat(config_path.c_str(), &st) != 0 && errno == ENOENT) {
      return NotFound(config_path +
                      ": missing; a Hugging Face checkpoint has config.json beside its weights: "
                      "copy it from the model repository");
    }
    return config_text.error();
  }
  WSUP_ASSIGN_OR_RETURN(ck.config_, ParseModelConfig(*config_text, config_path));

  const std::string index_path = JoinPath(dir, kIndexFile);
  std::vector<OpenedFile> opened;
  // weight_map from the index; empty for a single-file checkpoint.
  std::map<std::string, std::string> weight_map;
  bool have_index = ::stat(index_path.c_str(), &st) == 0;
  if (have_index) {
    const char* fix = "restore model.safetensors.index.json from the model repository";
    WSUP_ASSIGN_OR_RETURN(json idx, ReadJsonFile(index_path, fix));
    if (!idx.is_object() || !idx.contains("weight_map") || !idx["weight_map"].is_object()) {
      return Corrupt(index_path + ": has no 'weight_map' object; " + fix);
    }
    std::set<std::string> names;
    for (auto it = idx["weight_map"].begin(); it != idx["weight_map"].end(); ++it) {
      if (!it->is_string() || !IsPlainFileName(it->get<std::string>())) {
        return Corrupt(index_path + ": tensor " + QuoteName(it.key()) + " maps to " + Quote(*it) +
                       ", not a file name in the checkpoint folder; " + fix);
      }
      weight_map[it.key()] = it->get<std::string>();
      names.insert(it->get<std::string>());
    }
    if (names.empty()) return Corrupt(index_path + ": 'weight_map' names no tensors; " + fix);
    for (const std::string& name : names) {
      auto o = OpenShard(dir, name);
      if (!o.ok()) {
        if (o.error().code() == Code::kNotFound) {
          return NotFound(JoinPath(dir, name) + ": missing, but " + kIndexFile +
                          " names it; the download is incomplete: re-download the checkpoint");
        }
        return o.error();
      }
      opened.push_back(std::move(o).value());
    }
  } else {
    auto o = OpenShard(dir, kSingleFile);
    if (!o.ok()) {
      if (o.error().code() == Code::kNotFound) {
        return NotFound(dir + ": has neither " + kSingleFile + " nor " + kIndexFile +
                        "; point the model path at a Hugging Face safetensors checkpoint (convert .bin "
                        "checkpoints to safetensors first)");
      }
      return o.error();
    }
    opened.push_back(std::move(o).value());
  }

  for (size_t fi = 0; fi < opened.size(); ++fi) {
    OpenedFile& o = opened[fi];
    for (TensorInfo& t : o.header.tensors) {
      t.file = static_cast<int>(fi);
      auto [pos, inserted] = ck.by_name_.emplace(t.name, ck.tensors_.size());
      if (!inserted) {
        const TensorInfo& first = ck.tensors_[pos->second];
        return Corrupt(o.file.path + ": tensor " + QuoteName(t.name) + " is also in " +
                       opened[static_cast<size_t>(first.file)].file.path +
                       "; a tensor must be in exactly one shard: re-download the checkpoint");
      }
      ck.tensors_.push_back(std::move(t));
    }
  }
  if (have_index) {
    for (const TensorInfo& t : ck.tensors_) {
      const OpenedFile& o = opened[static_cast<size_t>(t.file)];
      auto w = weight_map.find(t.name);
      if (w == weight_map.end()) {
        return Corrupt(
            o.file.path + ": tensor " + QuoteName(t.name) + " is not named in " + kIndexFile +
            "; the index and the shards come from different downloads: re-download the checkpoint");
      }
      if (w->second != o.file.name) {
        return Corrupt(
            o.file.path + ": tensor " + QuoteName(t.name) + " is in this file but " + kIndexFile +
            " says it is in " + w->second +
            "; the index and the shards come from different downloads: re-download the checkpoint");
      }
    }
    for (const auto& [name, file] : weight_map) {
      if (ck.by_name_.count(name) == 0) {
        return Corrupt(JoinPath(dir, file) + ": tensor " + QuoteName(name) + " is named by " + kIndexFile +
                       " but absent from this file; the shard is from a different download: re-download it");
      }
    }
  }
  for (OpenedFile& o : opened) {
    ck.files_.push_back(std::move(o.file));
    ck.fds_.push_back(std::move(o.fd));
  }
  return ck;
}

const TensorInfo* Checkpoint::Find(std::string_view name) const {
  auto it = by_name_.find(std::string(name));
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

uint64_t Checkpoint::total_bytes() const {
  uint64_t n = 0;
  for (const auto& t : tensors_) n += t.nbytes;
  return n;
}

Status Checkpoint::ReadTensor(const TensorInfo& t, void* dst) const {
  auto s = ReadRange(t.file, t.offset, t.nbytes, dst);
  if (!s.ok()) return s.error().With("tensor " + QuoteName(t.name));
  return Status::Ok();
}

Status Checkpoint::ReadRange(int file, uint64_t offset, uint64_t len, void* dst) const {
  if (file < 0 || static_cast<size_t>(file) >= files_.size()) {
    return Internal(dir_ + ": read from file index " + std::to_string(file) + " but the checkpoint has " +
                    std::to_string(files_.size()) + " files");
  }
  const ShardFile& f = files_[static_cast<size_t>(file)];
  uint64_t end = 0;
  if (__builtin_add_overflow(offset, len, &end) || end > f.size) {
    return Internal(f.path + ": read of " + std::to_string(len) + " bytes at offset " +
                    std::to_string(offset) + " runs past the file's " + std::to_string(f.size) + " bytes");
  }
  return PreadFull(*fds_[static_cast<size_t>(file)], dst, len, offset, f.path);
}

}  // namespace wsup
