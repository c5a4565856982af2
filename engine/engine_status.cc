// GET /wsup/status (engine/engine.h): the fields engine/engine_server.h
// lists, and the memory this process holds.
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <string>

#include <nlohmann/json.hpp>

#include "common/fs.h"
#include "engine/engine.h"
#include "engine/gpu_memory.h"

namespace wsup::engine {

using nlohmann::json;

namespace {

// Resident anonymous memory of this process (heap, stacks, private
// mappings), from /proc/self/status; 0 when unreadable.
uint64_t RssAnonBytes() {
  auto text = ReadFile("/proc/self/status");
  if (!text.ok()) return 0;
  size_t at = text->find("RssAnon:");
  if (at == std::string::npos) return 0;
  return std::strtoull(text->c_str() + at + 8, nullptr, 10) * 1024;
}

}  // namespace

json Engine::MemoryJson(const json& kv) {
  const uint64_t ranks = static_cast<uint64_t>(runner_->tp());
  json m;
  {
    std::lock_guard<std::mutex> lk(mu_);
    m["weights_bytes"] = weights_.bytes;
  }
  m["kv_bytes"] = kv["bytes"].get<uint64_t>() * ranks;
  // Its own KV (the scratch, or the private cache) is counted as KV; the
  // pool and the holder's weights are the node's, not this process's.
  const uint64_t own_kv = kv["scratch_bytes"].get<uint64_t>() * ranks;
  if (!runner_->on_gpu()) {
    // The scratch is anonymous memory touched at startup.
    const uint64_t anon = RssAnonBytes();
    m["other_bytes"] = anon > own_kv ? anon - own_kv : 0;
  } else {
    // What the driver charges to this process beyond its own KV: contexts,
    // step buffers, graphs, cuBLAS workspaces. Read at most once a second.
    const int64_t now = MonoMs();
    if (now - gpu_read_ms_ >= 1000 || gpu_read_ms_ == 0) {
      gpu_read_ms_ = now;
      auto devices = ParseDevice(opts_.device);
      auto used = devices.ok() ? ProcessGpuMemory(*devices) : Result<uint64_t>(devices.error());
      gpu_used_ = used.ok() ? static_cast<int64_t>(*used) : -1;
      if (!used.ok() && !gpu_warned_) {
        gpu_warned_ = true;
        spdlog::warn("memory.other_bytes is not reported: {}", used.error().message());
      }
    }
    if (graphs_bytes_ >= 0) m["graphs_bytes"] = graphs_bytes_;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (!phase_gpu_.empty()) {
        json by = json::object();
        for (const auto& [name, bytes] : phase_gpu_) by[name] = bytes;
        m["by_phase"] = by;
      }
    }
    if (gpu_used_ >= 0) {
      m["gpu_used_bytes"] = gpu_used_;
      m["other_bytes"] = static_cast<uint64_t>(gpu_used_) > own_kv ? static_cast<uint64_t>(gpu_used_) - own_kv : 0;
    }
  }
  return m;
}

