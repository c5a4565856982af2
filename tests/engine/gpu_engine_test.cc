// The engine's CUDA path on a real GPU ([gpu]; skipped with a message
// elsewhere). Model level: the goldens and prompt logits of the f32 and
// block-FP8 checkpoints, decode steps replayed from CUDA graphs equal to
// eager ones. Process level: wsup-engine --device cuda:0 with weights from a
// cuda wsup-holder in daemon and client modes and from disk, the goldens
// over HTTP, 32 concurrent streams, the NCCL keepalive in status, and a
// holder SIGKILLed under the engine. The mixture-of-experts families
// (Qwen3-MoE, DeepSeek-V3, f32 and block FP8) likewise: goldens and prompt
// logits at model level with decode replayed from graphs, a wide batch
// through the cuBLAS path, and the goldens over HTTP with weights from disk
// and from a cuda holder in daemon and client modes.
//
// Run on a GPU node: build/tests/engine_gpu_test
#include <catch2/catch.hpp>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>
#include <thread>

#include "checkpoint/checkpoint.h"
#include "engine/cuda/cuda_engine.h"
#include "engine/cuda/kernels.h"
#include "engine/kv_memory.h"
#include "engine/runner.h"
#include "gpu/cuda_driver.h"
#include "tests/engine/engine_fixture.h"
#include "tests/engine/tiny_runner.h"
#include "tests/engine/golden.h"
#include "tests/gpu_skip.h"

using namespace std::chrono_literals;
using namespace wsup;
using namespace wsup::engine;
using nlohmann::json;
using wsup::test::Proc;
using wsup::test::TempDir;

