// The reference engine's own layout (--layout engine): the tensors it
// prefers to compute from, published once into a holder of engine-made
// layouts (holder --layout engine; client/publish.h) and attached by every
// engine after it.
//
// The transform ("fuse_gate_up/v1"): each layer's gate_proj and up_proj
// (rows of the same width and dtype) become one gate_up_proj with the gate
// rows first, so the MLP's two input projections are one contiguous matrix
// (as vLLM and SGLang lay them out); every other tensor is the rank's
// shard as sharding.h plans it. Block-FP8 projections stay separate (their
// scales would need fusing too). BindWeights (engine/model.h) reads either
// layout, so an engine computes the same from the checkpoint's tensors and
// from its own.
//
// Test hook (tests only, never in production): with the environment
// variable WSUP_ENGINE_TEST_HOOK=stop_after_alloc a publishing engine stops
// for good right after the holder granted its memory, before writing, so a
// test can kill a writer mid-publish deterministically. The engine then
// never becomes ready; SIGKILL ends it.
//
// Called once at startup, from the startup thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/fingerprint.h"
#include "client/client.h"
#include "common/status.h"
#include "engine/weights.h"
#include "wire/manifest.h"

namespace wsup::engine {

// name "wsup-engine", the build's version, transform "fuse_gate_up/v1".
EngineLayoutId ReferenceLayoutId();

// "model.layers.N.mlp.gate_up_proj.weight" for "model.layers.N.mlp.gate_proj.weight".
std::string FusedGateUpName(const std::string& gate_name);

// One tensor of the layout and the tensors whose rows it holds, in order.
struct PlannedTensor {
  ManifestEntry entry;
  std::vector<const WeightTensor*> parts;
};

// The layout of a rank's tensors in one allocation (alloc 0), each aligned
// to Manifest::kTensorAlignment; *bytes gets the allocation's size.
std::vector<PlannedTensor> PlanReferenceLayout(const WeightSource& w, uint64_t* bytes);

// Copies every tensor's parts to base + its offset.
void WriteReferenceLayout(const std::vector<PlannedTensor>& plan, void* base);

// What one rank's engine-layout acquisition came to.
struct RankLayout {
  std::unique_ptr<WeightSource> weights;  // null when the caller must load from disk
  bool published = false;                 // this engine wrote the layout
  std::string miss_reason;                // client mode, weights null: why
  double attach_ms = 0;                   // asking, waiting, mapping
  double load_ms = 0;                     // publishing: read from disk, write, commit
};

// Attaches the rank's committed layout, or publishes it (loads the rank
// from disk, writes the layout into the holder's grant, commits, attaches
// the result), or, in client mode on any failure, says why to load from
// disk. Daemon mode: every failure is an Error.
Result<RankLayout> AcquireRankLayout(const Checkpoint& ckpt, const ShardSpec& shard, const Fingerprint& fp,
                                     const AttachOptions& opts, uint64_t wait_ms, int read_threads);

}  // namespace wsup::engine
