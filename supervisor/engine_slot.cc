#include "supervisor/engine_slot.h"

namespace wsup {

using nlohmann::json;

void EngineSlot::BeginProcess(pid_t new_pid, uint64_t new_start_time, std::string new_nonce, std::string new_token,
                              int new_port, int64_t wall_ms, int64_t mono_ms) {
  pid = new_pid;
  start_time = new_start_time;
  nonce = std::move(new_nonce);
  control_token = std::move(new_token);
  port = new_port;
  spawned_ms = wall_ms;
  spawned_mono = mono_ms;
  semantic_ready = false;
  tripped_hung = false;
  comm_warm = false;
  last_status = json();
  last_ok_mono = 0;
  last_ok_wall = 0;
  traffic_last_ms = 0;
  cache_recorded = false;
  cache_result.clear();
  cache_reason.clear();
  drill_kill = false;
  adopted = false;
  identity_logged = false;
  status_logged = false;
  kv = json();
  memory = json();
  resume = json();
  kv_capable = true;
}

void EngineSlot::CloseWatches() {
  if (watch) watch->Close();
  watch = nullptr;
  if (lifeline) lifeline->Close();
  lifeline = nullptr;
  if (death) death->Close();
  death = nullptr;
  if (ready_line) ready_line->Close();
  ready_line = nullptr;
}

void EngineSlot::EndProcess() {
  CloseWatches();
  semantic_ready = false;
  tripped_hung = false;
  comm_warm = false;
  poll->Stop();
  stop_timer->Stop();
  status_timer->Stop();
  if (monitor) monitor->Stop();
  pid = 0;
  kv = json();
  memory = json();
  resume = json();
  resume_seen.clear();
}

void EngineSlot::AddGrowth(const json& counts, std::initializer_list<const char*> keys,
                           std::map<std::string, uint64_t>& totals) {
  // Added to the slot's totals as they grow: a counter must not fall back
  // to zero when the engine that counted dies.
  for (const char* k : keys) {
    if (!counts.contains(k) || !counts[k].is_number_unsigned()) continue;
    const uint64_t now = counts[k].get<uint64_t>();
    uint64_t& seen = resume_seen[k];
    totals[k] += now >= seen ? now - seen : now;
    seen = now;
  }
}

void EngineSlot::TakeServingStatus(const json& st, Metrics& metrics) {
  if (st.contains("resume") && st["resume"].is_object()) {
    resume = st["resume"];
    AddGrowth(resume, {"adopted_sequences", "adopted_tokens", "recomputed_sequences"}, metrics.engine_resume[name]);
  }
  // Its load (wsup-engine's "requests" and "kv_cache"), and its tokens,
  // added to the slot's totals as they grow.
  if (st.contains("requests") && st["requests"].is_object()) {
    const json& r = st["requests"];
    EngineLoad& load = metrics.engine_load[name];
    auto count = [](const json& o, const char* k, uint64_t* into) {
      if (o.contains(k) && o[k].is_number_unsigned()) *into = o[k].get<uint64_t>();
    };
    count(r, "active", &load.running);
    count(r, "waiting", &load.waiting);
    if (st.contains("kv_cache") && st["kv_cache"].is_object()) {
      count(st["kv_cache"], "blocks", &load.kv_blocks);
      count(st["kv_cache"], "free_blocks", &load.kv_free_blocks);
    }
    load.known = true;
    AddGrowth(r, {"prompt_tokens", "generated_tokens"}, metrics.engine_tokens[name]);
  }
  // An adopted engine's communicator was never reported while it started.
  if (st.contains("comm") && st["comm"].is_object() && st["comm"].contains("warm") &&
      st["comm"]["warm"].is_boolean()) {
    comm_warm = st["comm"]["warm"].get<bool>();
  }
  if (st.contains("memory") && st["memory"].is_object()) {
    memory = st["memory"];
    for (const char* part : {"weights_bytes", "kv_bytes", "other_bytes"}) {
      if (memory.contains(part) && memory[part].is_number_unsigned()) {
        const std::string key(part);
        metrics.engine_memory[name][key.substr(0, key.size() - 6)] = memory[part].get<uint64_t>();
      }
    }
  }
}

}  // namespace wsup