namespace {

std::string NoGpuReason() {
  if (!CudaEngineBuilt()) return "this build has no CUDA engine (no CUDA Toolkit or NCCL at build time)";
  return wsup::test::NoGpuReason();
}

#define WSUP_GPU_OR_SKIP() WSUP_GPU_SKIP_IF(NoGpuReason(), "engine_gpu_test")

using test::Golden;
using test::LoadGolden;
using test::Top5;

std::unique_ptr<ModelRunner> GpuRunner(const std::string& model, int max_batch = 8,
                                       uint64_t dequant_scratch_bytes = kDefaultDequantScratchBytes,
                                       bool bf16_activations = false, bool float32_attention = false) {
  auto ckpt = Checkpoint::Open(test::TestData(model));
  REQUIRE(ckpt.ok());
  auto host = LoadWeightsFromDisk(*ckpt, ShardSpec{1, 0}, 2);
  REQUIRE(host.ok());
  auto dev = UploadWeights(std::move(*host), 0);
  if (!dev.ok()) FAIL(dev.error().ToString());
  std::vector<std::unique_ptr<engine::WeightSource>> w;
  w.push_back(std::move(*dev));
  RunnerOptions o;
  o.devices = {0};
  o.max_batch = max_batch;
  o.max_step_tokens = 256;
  o.dequant_scratch_bytes = dequant_scratch_bytes;
  o.bf16_activations = bf16_activations;
  o.float32_attention = float32_attention;
  auto runner = ModelRunner::Create(ckpt->config(), std::move(w), o);
  if (!runner.ok()) FAIL(runner.error().ToString());
  Status st = runner.value()->InitCommunicator();
  if (!st.ok()) FAIL(st.error().ToString());
  REQUIRE(runner.value()->AllocateKv(16 << 20, 16).ok());
  auto graphs = runner.value()->CaptureGraphs();
  if (!graphs.ok()) FAIL(graphs.error().ToString());
  CHECK(*graphs > 0);
  return std::move(runner.value());
}

int Argmax(const float* l, int64_t n) { return static_cast<int>(std::max_element(l, l + n) - l); }


// All golden prompts as sequences of one batch: one prompt step, then
// greedy decode steps with every sequence in the same step (the replayed
// graph path). Sequence i uses blocks from its own range.
std::vector<std::vector<int>> BatchedGreedy(ModelRunner& r, const std::vector<Golden>& gs, int n,
                                            std::vector<std::vector<float>>* prompt_logits) {
  const int64_t vocab = r.dims().vocab;
  const int per_seq = r.num_blocks() / static_cast<int>(gs.size());
  std::vector<std::vector<int32_t>> tables(gs.size());
  for (size_t i = 0; i < gs.size(); ++i) {
    for (int b = 0; b < per_seq; ++b) tables[i].push_back(static_cast<int32_t>(i) * per_seq + b);
  }
  StepBatch b;
  for (size_t i = 0; i < gs.size(); ++i) {
    b.block_tables.push_back(&tables[i]);
    for (size_t p = 0; p < gs[i].prompt_ids.size(); ++p) {
      b.tokens.push_back(gs[i].prompt_ids[p]);
      b.positions.push_back(static_cast<int32_t>(p));
      b.seq.push_back(static_cast<int32_t>(i));
    }
    b.logit_rows.push_back(static_cast<int32_t>(b.tokens.size() - 1));
  }
  std::vector<float> logits;
  REQUIRE(r.Step(b, &logits).ok());
  prompt_logits->clear();
  std::vector<std::vector<int>> out(gs.size());
  for (size_t i = 0; i < gs.size(); ++i) {
    prompt_logits->emplace_back(logits.begin() + static_cast<int64_t>(i) * vocab,
                                logits.begin() + static_cast<int64_t>(i + 1) * vocab);
  }
  for (int step = 0; step < n; ++step) {
    StepBatch d;
    for (size_t i = 0; i < gs.size(); ++i) {
      const int next = Argmax(logits.data() + static_cast<int64_t>(i) * vocab, vocab);
      out[i].push_back(next);
      d.block_tables.push_back(&tables[i]);
      d.tokens.push_back(next);
      d.positions.push_back(static_cast<int32_t>(gs[i].prompt_ids.size()) + step);
      d.seq.push_back(static_cast<int32_t>(i));
      d.logit_rows.push_back(static_cast<int32_t>(i));
    }
    if (step + 1 == n) break;
    REQUIRE(r.Step(d, &logits).ok());
  }
  return out;
}

// Cases whose smallest top-1/top-2 gap is under exact_margin are run and
// reported, not compared: a right float32 implementation may pick the other
// token there (the test data's README), as on the CPU (model_test.cc).
bool Compared(const Golden& g, double exact_margin, const std::vector<int>& out, const std::string& model) {
  if (g.margin >= exact_margin) return true;
  WARN(model << " prompt '" << g.prompt << "' (top-1/top-2 margin " << g.margin << ", under " << exact_margin
             << ", not compared): " << (out == g.output_ids ? "matches the golden" : "differs from the golden"));
  return false;
}

void CheckModel(const std::string& model, float first8_tol, double exact_margin = 0) {
  REQUIRE(test::HaveTestData(model));
  auto runner = GpuRunner(model);
  auto gs = LoadGolden(model);
  REQUIRE(gs.size() == 4);
  std::vector<std::vector<float>> prompt_logits;
  const uint64_t graph_before = runner->graph_steps();
  auto outs = BatchedGreedy(*runner, gs, 16, &prompt_logits);
  CHECK(runner->graph_steps() - graph_before == 15);  // every decode step replayed a graph
  int compared = 0;
  for (size_t i = 0; i < gs.size(); ++i) {
    INFO(model << " prompt '" << gs[i].prompt << "'");
    if (!Compared(gs[i], exact_margin, outs[i], model)) continue;
    ++compared;
    CHECK(outs[i] == gs[i].output_ids);
    if (!gs[i].top5.empty()) CHECK(Top5(prompt_logits[i]) == gs[i].top5);
    for (size_t k = 0; k < gs[i].first8.size(); ++k) CHECK(std::fabs(prompt_logits[i][k] - gs[i].first8[k]) < first8_tol);
  }
  CHECK(compared > 0);
}

const char* const kMoeModels[] = {"qwen3moe-tiny-f32", "qwen3moe-tiny-fp8-block", "deepseekv3-tiny-f32",
                                  "deepseekv3-tiny-fp8-block"};
// As the CPU tests: cases under this top-1/top-2 gap are reported only.
constexpr double kMoeExactMargin = 1e-3;

// The goldens over HTTP, compared as above.
void CheckHttpGoldens(int port, const std::string& model) {
  int compared = 0;
  for (const auto& g : LoadGolden(model)) {
    std::string err;
    auto out = wsup::test::Complete(port, g.prompt, 16, &err);
    INFO(model << " prompt '" << g.prompt << "' " << err);
    REQUIRE(out.size() == 16);
    if (!Compared(g, kMoeExactMargin, out, model)) continue;
    ++compared;
    CHECK(out == g.output_ids);
  }
  CHECK(compared > 0);
}

Proc StartCudaHolder(const TempDir& dir, const std::string& model, const std::string& sock) {
  return wsup::test::StartWithReadyFd({test::BinPath("wsup-holder"), "--model", test::TestData(model), "--socket", sock,
                                       "--backend", "cuda", "--device", "0", "--ready-fd", "3", "--log-level", "warn"},
                                      dir.Join("holder-" + model + ".log"));
}

}  // namespace

