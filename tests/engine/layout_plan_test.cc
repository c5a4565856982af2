// The reference engine's own layout (engine/layout_publish.h), planned from
// a real checkpoint: gate and up fused per layer, everything else kept, a
// valid manifest, and the written bytes where the plan says.
#include <catch2/catch.hpp>

#include <cstring>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "engine/layout_publish.h"
#include "testkit/test_util.h"
#include "tests/wire/wire_check.h"
#include "wire/manifest.h"

namespace wsup::engine {
namespace {

TEST_CASE("engine layout: gate and up fuse per layer into a valid manifest, bytes in place", "[engine][layout]") {
  auto ckpt = Checkpoint::Open(test::TestData("llama-tiny-f32"));
  REQUIRE(ckpt.ok());
  auto disk = LoadWeightsFromDisk(*ckpt, ShardSpec{1, 0}, 2);
  REQUIRE(disk.ok());
  uint64_t bytes = 0;
  std::vector<PlannedTensor> plan = PlanReferenceLayout(**disk, &bytes);
  const auto& tensors = (*disk)->tensors();
  const int64_t layers = ckpt->config().num_hidden_layers;
  REQUIRE(layers > 0);
  CHECK(plan.size() == tensors.size() - static_cast<size_t>(layers));

  Manifest m = test::HostManifest({{(bytes + 4095) / 4096 * 4096}});
  for (const auto& p : plan) m.entries.push_back(p.entry);
  REQUIRE(m.Validate().ok());
  size_t fused = 0;
  for (const auto& p : plan) {
    CHECK(p.entry.name.find("gate_proj") == std::string::npos);
    CHECK(p.entry.name.find("mlp.up_proj") == std::string::npos);
    if (p.entry.name.find("gate_up_proj") != std::string::npos) {
      ++fused;
      REQUIRE(p.parts.size() == 2);
      CHECK(p.entry.shape[0] == p.parts[0]->shape[0] * 2);
      CHECK(p.parts[0]->name.find("gate_proj") != std::string::npos);
      CHECK(p.parts[1]->name.find("up_proj") != std::string::npos);
    }
  }
  CHECK(fused == static_cast<size_t>(layers));
  CHECK(FusedGateUpName("model.layers.3.mlp.gate_proj.weight") == "model.layers.3.mlp.gate_up_proj.weight");

  std::vector<uint8_t> buf(m.allocations[0].size);
  WriteReferenceLayout(plan, buf.data());
  for (const auto& p : plan) {
    uint64_t at = p.entry.offset;
    for (const WeightTensor* part : p.parts) {
      INFO(p.entry.name << " <- " << part->name);
      CHECK(std::memcmp(buf.data() + at, part->data, part->nbytes) == 0);
      at += part->nbytes;
    }
  }
  CHECK(ReferenceLayoutId().transform == "fuse_gate_up/v1");
  CHECK_FALSE(ReferenceLayoutId().version.empty());
}

}  // namespace
}  // namespace wsup::engine
