#include "supervisor/serving_metrics.h"

#include <cstdio>
#include <set>
#include <string_view>
#include <tuple>
#include <utility>

#include "common/serving_counters.h"

namespace wsup {
namespace {

uint64_t Get(const std::map<std::string, uint64_t>& m, const std::string& k) {
  auto it = m.find(k);
  return it == m.end() ? 0 : it->second;
}

struct HistogramFamily {
  std::string_view key;   // the counters' name (common/serving_counters.h)
  std::string_view name;  // the series' name
  std::string_view help;
};

constexpr HistogramFamily kFamilies[] = {
    {"ttft", "wsup_front_time_to_first_token_seconds",
     "A stream's first token, from the front's receipt of the request (queueing and failovers included), by API."},
    {"tpot", "wsup_front_time_per_output_token_seconds",
     "Each later token of a stream, from the token before it (a failover mid-stream is one long gap), by API."},
    {"duration", "wsup_front_request_duration_seconds",
     "Completion requests from their receipt to the end of the answer, streamed or not, by API."},
};

}  // namespace

std::string MetricNumber(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

void RenderFrontServing(std::ostream& o, const std::map<std::string, uint64_t>& c, uint64_t queued,
                        uint64_t inflight) {
  o << "# HELP wsup_front_responses_total Requests the front ended, by route and the status of their answer "
       "(code 0: none was started; the client went away or the front stopped).\n"
       "# TYPE wsup_front_responses_total counter\n";
  // The routes' 200s are there from the start, so that a rate() or a ratio
  // has a series before the first request; other codes appear when seen.
  std::set<std::pair<std::string, std::string>> seen;
  for (std::string_view route : serving::kRoutes) seen.emplace(std::string(route), "200");
  for (auto it = c.lower_bound(std::string(serving::kAnswerPrefix)); it != c.end(); ++it) {
    const std::string& k = it->first;
    if (k.compare(0, serving::kAnswerPrefix.size(), serving::kAnswerPrefix) != 0) break;
    const size_t colon = k.rfind(':');
    if (colon <= serving::kAnswerPrefix.size() || colon + 1 == k.size()) continue;
    seen.emplace(k.substr(serving::kAnswerPrefix.size(), colon - serving::kAnswerPrefix.size()), k.substr(colon + 1));
  }
  for (const auto& [route, code] : seen) {
    o << "wsup_front_responses_total{route=\"" << route << "\",code=\"" << code << "\"} "
      << Get(c, std::string(serving::kAnswerPrefix) + route + ":" + code) << "\n";
  }
  for (const HistogramFamily& f : kFamilies) {
    o << "# HELP " << f.name << " " << f.help << "\n# TYPE " << f.name << " histogram\n";
    for (std::string_view api : serving::kApis) {
      const std::string label = "api=\"" + std::string(api) + "\"";
      uint64_t cumulative = 0;
      for (size_t i = 0; i <= serving::kBoundsSeconds.size(); ++i) {
        cumulative += Get(c, serving::BucketKey(f.key, api, i));
        const std::string le = i < serving::kBoundsSeconds.size() ? MetricNumber(serving::kBoundsSeconds[i]) : "+Inf";
        o << f.name << "_bucket{" << label << ",le=\"" << le << "\"} " << cumulative << "\n";
      }
      const double sum_s = static_cast<double>(Get(c, serving::SumKey(f.key, api))) / 1e6;
      o << f.name << "_sum{" << label << "} " << MetricNumber(sum_s) << "\n"
        << f.name << "_count{" << label << "} " << cumulative << "\n";
    }
  }
  o << "# HELP wsup_front_queued_requests Requests waiting in the front for an engine to route to.\n"
       "# TYPE wsup_front_queued_requests gauge\n"
    << "wsup_front_queued_requests " << queued << "\n";
  o << "# HELP wsup_front_inflight_requests Requests the front has sent to an engine and not finished.\n"
       "# TYPE wsup_front_inflight_requests gauge\n"
    << "wsup_front_inflight_requests " << inflight << "\n";
}

void RenderEngineServing(std::ostream& o, const std::map<std::string, EngineLoad>& load,
                         const std::map<std::string, std::map<std::string, uint64_t>>& tokens) {
  struct Gauge {
    const char* name;
    const char* help;
    uint64_t (*value)(const EngineLoad&);
  };
  const Gauge gauges[] = {
      {"wsup_engine_num_requests_running", "Requests in the engine's running batch (vllm:num_requests_running).",
       [](const EngineLoad& l) { return l.running; }},
      {"wsup_engine_num_requests_waiting", "Requests the engine has admitted but not yet scheduled "
       "(vllm:num_requests_waiting).",
       [](const EngineLoad& l) { return l.waiting; }},
      {"wsup_engine_kv_cache_blocks",
       "The blocks the engine may hand out: its own cache, and the node's KV pool's while it maps it.",
       [](const EngineLoad& l) { return l.kv_blocks; }},
      {"wsup_engine_kv_cache_used_blocks", "KV cache blocks in use; over wsup_engine_kv_cache_blocks, "
       "vllm:kv_cache_usage_perc.",
       [](const EngineLoad& l) { return l.kv_blocks >= l.kv_free_blocks ? l.kv_blocks - l.kv_free_blocks : 0; }},
  };
  for (const Gauge& g : gauges) {
    o << "# HELP " << g.name << " " << g.help << "\n# TYPE " << g.name << " gauge\n";
    for (const auto& [slot, l] : load) {
      if (l.known) o << g.name << "{slot=\"" << slot << "\"} " << g.value(l) << "\n";
    }
  }
  for (const auto& [name, key, help] : {
           std::tuple<const char*, const char*, const char*>{
               "wsup_engine_prompt_tokens_total", "prompt_tokens",
               "Prompt tokens of the requests the slot's engines admitted (vllm:prompt_tokens_total)."},
           {"wsup_engine_generation_tokens_total", "generated_tokens",
            "Tokens the slot's engines generated (vllm:generation_tokens_total)."}}) {
    o << "# HELP " << name << " " << help << "\n# TYPE " << name << " counter\n";
    for (const auto& [slot, t] : tokens) {
      auto it = t.find(key);
      if (it != t.end()) o << name << "{slot=\"" << slot << "\"} " << it->second << "\n";
    }
  }
}

}  // namespace wsup