TEST_CASE("cuda engine: llama-tiny-f32 goldens and prompt logits, decode replayed from graphs", "[gpu]") {
  WSUP_GPU_OR_SKIP();
  CheckModel("llama-tiny-f32", 1e-3f);
}

TEST_CASE("cuda engine: llama-tiny-fp8-block goldens, decode replayed from graphs", "[gpu]") {
  WSUP_GPU_OR_SKIP();
  CheckModel("llama-tiny-fp8-block", 1e-2f);
}

TEST_CASE("cuda engine: Qwen3-MoE and DeepSeek-V3 goldens and prompt logits, f32 and block FP8, decode replayed from graphs",
          "[gpu][moe]") {
  WSUP_GPU_OR_SKIP();
  for (const char* model : kMoeModels) {
    INFO(model);
    const bool fp8 = std::string(model).find("fp8") != std::string::npos;
    CheckModel(model, fp8 ? 1e-2f : 1e-3f, kMoeExactMargin);
  }
}

TEST_CASE("cuda engine: MoE wide batches (cuBLAS path, more than 8 slots an expert) get the goldens", "[gpu][moe]") {
  WSUP_GPU_OR_SKIP();
  // 12 copies of the goldens: the dense products go through cuBLAS and each
  // expert gets more slots than the expert kernel takes at once.
  for (const std::string model : {"qwen3moe-tiny-f32", "deepseekv3-tiny-fp8-block"}) {
    auto runner = GpuRunner(model, 16);
    auto gs = LoadGolden(model);
    std::vector<Golden> many;
    for (int k = 0; k < 3; ++k) many.insert(many.end(), gs.begin(), gs.end());
    std::vector<std::vector<float>> logits;
    const uint64_t graph_before = runner->graph_steps();
    auto outs = BatchedGreedy(*runner, many, 16, &logits);
    CHECK(runner->graph_steps() - graph_before == 15);
    for (size_t i = 0; i < many.size(); ++i) {
      INFO(model << " sequence " << i);
      if (!Compared(many[i], kMoeExactMargin, outs[i], model)) continue;
      CHECK(outs[i] == many[i].output_ids);
    }
  }
}

TEST_CASE("cuda engine: MoE goldens over HTTP from disk and from a cuda holder in daemon and client modes",
          "[gpu][moe]") {
  WSUP_GPU_OR_SKIP();
  for (const char* model : kMoeModels) {
    TempDir dir;
    const std::string sock = dir.Join("h.sock");
    Proc holder = StartCudaHolder(dir, model, sock);
    INFO(model << "\n" << holder.Log());
    REQUIRE(holder.ready);
    for (const std::string mode : {"daemon", "client", "off"}) {
      std::vector<std::string> extra = {"--device", "cuda:0", "--weight-cache", mode};
      if (mode != "off") extra.insert(extra.end(), {"--socket", sock});
      Proc e = wsup::test::StartEngine(dir, model, extra, mode + ".log");
      INFO(model << " " << mode << "\n" << e.Log());
      REQUIRE(e.ready);
      CheckHttpGoldens(e.port, model);
      json st = wsup::test::GetJson(e.port, "/wsup/status");
      INFO(st.dump());
      CHECK(st["weights"]["source"] == (mode == "off" ? "disk" : "holder"));
      CHECK(st["steps"]["graph"].get<uint64_t>() > 0);
      e.child.Kill(SIGTERM);
      CHECK(e.child.Wait(20s) == 0);
    }
    holder.child.Kill(SIGTERM);
    CHECK(holder.child.Wait(20s) == 0);
  }
}

