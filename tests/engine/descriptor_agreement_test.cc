// One descriptor per family (checkpoint/architecture/): the holder's sharding
// plan, the checkpoint validation and the engine's weight binding (the CPU
// model and the CUDA rank both bind with BindWeights) must read the same
// descriptor and agree on every tensor. Were any of them to keep its own
// list of names, splits or shapes, one of the checks below would differ.
#include <catch2/catch.hpp>

#include <set>
#include <string>

#include "checkpoint/architecture/architecture.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/sharding.h"
#include "engine/model.h"
#include "engine/weights.h"
#include "testkit/test_util.h"

namespace wsup {
namespace {

bool IsScale(const std::string& name) {
  const std::string s = "_scale_inv";
  return name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
}

struct Case {
  const char* model;
  int tp;
  int ep;
};

}  // namespace

TEST_CASE("family descriptors: sharding, validation and the engine's binding read the same descriptor, tensor for tensor",
          "[moe]") {
  const Case cases[] = {
      {"llama-tiny-f32", 1, 1},       {"llama-tiny-f32", 2, 1},         {"llama-tiny-fp8-block", 1, 1},
      {"qwen3moe-tiny-f32", 1, 1},    {"qwen3moe-tiny-f32", 2, 1},      {"qwen3moe-tiny-f32", 2, 2},
      {"deepseekv3-tiny-f32", 1, 1},  {"deepseekv3-tiny-f32", 2, 2},    {"deepseekv3-tiny-fp8-block", 1, 1},
  };
  for (const Case& c : cases) {
    REQUIRE(test::HaveTestData(c.model));
    auto ckpt = Checkpoint::Open(test::TestData(c.model));
    REQUIRE(ckpt.ok());
    const Architecture* arch = FindArchitecture(ckpt->config().architecture);
    REQUIRE(arch != nullptr);

    // Validation: the checkpoint is what its descriptor says.
    CHECK(ValidateArchitecture(*ckpt, *arch).ok());
    // Every tensor of the checkpoint is known to the descriptor (scales go
    // with their weights).
    for (const TensorInfo& t : ckpt->tensors()) {
      if (IsScale(t.name)) continue;
      INFO(c.model << ": " << t.name);
      CHECK(arch->Match(t.name) != nullptr);
    }

    for (int rank = 0; rank < c.tp; ++rank) {
      INFO(c.model << " tp " << c.tp << " ep " << c.ep << " rank " << rank);
      const ShardSpec spec{c.tp, rank, c.ep, c.ep > 1 ? rank : 0};
      // Sharding: each tensor split as its descriptor rule says.
      auto plan = PlanShards(*ckpt, spec);
      REQUIRE(plan.ok());
      for (const ShardedTensor& s : *plan) {
        if (IsScale(s.name)) continue;
        const TensorRule* rule = arch->Match(s.name);
        REQUIRE(rule != nullptr);
        INFO(s.name);
        // One rank holds everything whole; under expert parallelism a rank
        // holds its experts whole.
        const bool whole = c.tp == 1 || (c.ep > 1 && rule->role == Role::kRoutedExpert);
        CHECK(s.split == (whole ? Split::kReplicate : rule->split));
      }

      // Binding: the engine's dims carry the very descriptor, and it binds
      // exactly the rank's tensors that the descriptor marks as bound, each
      // of the descriptor's shape with this rank's sizes (BindWeights
      // refuses any other shape).
      auto dims = engine::ModelDims::From(ckpt->config(), c.tp, rank, c.ep);
      REQUIRE(dims.ok());
      CHECK(dims->arch == arch);
      auto weights = engine::LoadWeightsFromDisk(*ckpt, spec, 1);
      REQUIRE(weights.ok());
      std::vector<std::string> bound;
      auto mw = engine::BindWeights(*dims, **weights, &bound);
      if (!mw.ok()) FAIL(mw.error().ToString());
      std::set<std::string> want;
      for (const auto& t : (*weights)->tensors()) {
        if (IsScale(t.name)) continue;
        const TensorRule* rule = arch->Match(t.name);
        REQUIRE(rule != nullptr);
        if (rule->use == Use::kBound) want.insert(t.name);
      }
      const std::set<std::string> got(bound.begin(), bound.end());
      CHECK(got.size() == bound.size());  // each tensor bound once
      CHECK(got == want);
      CHECK(!want.empty());
    }
  }
}

}  // namespace wsup
