// The serving series of /metrics from the front's counters and the engines'
// load (supervisor/serving_metrics.h): cumulative buckets, sums in seconds,
// series there before their first event, and none for an engine that does
// not report its load.
#include "supervisor/serving_metrics.h"

#include <catch2/catch.hpp>

#include <sstream>
#include <string>

#include "common/serving_counters.h"
#include "supervisor/metrics.h"

namespace wsup {
namespace {

bool Has(const std::string& text, const std::string& line) { return text.find(line + "\n") != std::string::npos; }

TEST_CASE("serving metrics: the front's histograms are cumulative, with sums in seconds", "[serving_metrics]") {
  std::map<std::string, uint64_t> c;
  c[serving::BucketKey("ttft", "chat", serving::BucketIndex(3'000))] = 2;    // le 0.005
  c[serving::BucketKey("ttft", "chat", serving::BucketIndex(30'000))] = 1;   // le 0.05
  c[serving::BucketKey("ttft", "chat", serving::kBoundsSeconds.size())] = 1; // +Inf
  c[serving::SumKey("ttft", "chat")] = 100'036'000;
  c[serving::AnswerKey("chat", 200)] = 3;
  c[serving::AnswerKey("chat", 502)] = 1;
  c[serving::AnswerKey("other", 404)] = 7;
  std::ostringstream o;
  RenderFrontServing(o, c, 4, 9);
  const std::string t = o.str();
  const char* lines[] = {
      // Cumulative buckets, the sum in seconds, the count.
      "wsup_front_time_to_first_token_seconds_bucket{api=\"chat\",le=\"0.001\"} 0",
      "wsup_front_time_to_first_token_seconds_bucket{api=\"chat\",le=\"0.005\"} 2",
      "wsup_front_time_to_first_token_seconds_bucket{api=\"chat\",le=\"0.025\"} 2",
      "wsup_front_time_to_first_token_seconds_bucket{api=\"chat\",le=\"0.05\"} 3",
      "wsup_front_time_to_first_token_seconds_bucket{api=\"chat\",le=\"80\"} 3",
      "wsup_front_time_to_first_token_seconds_bucket{api=\"chat\",le=\"+Inf\"} 4",
      "wsup_front_time_to_first_token_seconds_sum{api=\"chat\"} 100.036",
      "wsup_front_time_to_first_token_seconds_count{api=\"chat\"} 4",
      // An API with nothing yet has its series, at 0.
      "wsup_front_time_to_first_token_seconds_count{api=\"completions\"} 0",
      "wsup_front_time_per_output_token_seconds_count{api=\"chat\"} 0",
      "wsup_front_request_duration_seconds_bucket{api=\"completions\",le=\"+Inf\"} 0",
      // Answers: every route's 200 from the start, other codes as seen.
      "wsup_front_responses_total{route=\"chat\",code=\"200\"} 3",
      "wsup_front_responses_total{route=\"chat\",code=\"502\"} 1",
      "wsup_front_responses_total{route=\"other\",code=\"404\"} 7",
      "wsup_front_responses_total{route=\"models\",code=\"200\"} 0",
      "wsup_front_queued_requests 4",
      "wsup_front_inflight_requests 9",
  };
  for (const char* line : lines) {
    INFO(line);
    CHECK(Has(t, line));
  }
  // One TYPE line per family.
  size_t types = 0;
  for (size_t at = t.find("# TYPE "); at != std::string::npos; at = t.find("# TYPE ", at + 1)) ++types;
  CHECK(types == 6);
}

TEST_CASE("serving metrics: an answer key that cannot be read is skipped, not rendered half", "[serving_metrics]") {
  std::map<std::string, uint64_t> c;
  c["answer:"] = 1;
  c["answer:chat"] = 1;
  c["answer:x:200"] = 2;
  std::ostringstream o;
  RenderFrontServing(o, c, 0, 0);
  const std::string t = o.str();
  CHECK(t.find("route=\"\"") == std::string::npos);
  CHECK(Has(t, "wsup_front_responses_total{route=\"x\",code=\"200\"} 2"));
}

TEST_CASE("serving metrics: engine load by slot, only for engines that report it", "[serving_metrics]") {
  std::map<std::string, EngineLoad> load;
  load["a"] = EngineLoad{.known = true, .running = 3, .waiting = 2, .kv_blocks = 100, .kv_free_blocks = 60};
  load["b"] = EngineLoad{};  // an engine of another kind: no series
  std::map<std::string, std::map<std::string, uint64_t>> tokens;
  tokens["a"] = {{"prompt_tokens", 1200}, {"generated_tokens", 340}};
  std::ostringstream o;
  RenderEngineServing(o, load, tokens);
  const std::string t = o.str();
  for (const char* line : {"wsup_engine_num_requests_running{slot=\"a\"} 3", "wsup_engine_num_requests_waiting{slot=\"a\"} 2",
                           "wsup_engine_kv_cache_blocks{slot=\"a\"} 100", "wsup_engine_kv_cache_used_blocks{slot=\"a\"} 40",
                           "wsup_engine_prompt_tokens_total{slot=\"a\"} 1200",
                           "wsup_engine_generation_tokens_total{slot=\"a\"} 340"}) {
    INFO(line);
    CHECK(Has(t, line));
  }
  CHECK(t.find("slot=\"b\"") == std::string::npos);
}

TEST_CASE("metrics: the node's info is one series whose label values are escaped as the text format wants",
          "[serving_metrics]") {
  Metrics m;
  m.node_name = "edge \"1\"";
  m.model = "a\\b";
  m.revision = "r\n2";
  const std::string t = m.Render();
  CHECK(Has(t, R"(wsup_node_info{node="edge \"1\"",model="a\\b",revision="r\n2"} 1)"));
}

}  // namespace
}  // namespace wsup