TEST_CASE("cuda engine: wide batches (cuBLAS path) equal narrow ones", "[gpu]") {
  WSUP_GPU_OR_SKIP();
  // 12 copies of the goldens in one batch: above the small-batch kernel's
  // limit, so prompt and decode products go through cuBLAS.
  auto runner = GpuRunner("llama-tiny-f32", 16);
  auto gs = LoadGolden("llama-tiny-f32");
  std::vector<Golden> many;
  for (int k = 0; k < 3; ++k) many.insert(many.end(), gs.begin(), gs.end());
  std::vector<std::vector<float>> logits;
  auto outs = BatchedGreedy(*runner, many, 16, &logits);
  for (size_t i = 0; i < many.size(); ++i) {
    INFO("sequence " << i);
    CHECK(outs[i] == many[i].output_ids);
  }
}

TEST_CASE("cuda engine: products over narrow weights in row slices (a one-byte scratch) equal whole ones", "[gpu]") {
  WSUP_GPU_OR_SKIP();
  // A one-byte bound leaves the scratch one scale block of the widest FP8
  // matrix: every widened product goes in slices, with a partial last one
  // where the rows are not a multiple. 12 copies of the prompts, so decode
  // goes through cuBLAS too. (bfloat16 weights are never widened.)
  for (const std::string model : {"llama-tiny-fp8-block", "deepseekv3-tiny-fp8-block"}) {
    INFO(model);
    auto gs = LoadGolden(model);
    std::vector<Golden> many;
    for (int k = 0; k < 3; ++k) many.insert(many.end(), gs.begin(), gs.end());
    std::vector<std::vector<float>> whole_logits, sliced_logits;
    auto whole = BatchedGreedy(*GpuRunner(model, 16), many, 16, &whole_logits);
    auto sliced = BatchedGreedy(*GpuRunner(model, 16, 1), many, 16, &sliced_logits);
    CHECK(sliced == whole);
    REQUIRE(sliced_logits.size() == whole_logits.size());
    float worst = 0;
    for (size_t i = 0; i < whole_logits.size(); ++i) {
      for (size_t k = 0; k < whole_logits[i].size(); ++k) {
        worst = std::max(worst, std::fabs(sliced_logits[i][k] - whole_logits[i][k]));
      }
    }
    INFO("largest prompt logit difference " << worst);
    CHECK(worst < 1e-3f);
  }
}

// Two long prompts fed in chunks as a scheduler makes them: a chunk of one
// sequence beside another's, a lone token, chunks across many KV blocks
// handed out in no order. Returns the logits of the chosen rows of each
// step, all steps appended.
std::vector<float> ChunkedPrompts(ModelRunner& r) {
  std::vector<std::vector<int32_t>> prompts(2);
  uint32_t x = 12345;
  for (int i = 0; i < 600; ++i) prompts[0].push_back(static_cast<int32_t>((x = x * 1103515245u + 12345u) >> 24));
  for (int i = 0; i < 333; ++i) prompts[1].push_back(static_cast<int32_t>((x = x * 1103515245u + 12345u) >> 24));
  // Sequence 0 takes even blocks from the top down, sequence 1 odd ones
  // from the bottom up.
  std::vector<std::vector<int32_t>> tables(2);
  const int top = (r.num_blocks() - 2) / 2 * 2;
  for (int b = 0; b < 40; ++b) {
    tables[0].push_back(static_cast<int32_t>(top - 2 * b));
    tables[1].push_back(static_cast<int32_t>(2 * b + 1));
  }
  // Steps of (sequence, from, to) chunks.
  // The fifth step's tiles read up to 600 keys: the tensor-core kernel
  // splits them over two blocks each (attention_tc.cu), and sequence 1's
  // tile (positions 300..309) has nothing in the second range.
  const std::vector<std::vector<std::array<int, 3>>> steps = {{{0, 0, 200}, {1, 0, 37}},
                                                              {{0, 200, 201}, {1, 37, 250}},
                                                              {{0, 201, 455}},
                                                              {{1, 250, 251}, {0, 455, 460}, {1, 251, 300}},
                                                              {{0, 460, 600}, {1, 300, 310}},
                                                              {{1, 310, 333}}};
  std::vector<float> all;
  for (const auto& chunks : steps) {
    StepBatch b;
    for (auto& t : tables) b.block_tables.push_back(&t);
    for (const auto& [s, from, to] : chunks) {
      for (int p = from; p < to; ++p) {
        // Rows compared: each chunk's last, and every 41st position.
        if (p + 1 == to || p % 41 == 0) b.logit_rows.push_back(static_cast<int32_t>(b.tokens.size()));
        b.tokens.push_back(prompts[static_cast<size_t>(s)][static_cast<size_t>(p)]);
        b.positions.push_back(p);
        b.seq.push_back(s);
      }
    }
    std::vector<float> logits;
    Status st = r.Step(b, &logits);
    if (!st.ok()) FAIL(st.error().ToString());
    all.insert(all.end(), logits.begin(), logits.end());
  }
  return all;
}

