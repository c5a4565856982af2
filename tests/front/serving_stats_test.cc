// The front's serving counters (front/serving_stats.h): what one loop
// counts, and how the loops' counts add up in the front's status.
#include "front/serving_stats.h"

#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include "common/serving_counters.h"
#include "front/status_merge.h"

using nlohmann::json;
using namespace wsup::front;
namespace serving = wsup::serving;

namespace {

uint64_t HistCount(const ServingStats& s, const char* hist, const char* api) {
  uint64_t n = 0;
  for (size_t i = 0; i <= serving::kBoundsSeconds.size(); ++i) n += s.Get(serving::BucketKey(hist, api, i));
  return n;
}

}  // namespace

TEST_CASE("serving stats: answers by route and status, latencies only for the completion APIs",
          "[front][serving]") {
  ServingStats s;
  s.Answer("/v1/completions", 200);
  s.Answer("/v1/completions", 200);
  s.Answer("/v1/chat/completions", 503);
  s.Answer("/wsup/status", 404);
  s.Answer("/v1/completions", 0);
  CHECK(s.Get("answer:completions:200") == 2);
  CHECK(s.Get("answer:chat:503") == 1);
  CHECK(s.Get("answer:other:404") == 1);
  CHECK(s.Get("answer:completions:0") == 1);

  s.FirstToken("/v1/completions", 30'000);   // 30 ms: le="0.05"
  s.Duration("/v1/models", 10'000);          // no histogram for models
  s.FirstToken("/health", 10'000);           // nor for health
  CHECK(s.Get(serving::BucketKey("ttft", "completions", serving::BucketIndex(30'000))) == 1);
  CHECK(s.Get(serving::SumKey("ttft", "completions")) == 30'000);
  CHECK(HistCount(s, "ttft", "chat") == 0);
  CHECK(HistCount(s, "duration", "completions") == 0);
  json counters = json::object();
  s.AppendTo(&counters);
  for (const auto& [k, v] : counters.items()) {
    INFO(k);
    CHECK(k.find("models") == std::string::npos);
    CHECK(k.find("health") == std::string::npos);
  }
}

TEST_CASE("serving stats: tokens that came together count at their share of the gap", "[front][serving]") {
  ServingStats s;
  s.Tokens("/v1/chat/completions", 40'000, 4);  // 4 tokens in one event, 40 ms after the last: 10 ms each
  s.Tokens("/v1/chat/completions", 5'000, 0);   // an event without tokens counts nothing
  s.Tokens("/v1/chat/completions", 2'000'000, 1);  // a failover mid-stream: one long gap
  CHECK(HistCount(s, "tpot", "chat") == 5);
  CHECK(s.Get(serving::BucketKey("tpot", "chat", serving::BucketIndex(10'000))) == 4);
  CHECK(s.Get(serving::BucketKey("tpot", "chat", serving::BucketIndex(2'000'000))) == 1);
  CHECK(s.Get(serving::SumKey("tpot", "chat")) == 2'040'000);
}

TEST_CASE("serving stats: the loops' counters add up in the front's status", "[front][serving]") {
  ServingStats one, two;
  one.Answer("/v1/completions", 200);
  one.FirstToken("/v1/completions", 3'000);
  two.Answer("/v1/completions", 200);
  two.Answer("/v1/chat/completions", 200);
  two.FirstToken("/v1/completions", 3'000);
  json a = {{"counters", json::object()}}, b = {{"counters", json::object()}};
  one.AppendTo(&a["counters"]);
  two.AppendTo(&b["counters"]);
  // Through the wire, as the supervisor reads them: unsigned counts.
  json merged = json::parse(MergeLoopStatus({a, b}).dump());
  CHECK(merged["counters"]["answer:completions:200"] == 2);
  CHECK(merged["counters"]["answer:chat:200"] == 1);
  CHECK(merged["counters"][serving::BucketKey("ttft", "completions", serving::BucketIndex(3'000))] == 2);
  CHECK(merged["counters"][serving::SumKey("ttft", "completions")] == 6'000);
  CHECK(merged["counters"]["answer:chat:200"].is_number_unsigned());
}
