// The startup thread's timed phases: context, weights, communicator,
// kv_cache, graph_capture, warmup (engine/engine.h). Each phase's time and
// note go to GET /wsup/status and the table printed once ready.
#include <algorithm>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "checkpoint/fingerprint.h"
#include "common/fs.h"
#include "common/json_limits.h"
#include "engine/cuda/cuda_engine.h"
#include "engine/engine.h"
#include "engine/gpu_memory.h"

namespace wsup::engine {

namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

// End-of-sequence ids: config.json's and generation_config.json's
// eos_token_id (an integer or a list; absent: none), each id once. A chat
// model's end of turn is often only in generation_config.json (Qwen3's
// <|im_end|>, Llama-3's <|eot_id|>).
std::vector<int32_t> EosTokens(const std::string& model_dir) {
  std::vector<int32_t> out;
  auto add = [&](int32_t id) {
    if (std::find(out.begin(), out.end(), id) == out.end()) out.push_back(id);
  };
  for (const char* file : {"config.json", "generation_config.json"}) {
    auto text = ReadFile(JoinPath(model_dir, file));
    if (!text.ok()) continue;
    // The checkpoint reader has already refused a config past the limit;
    // this read is bounded the same way on its own.
    auto parsed = ParseJsonChecked(*text, file, std::string("fix the model's ") + file);
    if (!parsed.ok()) continue;
    json j = std::move(parsed).value();
    if (!j.is_object()) continue;
    auto it = j.find("eos_token_id");
    if (it == j.end()) continue;
    if (it->is_number_integer()) add(it->get<int32_t>());
    if (it->is_array()) {
      for (const auto& v : *it) {
        if (v.is_number_integer()) add(v.get<int32_t>());
      }
    }
  }
  return out;
}

// What this engine's KV bytes mean, for the KV journal (wire/kv_journal.h
// kv_format): the checkpoint's identity (its files and headers), its
// sharding, the backend and block size, and the version of this engine's
// KV layout. Another engine whose KV would differ in any of these never
// adopts these pages.
constexpr int kEngineKvLayoutVersion = 1;
uint64_t KvFormat(const Checkpoint& ckpt, int tp, int ep, bool cuda, int block_size) {
  FingerprintInputs in;
  in.shard.tp_size = tp;
  in.shard.ep_size = ep;
  const Fingerprint fp = Fingerprint::Compute(ckpt, in);
  std::string id = "wsup-engine kv " + std::to_string(kEngineKvLayoutVersion);
  for (const char* f : {"architecture", "checkpoint", "quant_method", "quant_config", "dtype"}) {
    id += std::string("|") + f + "=" + fp.Get(f);
  }
  id += "|tp=" + std::to_string(tp) + "|ep=" + std::to_string(ep) + "|backend=" + (cuda ? "cuda" : "cpu") +
        "|block=" + std::to_string(block_size);
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : id) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace

void Engine::Phase(const std::string& name, double ms, const std::string& note) {
  // On GPUs, what each phase added to the memory the driver charges to
  // this process: where a standby's own memory goes (memory.by_phase).
  int64_t gpu = -1;
  if (!gpu_devices_.empty()) {
    auto used = ProcessGpuMemory(gpu_devices_);
    if (used.ok()) gpu = static_cast<int64_t>(*used);
  }
  std::lock_guard<std::mutex> lk(mu_);
  phases_.emplace_back(name, ms);
  if (!note.empty()) phase_notes_[name] = note;
  if (gpu >= 0) {
    phase_gpu_.emplace_back(name, gpu - std::max<int64_t>(gpu_after_last_phase_, 0));
    gpu_after_last_phase_ = gpu;
  }
}

Status Engine::StartupPhases() {
  // Context: the checkpoint's headers and config, the device.
  auto t0 = Clock::now();
  WSUP_ASSIGN_OR_RETURN(std::vector<int> devices, ParseDevice(opts_.device));
  gpu_devices_ = devices;
  const int tp = devices.empty() ? opts_.tp : static_cast<int>(devices.size());
  std::string context_note = "cpu";
  if (!devices.empty()) {
    WSUP_ASSIGN_OR_RETURN(std::vector<std::string> names, InitCudaDevices(devices));
    context_note.clear();
    for (const auto& n : names) context_note += (context_note.empty() ? "" : ", ") + n;
  }
  WSUP_ASSIGN_OR_RETURN(Checkpoint ckpt, Checkpoint::Open(opts_.model_dir));
  const int ep = EngineEpSize(opts_, tp);
  WSUP_ASSIGN_OR_RETURN(ModelDims dims, ModelDims::From(ckpt.config(), tp, 0, ep));
  eos_ = EosTokens(opts_.model_dir);
  kv_format_ = KvFormat(ckpt, tp, ep, !devices.empty(), opts_.block_size);
  Phase("context", MsSince(t0), context_note);
  if (cancel_startup_) return Status::Ok();

  // Tokenizer: the checkpoint's own files, or the byte tokenizer. Before
  // the weights: a tokenizer that cannot serve refuses the start in
  // milliseconds, not after a load of the weights.
  t0 = Clock::now();
  auto codec = LoadTextCodec(opts_.model_dir, dims.vocab);
  if (!codec.ok()) return codec.error().With("the tokenizer");
  text_ = std::move(codec).value();
  if (auto eos = text_->eos_id(); eos && std::find(eos_.begin(), eos_.end(), *eos) == eos_.end()) eos_.push_back(*eos);
  Phase("tokenizer", MsSince(t0), text_->kind());
  if (cancel_startup_) return Status::Ok();

  // Weights: holder or disk, then bound to the model on every rank.
  t0 = Clock::now();
  WeightCacheOptions wc;
  wc.model_dir = opts_.model_dir;
  wc.mode = opts_.weight_cache;
  wc.tp = tp;
  wc.ep = ep;
  wc.devices = devices;
  wc.revision = opts_.revision;
  wc.layout = opts_.layout;
  wc.layout_wait_ms = static_cast<uint64_t>(opts_.layout_wait_ms);
  if (opts_.weight_cache != "off") {
    WSUP_ASSIGN_OR_RETURN(wc.sockets, RankSockets(opts_.socket, tp));
  }
  WeightsReport report;
  auto weights = AcquireWeights(ckpt, wc, &report);
  if (!weights.ok()) {
    std::lock_guard<std::mutex> lk(mu_);
    weights_ = report;
    return weights.error();
  }
  RunnerOptions ro;
  ro.threads_per_rank = opts_.threads;
  ro.devices = devices;
  ro.ep = ep;
  ro.max_batch = opts_.max_batch;
  ro.max_step_tokens = kMaxStepTokens;
  ro.dequant_scratch_bytes = static_cast<uint64_t>(opts_.dequant_scratch_mib) << 20;
  ro.bf16_activations = opts_.matmul == "bf16";
  ro.nccl_max_ctas = opts_.nccl_max_ctas;
  WSUP_ASSIGN_OR_RETURN(auto runner, ModelRunner::Create(ckpt.config(), std::move(*weights), ro));
  {
    std::lock_guard<std::mutex> lk(mu_);
    weights_ = report;
  }
  Phase("weights", MsSince(t0), report.source + ", mode " + report.mode);
  if (cancel_startup_) return Status::Ok();

  t0 = Clock::now();
  WSUP_RETURN_IF_ERROR(runner->InitCommunicator());
  Phase("communicator", MsSince(t0),
        std::string(runner->comm_kind()) + ", " + std::to_string(runner->tp()) + " rank" + (runner->tp() > 1 ? "s" : ""));

  t0 = Clock::now();
  if (opts_.kv_pool) {
    // The pool's shape fixes the block ids; it is mapped only when the
    // supervisor says so (POST /wsup/role).
    auto link = std::make_unique<KvPoolLink>(wc.sockets, 10'000);
    WSUP_ASSIGN_OR_RETURN(auto pools, link->Describe());
    WSUP_RETURN_IF_ERROR(
        runner->AllocatePooledKv(pools, static_cast<uint64_t>(opts_.kv_scratch_mib) << 20, opts_.block_size));
    pool_link_ = std::move(link);
  } else {
    WSUP_RETURN_IF_ERROR(runner->AllocateKv(static_cast<uint64_t>(opts_.kv_cache_mib) << 20, opts_.block_size));
  }
  {
    const KvLayout& kv = runner->kv_layout();
    Phase("kv_cache", MsSince(t0),
          kv.pooled() ? std::to_string(kv.scratch_blocks) + " scratch blocks and " + std::to_string(kv.pool_blocks) +
                            " in the node's pool (not mapped) of " + std::to_string(kv.block_size) + " tokens per rank"
                      : std::to_string(kv.scratch_blocks) + " blocks of " + std::to_string(kv.block_size) +
                            " tokens per rank");
  }

  t0 = Clock::now();
  // What the graphs take on the GPU: what the driver charges to this
  // process before and after (a standby's own memory is mostly these, its
  // context and its scratch).
  auto gpu_before = devices.empty() ? Result<uint64_t>(uint64_t{0}) : ProcessGpuMemory(devices);
  WSUP_ASSIGN_OR_RETURN(int graphs, runner->CaptureGraphs());
  auto gpu_after = devices.empty() ? Result<uint64_t>(uint64_t{0}) : ProcessGpuMemory(devices);
  if (graphs && gpu_before.ok() && gpu_after.ok() && *gpu_after >= *gpu_before) {
    graphs_bytes_ = static_cast<int64_t>(*gpu_after - *gpu_before);
  }
  Phase("graph_capture", graphs ? MsSince(t0) : 0,
        graphs ? std::to_string(graphs) + " decode graphs, batch 1 to " + std::to_string(opts_.max_batch) +
                     (graphs_bytes_ >= 0 ? ", " + std::to_string(graphs_bytes_ >> 20) + " MiB of GPU memory" : "")
               : std::string("cpu: none"));
  if (cancel_startup_) return Status::Ok();

  t0 = Clock::now();
  WSUP_RETURN_IF_ERROR(runner->Warmup());
  Phase("warmup", MsSince(t0));

  comm_kind_ = runner->comm_kind();
  runner_ = std::move(runner);
  return Status::Ok();
}

void Engine::Startup() {
  Status st = StartupPhases();
  std::lock_guard<std::mutex> lk(mu_);
  startup_status_ = st;
  mailbox_->Post([this] { OnStartupDone(); });
}

}  // namespace wsup::engine