float LargestDifference(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  float worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]));
  return worst;
}

std::unique_ptr<ModelRunner> CpuRunner(const std::string& model, int max_batch) {
  return testing::CpuRunner(model, {.threads = 0, .max_batch = max_batch, .max_step_tokens = 256, .kv_bytes = 16 << 20});
}

TEST_CASE("cuda engine: prompt chunks through the tiled attention kernels equal the CPU's float32 - one bfloat16 term "
          "does not",
          "[gpu]") {
  WSUP_GPU_OR_SKIP();
  // Float32 weights: SGEMM products, so the attention is what differs.
  // DeepSeek-V3's heads (MLA: q 48 wide, v 32) are padded to the tensor
  // cores' 16.
  for (const char* model : {"llama-tiny-f32", "deepseekv3-tiny-f32"}) {
    auto cpu = ChunkedPrompts(*CpuRunner(model, 16));
    const float tc = LargestDifference(ChunkedPrompts(*GpuRunner(model, 16)), cpu);
    const float f32 =
        LargestDifference(ChunkedPrompts(*GpuRunner(model, 16, kDefaultDequantScratchBytes, false, true)), cpu);
    // With float32 weights one term changes only the attention's operands.
    const float one =
        LargestDifference(ChunkedPrompts(*GpuRunner(model, 16, kDefaultDequantScratchBytes, true, false)), cpu);
    INFO(model << ": largest logit difference from the CPU over the prompt chunks: tensor cores, split " << tc
               << ", one bf16 term " << one << ", float32 kernel " << f32);
    CHECK(tc < 1e-3f);
    CHECK(f32 < 1e-3f);
    // It must show, or the chunks did not take the tensor-core kernel.
    CHECK(one > 4 * tc);
  }
}

TEST_CASE("cuda attention: the key split fills the multiprocessors, in whole key tiles, within its scratch", "[gpu]") {
  using wsup::engine::cuda::PlanTcSplit;
  using wsup::engine::cuda::kTcMaxPartials;
  // Tiles enough to fill 132 multiprocessors twice: no split.
  CHECK(PlanTcSplit(16, 32, 32768, 132).splits == 1);
  // Keys too few for two ranges of the minimum: no split.
  CHECK(PlanTcSplit(1, 32, 300, 132).splits == 1);
  // One tile of 32 heads at 32k keys: 9 ranges make 288 blocks.
  const auto one = PlanTcSplit(1, 32, 32768, 132);
  CHECK(one.splits == 9);
  for (int tiles : {1, 2, 3, 5, 8}) {
    for (int64_t keys : {257, 600, 4096, 10000, 32768, 131072}) {
      for (int64_t heads : {1, 4, 32, 128}) {
        const auto sp = PlanTcSplit(tiles, heads, keys, 132);
        INFO(tiles << " tiles, " << heads << " heads, " << keys << " keys: " << sp.splits << " x "
                    << sp.keys_per_split);
        CHECK(sp.keys_per_split % 64 == 0);
        CHECK(sp.splits * sp.keys_per_split >= keys);        // every key in a range
        CHECK((sp.splits - 1) * sp.keys_per_split < keys);  // no range empty for the longest tile
        CHECK(tiles * heads * sp.splits <= std::max<int64_t>(kTcMaxPartials, tiles * heads));
      }
    }
  }
}

TEST_CASE("cuda engine: bfloat16 weights on tensor cores - split activations stay near float32, one term does not",
          "[gpu]") {
  WSUP_GPU_OR_SKIP();
  auto cpu = ChunkedPrompts(*CpuRunner("llama-tiny-bf16-sharded", 16));
  const float split = LargestDifference(ChunkedPrompts(*GpuRunner("llama-tiny-bf16-sharded", 16)), cpu);
  const float one = LargestDifference(
      ChunkedPrompts(*GpuRunner("llama-tiny-bf16-sharded", 16, kDefaultDequantScratchBytes, true)), cpu);
  INFO("largest logit difference from the CPU's float32 products: split " << split << ", one bf16 term " << one);
  CHECK(split < 1e-3f);
  // One term rounds every activation to 8 significant bits: it must show,
  // or the products did not take the bfloat16 path at all.
  CHECK(one > 4 * split);
}

