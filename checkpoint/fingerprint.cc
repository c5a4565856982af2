#include "checkpoint/fingerprint.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "common/sha256.h"

namespace wsup {

namespace {

// The canonical order: fields print and compare in this order, and FromJson
// restores it whatever order the JSON object had.
constexpr const char* kFieldOrder[] = {
    "model_path", "architecture",      "revision",     "checkpoint",   "checkpoint_files",
    "tp_size",    "tp_rank",           "pp_size",      "pp_rank",      "dp_size",
    "ep_size",    "ep_rank",           "quant_method", "quant_config", "dtype",
    "backend",    "device_capability", "cuda_driver",  "cuda_runtime", "layout_version",
    // An engine-made layout's (AddEngineLayout).
    "layout",     "engine",            "engine_version", "transform",
};

// One line per file so that renaming, resizing or rewriting any header
// changes the digest, while tensor bytes are never read.
std::string CheckpointDigest(const Checkpoint& ckpt) {
  Sha256 h;
  for (const ShardFile& f : ckpt.files()) {
    std::string line = f.name + '\0' + std::to_string(f.size) + '\0' + f.header_sha256 + '\n';
    h.Update(line.data(), line.size());
  }
  return h.FinishHex();
}

}  // namespace

Fingerprint Fingerprint::Compute(const Checkpoint& ckpt, const FingerprintInputs& in) {
  const ModelConfig& c = ckpt.config();
  Fingerprint fp;
  auto add = [&](const char* k, std::string v) { fp.fields_.emplace_back(k, std::move(v)); };
  add("model_path", in.model_path);
  add("architecture", c.architecture);
  add("revision", in.revision);
  add("checkpoint", CheckpointDigest(ckpt));
  add("checkpoint_files", std::to_string(ckpt.files().size()));
  add("tp_size", std::to_string(in.shard.tp_size));
  add("tp_rank", std::to_string(in.shard.tp_rank));
  add("pp_size", std::to_string(in.pp_size));
  add("pp_rank", std::to_string(in.pp_rank));
  add("dp_size", std::to_string(in.dp_size));
  add("ep_size", std::to_string(in.shard.ep_size));
  add("ep_rank", std::to_string(in.shard.ep_rank));
  add("quant_method", c.quant.method);
  add("quant_config", c.quant.json_sha256.empty() ? "none" : c.quant.json_sha256);
  add("dtype", c.torch_dtype.empty() ? "unspecified" : c.torch_dtype);
  add("backend", in.backend);
  add("device_capability", in.device_capability);
  add("cuda_driver", in.cuda_driver);
  add("cuda_runtime", in.cuda_runtime);
  add("layout_version", std::to_string(kArenaLayoutVersion));
  return fp;
}

void AddEngineLayout(Fingerprint* fp, const EngineLayoutId& id) {
  fp->Set("layout", "engine");
  fp->Set("engine", id.engine);
  fp->Set("engine_version", id.version);
  fp->Set("transform", id.transform);
}

bool IsEngineLayout(const Fingerprint& fp) { return fp.Get("layout") == "engine"; }

std::string Fingerprint::Get(const std::string& field) const {
  for (const auto& [k, v] : fields_) {
    if (k == field) return v;
  }
  return "";
}

void Fingerprint::Set(const std::string& field, const std::string& value) {
  for (auto& [k, v] : fields_) {
    if (k == field) {
      v = value;
      return;
    }
  }
  fields_.emplace_back(field, value);
}

std::vector<FingerprintDiff> Fingerprint::Compare(const Fingerprint& theirs) const {
  constexpr const char* kAbsent = "(absent)";
  std::vector<FingerprintDiff> diffs;
  auto find = [](const Fingerprint& fp, const std::string& k) -> const std::string* {
    for (const auto& [key, v] : fp.fields_) {
      if (key == k) return &v;
    }
    return nullptr;
  };
  for (const auto& [k, v] : fields_) {
    const std::string* o = find(theirs, k);
    if (!o) {
      diffs.push_back({k, v, kAbsent});
    } else if (*o != v) {
      diffs.push_back({k, v, *o});
    }
  }
  for (const auto& [k, v] : theirs.fields_) {
    if (!find(*this, k)) diffs.push_back({k, kAbsent, v});
  }
  return diffs;
}

std::string Fingerprint::DescribeDiffs(const std::vector<FingerprintDiff>& diffs) {
  std::string s;
  for (const FingerprintDiff& d : diffs) {
    if (!s.empty()) s += "; ";
    s += d.field + ": ours=" + d.ours + " holder=" + d.theirs;
  }
  return s;
}

nlohmann::json Fingerprint::ToJson() const {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [k, v] : fields_) j[k] = v;
  return j;
}

Result<Fingerprint> Fingerprint::FromJson(const nlohmann::json& j) {
  if (!j.is_object()) {
    return InvalidArgument("fingerprint is a JSON " + std::string(j.type_name()) +
                           ", not an object of strings; send the object that Fingerprint::ToJson() writes");
  }
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (!it->is_string()) {
      return InvalidArgument("fingerprint field '" + it.key() + "' is a JSON " +
                             std::string(it->type_name()) + ", not a string; send every field as a string");
    }
  }
  Fingerprint fp;
  for (const char* k : kFieldOrder) {
    auto it = j.find(k);
    if (it != j.end()) fp.fields_.emplace_back(k, it->get<std::string>());
  }
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (std::find_if(std::begin(kFieldOrder), std::end(kFieldOrder),
                     [&](const char* k) { return it.key() == k; }) == std::end(kFieldOrder)) {
      fp.fields_.emplace_back(it.key(), it->get<std::string>());
    }
  }
  return fp;
}

}  // namespace wsup
