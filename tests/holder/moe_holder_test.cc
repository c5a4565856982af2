// Mixture-of-experts checkpoints through real wsup-holder processes: every
// rank of a TP or EP group loads its slice and `wsup cache verify` finds it
// byte for byte in the checkpoint; an engine that disagrees on ep_size or
// ep_rank is a mismatch naming the field; splits the checkpoint cannot take
// are refused at start with the sizes that work.
#include <signal.h>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "client/client.h"
#include "gpu/local_fingerprint.h"
#include "holder/holder_app.h"
#include "supervisor/cache_commands.h"
#include "tests/holder/holder_fixture.h"

namespace wsup {
namespace {

using namespace std::chrono_literals;
using test::HolderProcess, test::StartHolder, test::TempDir;

struct Group {
  int tp;
  bool ep;
};

std::vector<std::string> RankArgs(const std::string& path, const Group& g, int r) {
  std::vector<std::string> a = {"--model",        path, "--tp-size", std::to_string(g.tp), "--tp-rank",
                                std::to_string(r)};
  if (g.ep) a.insert(a.end(), {"--ep-size", std::to_string(g.tp), "--ep-rank", std::to_string(r)});
  return a;
}

// Starts every rank of the group, verifies each against the checkpoint and
// checks that together they hold every tensor: the non-expert ones on every
// rank, each routed expert's on exactly one rank under EP.
void VerifyGroup(const std::string& model, const Group& g) {
  const std::string path = test::TestData(model);
  auto ck = Checkpoint::Open(path);
  REQUIRE(ck.ok());
  size_t experts = 0;
  for (const TensorInfo& t : ck->tensors()) experts += t.name.find(".mlp.experts.") != std::string::npos;
  const size_t others = ck->tensors().size() - experts;

  TempDir dir;
  std::vector<HolderProcess> ranks;
  for (int r = 0; r < g.tp; ++r)
    ranks.push_back(StartHolder(dir, "r" + std::to_string(r), RankArgs(path, g, r)));
  uint64_t verified = 0;
  for (int r = 0; r < g.tp; ++r) {
    HolderProcess& h = ranks[static_cast<size_t>(r)];
    INFO(model << " tp " << g.tp << (g.ep ? " ep" : "") << " rank " << r << "\n" << h.Log());
    REQUIRE(h.WaitReady(60s));
    CommandOutput v = CacheVerifyCommand(h.socket, path, /*json=*/true);
    INFO(v.out << v.err);
    REQUIRE(v.exit_code == kCacheExitOk);
    auto j = nlohmann::json::parse(v.out);
    CHECK(j["ok"] == true);
    CHECK(j["verified"] == j["tensors"]);
    CHECK(j["missing"].empty());
    CHECK(j["fingerprint_diffs"].empty());
    const size_t want = g.ep ? others + experts / static_cast<size_t>(g.tp) : others + experts;
    CHECK(j["tensors"].get<size_t>() == want);
    verified += j["verified"].get<uint64_t>();
  }
  CHECK(verified == (g.ep ? others * static_cast<size_t>(g.tp) + experts
                          : (others + experts) * static_cast<size_t>(g.tp)));
  for (HolderProcess& h : ranks) {
    h.child.Kill(SIGTERM);
    CHECK(h.child.Wait(30s) >= 0);
  }
}

TEST_CASE("cache verify passes on every rank of TP 1, 2, 4 and EP 2 groups of the MoE checkpoints",
          "[holder][moe]") {
  for (const char* model : {"qwen3moe-tiny-f32", "qwen3moe-tiny-bf16-sharded", "deepseekv3-tiny-f32"}) {
    if (!test::HaveTestData(model)) {
      WARN("SKIP: no test data " << model);
      continue;
    }
    for (Group g : {Group{1, false}, Group{2, false}, Group{4, false}, Group{2, true}}) VerifyGroup(model, g);
  }
}

TEST_CASE("block-FP8 MoE checkpoints: TP 1 verifies, TP 2 and EP 2 are refused naming the block",
          "[holder][moe]") {
  for (const char* model : {"qwen3moe-tiny-fp8-block", "deepseekv3-tiny-fp8-block"}) {
    if (!test::HaveTestData(model)) continue;
    VerifyGroup(model, Group{1, false});
    for (Group g : {Group{2, false}, Group{2, true}}) {
      TempDir dir;
      HolderProcess h = StartHolder(dir, "r1", RankArgs(test::TestData(model), g, 1));
      CHECK_FALSE(h.WaitReady(60s));
      REQUIRE(h.child.Wait(30s) >= 0);
      std::string log = h.Log();
      INFO(model << (g.ep ? " ep 2" : " tp 2") << "\n" << log);
      CHECK(h.child.exit_code() == kHolderExitRefused);
      CHECK_THAT(log, Catch::Contains("which cuts through its 128x128 FP8 scale blocks"));
      CHECK_THAT(log, Catch::Contains("rank 1's"));
      CHECK_THAT(log, Catch::Contains("tp sizes this checkpoint can use: 1; with expert parallelism "
                                      "(ep_size = tp_size): 1"));
      CHECK_THAT(log, Catch::Contains(g.ep ? "ep rank 1 of 2" : "tp rank 1 of 2"));
    }
  }
}

TEST_CASE("an engine that disagrees with the holder on ep_size or ep_rank is a mismatch naming it",
          "[holder][moe]") {
  const std::string model = "qwen3moe-tiny-f32";
  if (!test::HaveTestData(model)) return;
  const std::string path = test::TestData(model);
  TempDir dir;
  HolderProcess h = StartHolder(dir, "r1", RankArgs(path, Group{2, true}, 1));
  INFO(h.Log());
  REQUIRE(h.WaitReady(60s));
  auto fp = [&](ShardSpec s) {
    auto in = LocalFingerprintInputs(path, "", s, "host", 0);
    REQUIRE(in.ok());
    auto f = ComputeFingerprint(path, *in);
    REQUIRE(f.ok());
    return *f;
  };
  AttachOptions o;
  o.socket_path = h.socket;
  o.mode = AttachMode::kDaemon;
  o.client_name = "test-engine";
  auto tp_only = Attach(o, fp(ShardSpec{2, 1}));
  REQUIRE_FALSE(tp_only.ok());
  CHECK(tp_only.error().code() == Code::kMismatch);
  CHECK_THAT(tp_only.error().message(), Catch::Contains("ep_size: ours=1 holder=2"));
  CHECK_THAT(tp_only.error().message(), Catch::Contains("ep_rank: ours=0 holder=1"));
  auto same = Attach(o, fp(ShardSpec{2, 1, 2, 1}));
  INFO((same.ok() ? std::string() : same.error().ToString()));
  REQUIRE(same.ok());
  REQUIRE(same->attachment);
  CHECK(same->attachment->Find("model.layers.0.mlp.experts.4.up_proj.weight").entry != nullptr);
  CHECK(same->attachment->Find("model.layers.0.mlp.experts.3.up_proj.weight").entry == nullptr);
  same->attachment.reset();
  h.child.Kill(SIGTERM);
  CHECK(h.child.Wait(30s) >= 0);
}

TEST_CASE("wsup-holder refuses --ep-size and --ep-rank that do not fit the TP group", "[holder][moe]") {
  const std::string model = "qwen3moe-tiny-f32";
  if (!test::HaveTestData(model)) return;
  const std::string path = test::TestData(model);
  struct Bad {
    std::vector<std::string> args;
    const char* says;
  };
  for (const Bad& b :
       {Bad{{"--tp-size", "2", "--tp-rank", "0", "--ep-size", "4"}, "use --ep-size 2"},
        Bad{{"--tp-size", "2", "--tp-rank", "1", "--ep-size", "2", "--ep-rank", "0"}, "pass --ep-rank 1"},
        Bad{{"--tp-size", "2", "--tp-rank", "1", "--ep-rank", "1"}, "without --ep-size"}}) {
    TempDir dir;
    std::vector<std::string> args = {"--model", path};
    args.insert(args.end(), b.args.begin(), b.args.end());
    HolderProcess h = StartHolder(dir, "bad", args);
    CHECK_FALSE(h.WaitReady(30s));
    REQUIRE(h.child.Wait(30s) >= 0);
    INFO(h.Log());
    CHECK(h.child.exit_code() != 0);
    CHECK_THAT(h.Log(), Catch::Contains(b.says));
  }
}

}  // namespace
}  // namespace wsup