void Engine::HandleStatus(const std::shared_ptr<http::ResponseWriter>& w) {
  json j;
  j["state"] = state_name();
  if (!opts_.nonce.empty()) j["nonce"] = opts_.nonce;
  j["death_word"] = death_word_;
  j["model"] = opts_.model_name;
  j["model_dir"] = opts_.model_dir;
  j["device"] = opts_.device;
  {
    auto devices = ParseDevice(opts_.device);
    j["tp"] = devices.ok() && !devices->empty() ? static_cast<int>(devices->size()) : opts_.tp;
    j["ep"] = EngineEpSize(opts_, j["tp"].get<int>());
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    json wj = {{"mode", opts_.weight_cache}, {"layout", opts_.layout}};
    if (!weights_.source.empty()) {
      wj["source"] = weights_.source;
      wj["ms"] = weights_.attach_ms + weights_.load_ms;
      wj["attach_ms"] = weights_.attach_ms;
      wj["load_ms"] = weights_.load_ms;
      wj["bytes"] = weights_.bytes;
    }
    if (!weights_.miss_reason.empty()) wj["miss_reason"] = weights_.miss_reason;
    if (!weights_.diffs.empty()) {
      json diffs = json::array();
      for (const auto& d : weights_.diffs) diffs.push_back({{"field", d.field}, {"ours", d.ours}, {"holder", d.theirs}});
      wj["diffs"] = diffs;
    }
    j["weights"] = wj;
    json phases = json::object();
    for (const auto& [name, ms] : phases_) phases[name] = ms;
    j["phases"] = phases;
    json notes = json::object();
    for (const auto& [name, note] : phase_notes_) notes[name] = note;
    j["phase_notes"] = notes;
  }
  // comm_kind_ is written by the startup thread; read it only once ready.
  json comm = {{"kind", scheduler_ ? comm_kind_ : std::string("none")}, {"ranks", j["tp"]}, {"warm", false}};
  if (scheduler_) {
    SchedulerStats s = scheduler_->stats();
    comm["warm"] = s.comm_ok;
    comm["last_keepalive_ms"] = MonoMs() - s.last_keepalive_mono_ms;
    comm["keepalive_latency_us"] = s.last_keepalive_us;
    comm["keepalives"] = s.keepalives;
    comm["keepalive_failures"] = s.keepalive_failures;
    comm["keepalive_interval_ms"] = opts_.comm_keepalive_ms;
    if (!s.comm_ok) comm["error"] = s.comm_error;
    j["role"] = role_;
    // The tokenizer in use (set by the startup thread, read once ready).
    j["tokenizer"] = {{"kind", text_->kind()}, {"describe", text_->Describe()}, {"size", text_->size()},
                      {"chat_template", text_->chat_template()}};
    j["kv"] = KvJson();
    j["memory"] = MemoryJson(j["kv"]);
    j["kv_cache"] = {{"mib_per_rank", opts_.kv_pool ? opts_.kv_scratch_mib : opts_.kv_cache_mib},
                     {"block_size", runner_->block_size()},
                     {"blocks", s.total_blocks},
                     {"free_blocks", s.free_blocks}};
    // Streams resumed here after a crash (docs/kv_journal.md).
    j["resume"] = {
        {"adopted_sequences", s.adopted_sequences},   {"adopted_tokens", s.adopted_tokens},
        {"adopted_by_page", s.adopted_by_page},       {"recomputed_sequences", s.recomputed_sequences},
        {"recomputed_reasons", s.recomputed_reasons}, {"held", s.resume_held},
        {"held_total", s.resume_held_total},          {"held_max_ms", s.resume_held_max_ms},
        {"adoptable_blocks", s.adoptable_blocks},     {"released_blocks", s.released_blocks}};
    j["requests"] = {{"active", s.active},     {"waiting", s.waiting},   {"steps", s.steps},
                     {"probes", s.probes},     {"finished", s.finished}, {"cancelled", s.cancelled},
                     {"generated_tokens", s.generated_tokens}, {"prompt_tokens", s.prompt_tokens}};
    // Steps of rank 0 replayed from a CUDA graph and run eagerly (both 0 on the CPU).
    j["steps"] = {{"graph", runner_->graph_steps()},
                  {"eager", runner_->eager_steps()},
                  {"total", runner_->steps()},
                  {"forward_ms_total", runner_->step_ms_total()}};
    // The step bound (engine/step_budget.h): prompt tokens the next step
    // may take, the learnt cost of one, and the steps with prefill that
    // went over the bound anyway.
    j["step_bound"] = {{"max_step_ms", MaxStepMs()},
                       {"prefill_budget_tokens", s.prefill_budget},
                       {"prefill_us_per_token", s.prefill_us_per_token},
                       {"over_bound", s.steps_over_bound},
                       {"longest_prefill_step_ms", static_cast<double>(s.longest_prefill_step_us) / 1e3}};
  }
  j["comm"] = comm;
  w->Send(http::HttpResponse::Json(200, j.dump(-1, ' ', false, json::error_handler_t::replace)));
}

}  // namespace wsup::engine