TEST_CASE("cuda kv memory: a pool imported ahead is mapped only by MapPool, onto the same memory", "[gpu][kv_pool]") {
  WSUP_GPU_OR_SKIP();
  auto gran = wsup::cuda::VmmGranularity(0);
  REQUIRE(gran.ok());
  // Two allocations made and exported as a holder makes the pool.
  std::vector<UniqueFd> fds;
  for (int i = 0; i < 2; ++i) {
    auto h = wsup::cuda::VmmCreate(0, *gran);
    REQUIRE(h.ok());
    auto fd = wsup::cuda::VmmExport(*h);
    REQUIRE(fd.ok());
    REQUIRE(wsup::cuda::VmmRelease(*h).ok());  // the fd keeps the memory
    fds.push_back(std::move(*fd));
  }
  auto layout = KvLayout::Pooled(*gran, 16, {*gran, *gran}, *gran);
  REQUIRE(layout.ok());
  auto a = KvMemory::CreateCuda(*layout, 0);
  auto b = KvMemory::CreateCuda(*layout, 0);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  auto ctx = wsup::cuda::PrimaryContext::Retain(0);
  REQUIRE(ctx.ok());
  wsup::cuda::ContextScope scope;
  REQUIRE(scope.Enter(*ctx).ok());

  // Wrong fds are refused ahead as at the mapping.
  std::vector<UniqueFd> one;
  one.push_back(UniqueFd(::dup(fds[0].get())));
  CHECK_FALSE((*a)->PreparePool(one).ok());

  REQUIRE((*a)->PreparePool(fds).ok());
  CHECK_FALSE((*a)->pool_mapped());
  REQUIRE((*a)->MapPool(fds).ok());
  CHECK((*a)->last_map_times().prepared);
  CHECK((*a)->last_map_times().import_ms == 0);
  const uint64_t span = 2 * *gran;
  std::vector<uint8_t> pattern(span);
  for (size_t i = 0; i < span; ++i) pattern[i] = static_cast<uint8_t>(i * 7 + 3);
  const auto base_a = static_cast<wsup::cuda::DevicePtr>(reinterpret_cast<uintptr_t>((*a)->base()));
  REQUIRE(wsup::cuda::CopyHtoD(base_a, pattern.data(), span).ok());

  // Another mapping of the same fds, imported at the mapping, sees it.
  REQUIRE((*b)->MapPool(fds).ok());
  CHECK_FALSE((*b)->last_map_times().prepared);
  std::vector<uint8_t> seen(span);
  const auto base_b = static_cast<wsup::cuda::DevicePtr>(reinterpret_cast<uintptr_t>((*b)->base()));
  REQUIRE(wsup::cuda::CopyDtoH(seen.data(), base_b, span).ok());
  CHECK(seen == pattern);

  // The KV journal's path (WritePool/ReadPool): bytes written through one
  // mapping, across the two allocations, are read through the other; a
  // range past the pool is refused.
  std::vector<uint8_t> note(4096, 0x5a);
  REQUIRE((*b)->WritePool(*gran - 100, note.data(), note.size()).ok());
  std::vector<uint8_t> back(note.size());
  REQUIRE((*a)->ReadPool(*gran - 100, back.data(), back.size()).ok());
  CHECK(back == note);
  CHECK_FALSE((*a)->WritePool(span - 10, note.data(), 20).ok());
  CHECK_FALSE((*a)->ReadPool(span, back.data(), 1).ok());

  // A preparation of other fds (dups) is not used, and a dropped one is gone.
  REQUIRE((*a)->UnmapPool().ok());
  REQUIRE((*a)->PreparePool(fds).ok());
  std::vector<UniqueFd> dups;
  for (const UniqueFd& fd : fds) dups.push_back(UniqueFd(::dup(fd.get())));
  REQUIRE((*a)->MapPool(dups).ok());
  CHECK_FALSE((*a)->last_map_times().prepared);
  REQUIRE((*a)->UnmapPool().ok());
  CHECK_FALSE((*a)->ReadPool(0, back.data(), 8).ok());  // not mapped here: not this engine's
  REQUIRE((*a)->PreparePool(fds).ok());
  (*a)->DropPrepared();
  REQUIRE((*a)->MapPool(fds).ok());
  CHECK_FALSE((*a)->last_map_times().prepared);
}

