#include "engine/layout_publish.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>

#include "client/publish.h"

#ifndef WSUP_VERSION_STRING
#define WSUP_VERSION_STRING "0.0.0"
#endif

namespace wsup::engine {

namespace {

using Clock = std::chrono::steady_clock;
double MsSince(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

constexpr const char* kGateSuffix = "mlp.gate_proj.weight";
constexpr const char* kUpSuffix = "mlp.up_proj.weight";

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The up_proj that fuses with this gate_proj, or nullptr.
const WeightTensor* FusablePartner(const WeightSource& w, const WeightTensor& gate) {
  if (!EndsWith(gate.name, kGateSuffix) || gate.shape.size() != 2 || gate.dtype == DType::kF8E4M3) return nullptr;
  const std::string up_name = gate.name.substr(0, gate.name.size() - std::strlen(kGateSuffix)) + kUpSuffix;
  const WeightTensor* up = w.Find(up_name);
  if (up == nullptr || up->dtype != gate.dtype || up->shape != gate.shape) return nullptr;
  return up;
}

bool TestHookStopsAfterAlloc() {
  const char* hook = std::getenv("WSUP_ENGINE_TEST_HOOK");
  return hook != nullptr && std::string(hook) == "stop_after_alloc";
}

}  // namespace

EngineLayoutId ReferenceLayoutId() { return EngineLayoutId{"wsup-engine", WSUP_VERSION_STRING, "fuse_gate_up/v1"}; }

std::string FusedGateUpName(const std::string& gate_name) {
  return gate_name.substr(0, gate_name.size() - std::strlen(kGateSuffix)) + "mlp.gate_up_proj.weight";
}

std::vector<PlannedTensor> PlanReferenceLayout(const WeightSource& w, uint64_t* bytes) {
  std::vector<PlannedTensor> plan;
  uint64_t at = 0;
  auto place = [&](PlannedTensor p) {
    p.entry.alloc = 0;
    p.entry.offset = at;
    at += (p.entry.nbytes + Manifest::kTensorAlignment - 1) / Manifest::kTensorAlignment * Manifest::kTensorAlignment;
    plan.push_back(std::move(p));
  };
  for (const WeightTensor& t : w.tensors()) {
    if (EndsWith(t.name, kUpSuffix)) {
      // Fused into its gate_proj's tensor when they fuse.
      const std::string gate_name = t.name.substr(0, t.name.size() - std::strlen(kUpSuffix)) + kGateSuffix;
      const WeightTensor* gate = w.Find(gate_name);
      if (gate != nullptr && FusablePartner(w, *gate) == &t) continue;
    }
    PlannedTensor p;
    p.entry.dtype = DTypeName(t.dtype);
    if (const WeightTensor* up = FusablePartner(w, t)) {
      p.entry.name = FusedGateUpName(t.name);
      p.entry.shape = {t.shape[0] + up->shape[0], t.shape[1]};
      p.entry.nbytes = t.nbytes + up->nbytes;
      p.parts = {&t, up};
    } else {
      p.entry.name = t.name;
      p.entry.shape = t.shape;
      p.entry.nbytes = t.nbytes;
      p.parts = {&t};
    }
    place(std::move(p));
  }
  *bytes = std::max<uint64_t>(at, Manifest::kTensorAlignment);
  return plan;
}

void WriteReferenceLayout(const std::vector<PlannedTensor>& plan, void* base) {
  for (const PlannedTensor& p : plan) {
    auto* dst = static_cast<uint8_t*>(base) + p.entry.offset;
    for (const WeightTensor* part : p.parts) {
      std::memcpy(dst, part->data, part->nbytes);
      dst += part->nbytes;
    }
  }
}

Result<RankLayout> AcquireRankLayout(const Checkpoint& ckpt, const ShardSpec& shard, const Fingerprint& fp,
                                     const AttachOptions& opts, uint64_t wait_ms, int read_threads) {
  const bool daemon = opts.mode == AttachMode::kDaemon;
  RankLayout out;
  auto t0 = Clock::now();
  WSUP_ASSIGN_OR_RETURN(LayoutResult res, AttachOrPublish(opts, fp, wait_ms));
  out.attach_ms = MsSince(t0);
  if (res.attachment) {
    WSUP_ASSIGN_OR_RETURN(out.weights, WeightsFromAttachment(std::move(res.attachment)));
    return out;
  }
  if (!res.publication) {
    out.miss_reason = res.outcome.reason;  // client mode: load from disk
    return out;
  }
  // This engine writes the layout.
  Publication& pub = *res.publication;
  auto fail = [&](const Error& e) -> Result<RankLayout> {
    Status aborted = pub.Abort(e.message().substr(0, 200));
    if (!aborted.ok()) spdlog::warn("layout publish: the abort failed too: {}", aborted.error().message());
    if (daemon) return e.With("publishing the engine layout to " + opts.socket_path);
    out.miss_reason = "publishing the engine layout failed: " + e.message();
    return std::move(out);
  };
  auto t_load = Clock::now();
  auto disk = LoadWeightsFromDisk(ckpt, shard, read_threads);
  if (!disk.ok()) return disk.error();  // the checkpoint itself is bad: disk would fail too
  uint64_t bytes = 0;
  std::vector<PlannedTensor> plan = PlanReferenceLayout(**disk, &bytes);
  auto region = pub.Allocate(bytes);
  if (!region.ok()) return fail(region.error());
  if (TestHookStopsAfterAlloc()) {
    spdlog::warn("WSUP_ENGINE_TEST_HOOK=stop_after_alloc: stopping for good after the holder granted {} bytes, "
                 "before writing (a test kills this engine now)",
                 region->size);
    for (;;) ::pause();
  }
  WriteReferenceLayout(plan, region->data);
  std::vector<ManifestEntry> entries;
  entries.reserve(plan.size());
  for (const PlannedTensor& p : plan) entries.push_back(p.entry);
  auto committed = pub.Commit(std::move(entries));
  if (!committed.ok()) return fail(committed.error());
  out.load_ms = MsSince(t_load);
  out.published = true;
  WSUP_ASSIGN_OR_RETURN(out.weights, WeightsFromAttachment(std::move(committed->attachment)));
  spdlog::info("published the engine layout ({} tensors from {}, {} bytes, transform {}) to {} in {:.1f} ms",
               plan.size(), (*disk)->tensors().size(), bytes, ReferenceLayoutId().transform, opts.socket_path,
               out.load_ms);
  return out;
}

}  // namespace wsup::engine
