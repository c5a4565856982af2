// The serving series of /metrics: what the clients saw through the front
// (answers by route and status; time to first token, time per output token
// and request time as histograms; the front's queue) and what each slot's
// engine says of its load (running and waiting requests, KV cache blocks,
// prompt and generated tokens), in vLLM's terms where it has one. Apart
// from supervisor/metrics.cc so that the exposition of these families is
// read in one place; docs/metrics.md lists them.
//
// Pure functions of their inputs; any thread.
#pragma once

#include <cstdint>
#include <map>
#include <ostream>
#include <string>

namespace wsup {

// A sample's value as /metrics writes it (six significant digits).
std::string MetricNumber(double v);

// One slot's engine as its latest /wsup/status told it (wsup-engine's
// "requests" and "kv_cache"; an engine that reports neither has no series).
struct EngineLoad {
  bool known = false;
  uint64_t running = 0;
  uint64_t waiting = 0;
  uint64_t kv_blocks = 0;
  uint64_t kv_free_blocks = 0;
};

// The front's serving families from its counters (common/serving_counters.h
// keys, summed over the front's processes), and its queue gauges.
void RenderFrontServing(std::ostream& o, const std::map<std::string, uint64_t>& front_counters, uint64_t queued,
                        uint64_t inflight);

// The engines' load gauges by slot, and their token counters by slot
// (keys "prompt_tokens" and "generated_tokens", summed over the slot's
// engine processes).
void RenderEngineServing(std::ostream& o, const std::map<std::string, EngineLoad>& load,
                         const std::map<std::string, std::map<std::string, uint64_t>>& tokens);

}  // namespace wsup