TEST_CASE("cuda engine: daemon, client and off modes serve the goldens over HTTP - status shows NCCL and graphs",
          "[gpu]") {
  WSUP_GPU_OR_SKIP();
  for (const std::string model : {"llama-tiny-f32", "llama-tiny-fp8-block"}) {
    TempDir dir;
    const std::string sock = dir.Join("h.sock");
    Proc holder = StartCudaHolder(dir, model, sock);
    INFO(holder.Log());
    REQUIRE(holder.ready);
    for (const std::string mode : {"daemon", "client", "off"}) {
      std::vector<std::string> extra = {"--device", "cuda:0", "--weight-cache", mode, "--comm-keepalive-ms", "50"};
      if (mode != "off") extra.insert(extra.end(), {"--socket", sock});
      Proc e = wsup::test::StartEngine(dir, model, extra, mode + ".log");
      INFO(model << " " << mode << "\n" << e.Log());
      REQUIRE(e.ready);
      CHECK(wsup::test::AllOutputs(e.port, model) == wsup::test::GoldenOutputs(model));
      json st = wsup::test::GetJson(e.port, "/wsup/status");
      INFO(st.dump());
      CHECK(st["weights"]["source"] == (mode == "off" ? "disk" : "holder"));
      CHECK(st["comm"]["kind"] == "nccl");
      CHECK(st["steps"]["graph"].get<uint64_t>() > 0);
      CHECK(st["phases"]["graph_capture"].get<double>() > 0);
      const uint64_t k0 = st["comm"]["keepalives"].get<uint64_t>();
      CHECK(wsup::test::WaitFor(
          [&] { return wsup::test::GetJson(e.port, "/wsup/status")["comm"]["keepalives"].get<uint64_t>() > k0 + 2; },
          10s));
      CHECK(wsup::test::GetJson(e.port, "/wsup/status")["comm"]["warm"] == true);
      e.child.Kill(SIGTERM);
      CHECK(e.child.Wait(20s) == 0);
    }
  }
}

TEST_CASE("cuda engine: 32 concurrent streams get their goldens - the holder SIGKILLed under the engine changes nothing",
          "[gpu]") {
  WSUP_GPU_OR_SKIP();
  TempDir dir;
  const std::string sock = dir.Join("h.sock");
  Proc holder = StartCudaHolder(dir, "llama-tiny-f32", sock);
  REQUIRE(holder.ready);
  Proc e = wsup::test::StartEngine(dir, "llama-tiny-f32",
                                   {"--device", "cuda:0", "--weight-cache", "daemon", "--socket", sock, "--kv-cache-mib", "16"});
  INFO(e.Log());
  REQUIRE(e.ready);
  wsup::test::CheckConcurrentStreams(e.port, "llama-tiny-f32", 32);
  // The engine keeps its mapping: the arena outlives the holder.
  holder.child.Kill(SIGKILL);
  holder.child.Wait(10s);
  CHECK(wsup::test::AllOutputs(e.port, "llama-tiny-f32") == wsup::test::GoldenOutputs("llama-tiny-f32"));
  e.child.Kill(SIGTERM);
  CHECK(e.child.Wait(20s) == 0);
}

TEST_CASE("cuda engine: refusals name the fix", "[gpu]") {
  WSUP_GPU_OR_SKIP();
  TempDir dir;
  // A host-backend holder cannot feed a GPU rank in daemon mode.
  const std::string sock = dir.Join("h.sock");
  Proc holder = wsup::test::StartHolder(dir, wsup::test::TestData("llama-tiny-f32"), sock);
  REQUIRE(holder.ready);
  Proc e = wsup::test::StartEngine(dir, "llama-tiny-f32", {"--device", "cuda:0", "--weight-cache", "daemon", "--socket", sock});
  CHECK_FALSE(e.ready);
  CHECK(e.child.Wait(20s) == 78);
  CHECK(e.Log().find("backend") != std::string::npos);
  // A GPU that does not exist.
  Proc e2 = wsup::test::StartEngine(dir, "llama-tiny-f32", {"--device", "cuda:63"}, "e2.log");
  CHECK_FALSE(e2.ready);
  CHECK(e2.child.Wait(20s) != 0);
  CHECK(e2.Log().find("cuda:63") != std::string::npos);
}
