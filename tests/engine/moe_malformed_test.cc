// Malformed mixture-of-experts checkpoints through the real processes
// (issue 14, acceptance 4): a wsup-holder refuses each at startup with the
// refusal exit code, and a wsup-engine loading from disk exits, both with a
// message that names the tensor or key and says what to do. The checkpoint
// library's own refusals are spelled out in tests/checkpoint/
// moe_sharding_test.cc; here the processes must carry them out whole,
// without crashing (the sanitizer builds run the same test).
//
// Each case writes a checkpoint into a temporary folder: config.json
// (edited or not) and model.safetensors rewritten from the test checkpoint
// with one change; the other files are symlinks to the originals.
#include <signal.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors_writer.h"
#include "common/fs.h"
#include "holder/holder_app.h"
#include "tests/engine/engine_fixture.h"
#include "testkit/test_util.h"

namespace wsup {
namespace {

using namespace std::chrono_literals;
using nlohmann::json;
namespace fs = std::filesystem;

// The changes a case makes to a test checkpoint: `edit` may drop a tensor
// (return false) or change its shape (its bytes are then made up);
// `config` may change config.json.
struct Change {
  std::string model;
  std::function<bool(TensorToWrite&)> edit = [](TensorToWrite&) { return true; };
  std::function<void(json&)> config;
};

void WriteChanged(const Change& c, const std::string& dir) {
  const std::string src = test::TestData(c.model);
  auto ck = Checkpoint::Open(src);
  REQUIRE(ck.ok());
  std::vector<TensorToWrite> out;
  for (const TensorInfo& t : ck->tensors()) {
    TensorToWrite w{t.name, t.dtype, t.shape, std::string(t.nbytes, '\0'), {}};
    REQUIRE(ck->ReadTensor(t, w.data.data()).ok());
    if (!c.edit(w)) continue;
    size_t n = DTypeSize(w.dtype);
    for (int64_t d : w.shape) n *= static_cast<size_t>(d);
    if (n != w.data.size()) w.data.assign(n, '\x11');
    out.push_back(std::move(w));
  }
  REQUIRE(WriteSafetensors(dir + "/model.safetensors", out).ok());
  auto text = ReadFile(src + "/config.json");
  REQUIRE(text.ok());
  json j = json::parse(*text);
  if (c.config) c.config(j);
  REQUIRE(WriteFileAtomic(dir + "/config.json", j.dump(1)).ok());
  for (const auto& f : fs::directory_iterator(src)) {
    const std::string name = f.path().filename().string();
    if (name == "model.safetensors" || name == "config.json") continue;
    fs::create_symlink(f.path(), fs::path(dir) / name);
  }
}

// wsup-holder on the checkpoint, with `args` (TP and EP flags).
test::RunResult RunHolder(const test::TempDir& tmp, const std::string& model_dir,
                          const std::vector<std::string>& args = {}) {
  std::vector<std::string> a = {test::BinPath("wsup-holder"), "--model",   model_dir, "--socket",
                                tmp.Join("h.sock"),           "--backend", "host"};
  a.insert(a.end(), args.begin(), args.end());
  return test::Run(a, 60s);
}

test::RunResult RunEngine(const std::string& model_dir) {
  return test::Run({test::BinPath("wsup-engine"), "--model", model_dir, "--port", "0", "--kv-cache-mib", "4"},
                   60s);
}

void CheckSays(const test::RunResult& r, const std::vector<std::string>& needles) {
  for (const auto& n : needles) CHECK_THAT(r.output, Catch::Contains(n));
  // Refused, not crashed: a plain exit (a signal is 128 + it).
  CHECK(r.exit_code > 0);
  CHECK(r.exit_code < 128);
}

struct Case {
  const char* what;
  Change change;
  std::vector<std::string> says;
};

TEST_CASE(
    "moe: malformed checkpoints - wsup-holder refuses them at startup and wsup-engine from disk exits, "
    "both naming the tensor and the fix",
    "[moe]") {
  if (!test::HaveTestData("qwen3moe-tiny-f32") || !test::HaveTestData("deepseekv3-tiny-f32")) {
    WARN("SKIP: testdata/qwen3moe-tiny-f32 or deepseekv3-tiny-f32 is missing");
    return;
  }
  const std::vector<Case> cases = {
      {"an expert missing",
       {"qwen3moe-tiny-f32",
        [](TensorToWrite& t) { return t.name != "model.layers.1.mlp.experts.5.up_proj.weight"; }},
       {"expert 5 of layer 1 has no 'model.layers.1.mlp.experts.5.up_proj.weight'",
        "(config.json: 8 experts)", "re-download it"}},
      {"an expert of the wrong shape",
       {"deepseekv3-tiny-f32",
        [](TensorToWrite& t) {
          if (t.name == "model.layers.1.mlp.experts.2.down_proj.weight") t.shape = {256, 48};
          return true;
        }},
       {"tensor 'model.layers.1.mlp.experts.2.down_proj.weight' is [256, 48]", "has down_proj [256, 64]",
        "restore the matching config.json"}},
      {"a router of the wrong width",
       {"qwen3moe-tiny-f32",
        [](TensorToWrite& t) {
          if (t.name == "model.layers.0.mlp.gate.weight") t.shape = {7, 256};
          return true;
        }},
       {"router 'model.layers.0.mlp.gate.weight' is [7, 256], but a router over 8 experts and hidden_size "
        "256 is "
        "[8, 256]",
        "restore the matching config.json"}},
      {"e_score_correction_bias missing",
       {"deepseekv3-tiny-f32",
        [](TensorToWrite& t) { return t.name != "model.layers.1.mlp.gate.e_score_correction_bias"; }},
       {"layer 1 has a router but no 'model.layers.1.mlp.gate.e_score_correction_bias'", "re-download it"}},
  };
  for (const Case& c : cases) {
    SECTION(c.what) {
      test::TempDir tmp;
      const std::string dir = tmp.Join("ckpt");
      fs::create_directories(dir);
      WriteChanged(c.change, dir);
      INFO(c.what);
      {
        auto r = RunHolder(tmp, dir);
        INFO("wsup-holder:\n" << r.output);
        CHECK(r.exit_code == kHolderExitRefused);
        CheckSays(r, c.says);
      }
      {
        auto r = RunEngine(dir);
        INFO("wsup-engine:\n" << r.output);
        CheckSays(r, c.says);
        CHECK_THAT(r.output, Catch::Contains("wsup-engine: startup failed: " + dir));
      }
    }
  }
}

TEST_CASE(
    "moe: wsup-holder refuses an expert count that its EP size does not divide, naming both and the sizes "
    "that work",
    "[moe]") {
  if (!test::HaveTestData("qwen3moe-tiny-f32")) {
    WARN("SKIP: testdata/qwen3moe-tiny-f32 is missing");
    return;
  }
  // 6 experts (the files and config.json agree): EP 4 cannot share them out.
  Change six{"qwen3moe-tiny-f32",
             [](TensorToWrite& t) {
               if (t.name.find(".mlp.experts.6.") != std::string::npos) return false;
               if (t.name.find(".mlp.experts.7.") != std::string::npos) return false;
               if (t.name.find(".mlp.gate.weight") != std::string::npos) t.shape = {6, 256};
               return true;
             },
             [](json& j) { j["num_local_experts"] = 6; }};
  test::TempDir tmp;
  const std::string dir = tmp.Join("ckpt");
  fs::create_directories(dir);
  WriteChanged(six, dir);
  for (int rank : {0, 3}) {
    auto r = RunHolder(tmp, dir,
                       {"--tp-size", "4", "--tp-rank", std::to_string(rank), "--ep-size", "4", "--ep-rank",
                        std::to_string(rank)});
    INFO("rank " << rank << " wsup-holder:\n" << r.output);
    CHECK(r.exit_code == kHolderExitRefused);
    CheckSays(r, {"num_experts 6 is not divisible by ep_size 4",
                  "with expert parallelism (ep_size = tp_size): 1, 2",
                  "ep rank " + std::to_string(rank) + " of 4"});
  }
  // The same checkpoint at EP 2 divides: the holder comes up ready.
  test::TempDir tmp2;
  test::Proc h = test::StartHolder(tmp2, dir, tmp2.Join("h.sock"),
                                   {"--tp-size", "2", "--tp-rank", "1", "--ep-size", "2", "--ep-rank", "1"});
  INFO(h.Log());
  CHECK(h.ready);
  h.child.Kill(SIGTERM);
  CHECK(h.child.Wait(30s) >= 0);
}

}  // namespace
}  // namespace wsup
