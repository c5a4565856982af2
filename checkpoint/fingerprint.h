// Fingerprint: everything that must match for an engine to use weights that
// a holder has resident. Computed before loading (from headers and config
// only) and compared field by field, so a miss says exactly which field
// differs and operators can fix it.
//
// Fields (all strings, so they compare and print the same everywhere):
//   model_path, architecture, revision, checkpoint (sha256 over every file's
//   name, size and header sha256), checkpoint_files, tp_size, tp_rank,
//   pp_size, pp_rank, dp_size, ep_size, ep_rank, quant_method, quant_config (sha256 of
//   the quantization_config JSON, or "none"), dtype, backend,
//   device_capability, cuda_driver, cuda_runtime, layout_version; and for an
//   engine-made layout (AddEngineLayout) also layout ("engine"), engine,
//   engine_version, transform.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "checkpoint/checkpoint.h"
#include "checkpoint/sharding.h"
#include "common/status.h"

namespace wsup {

// Version of the arena layout (alignment, ordering, manifest format). Bump it
// whenever a holder built from this source would lay tensors out differently.
inline constexpr int kArenaLayoutVersion = 1;

// What the fingerprint needs beyond the checkpoint: the deployment and device.
struct FingerprintInputs {
  std::string model_path;  // as configured (made absolute by the caller)
  std::string revision;    // operator-supplied revision label, "" if none
  ShardSpec shard;         // tp and ep size and rank
  int pp_size = 1, pp_rank = 0, dp_size = 1;
  std::string backend;            // "host" or "cuda"
  std::string device_capability;  // "9.0", or "cpu"
  std::string cuda_driver;        // e.g. "13000", or "none"
  std::string cuda_runtime;       // e.g. "13000", or "none"
};

struct FingerprintDiff {
  std::string field;
  std::string ours;    // the asker's value
  std::string theirs;  // the holder's value
};

class Fingerprint {
 public:
  static Fingerprint Compute(const Checkpoint& ckpt, const FingerprintInputs& in);

  const std::vector<std::pair<std::string, std::string>>& fields() const { return fields_; }
  // Value of a field, or "" when absent.
  std::string Get(const std::string& field) const;
  void Set(const std::string& field, const std::string& value);

  // Every field whose value differs, or that one side lacks, in field order.
  std::vector<FingerprintDiff> Compare(const Fingerprint& theirs) const;
  // "tp_rank: ours=1 holder=0; dtype: ours=bfloat16 holder=float32"
  static std::string DescribeDiffs(const std::vector<FingerprintDiff>& diffs);

  nlohmann::json ToJson() const;
  // Refuses anything but an object of string values, naming the bad field.
  static Result<Fingerprint> FromJson(const nlohmann::json& j);

 private:
  std::vector<std::pair<std::string, std::string>> fields_;
};

// What an engine declares about a layout it makes from a checkpoint (a
// holder started with --layout engine keeps one such layout per
// fingerprint): its name, its version or build, and its transform in its
// own words (fusions, repacking, quantization; e.g. "fuse_gate_up/v1").
// Whatever the engine changes in how it lays weights out must change one
// of these, so that a reader only ever gets a layout it computes from.
struct EngineLayoutId {
  std::string engine;     // e.g. "wsup-engine"
  std::string version;    // a version or build id
  std::string transform;  // "" only for a layout that is the checkpoint's own
};
// Adds (or replaces) the fields layout = "engine", engine, engine_version
// and transform to a checkpoint's fingerprint, which keeps naming the
// checkpoint's identity: another revision is another layout.
void AddEngineLayout(Fingerprint* fp, const EngineLayoutId& id);
// True for a fingerprint with layout = "engine".
bool IsEngineLayout(const Fingerprint& fp);

}  // namespace wsup
