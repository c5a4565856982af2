// The serving counters' keys and buckets: the contract between the front,
// which counts, and the supervisor, which renders (common/serving_counters.h).
#include "common/serving_counters.h"

#include <catch2/catch.hpp>

#include <set>
#include <string>

namespace wsup::serving {
namespace {

TEST_CASE("serving counters: an observation at a bound falls in that bound's bucket, past the last in +Inf",
          "[serving_counters]") {
  CHECK(BucketIndex(0) == 0);
  CHECK(BucketIndex(-5) == 0);
  CHECK(BucketIndex(1000) == 0);  // 1 ms: le="0.001"
  CHECK(BucketIndex(1001) == 1);
  CHECK(BucketIndex(2500) == 1);
  CHECK(BucketIndex(2501) == 2);
  CHECK(BucketIndex(50'000) == 5);  // 50 ms: le="0.05"
  CHECK(kBoundsSeconds[BucketIndex(150'000)] == 0.15);
  CHECK(BucketIndex(80'000'000) == kBoundsSeconds.size() - 1);
  CHECK(BucketIndex(80'000'001) == kBoundsSeconds.size());
  // The bounds rise: each observation has exactly one bucket.
  for (size_t i = 1; i < kBoundsSeconds.size(); ++i) CHECK(kBoundsSeconds[i] > kBoundsSeconds[i - 1]);
}

TEST_CASE("serving counters: routes get their labels, anything else is other", "[serving_counters]") {
  CHECK(RouteLabel("/v1/completions") == "completions");
  CHECK(RouteLabel("/v1/chat/completions") == "chat");
  CHECK(RouteLabel("/v1/models") == "models");
  CHECK(RouteLabel("/health") == "health");
  CHECK(RouteLabel("/v1/completions/") == "other");
  CHECK(RouteLabel("/wsup/status") == "other");
  CHECK(RouteLabel("") == "other");
}

TEST_CASE("serving counters: keys are distinct for every histogram, API and bucket", "[serving_counters]") {
  std::set<std::string> keys;
  size_t n = 0;
  for (auto hist : kHistograms) {
    for (auto api : kApis) {
      for (size_t i = 0; i <= kBoundsSeconds.size(); ++i, ++n) keys.insert(BucketKey(hist, api, i));
      keys.insert(SumKey(hist, api));
      ++n;
    }
  }
  for (auto route : kRoutes) {
    keys.insert(AnswerKey(route, 200));
    keys.insert(AnswerKey(route, 0));
    n += 2;
  }
  CHECK(keys.size() == n);
  CHECK(BucketKey("ttft", "chat", 3) == "ttft_bucket:chat:3");
  CHECK(SumKey("tpot", "completions") == "tpot_sum_us:completions");
  CHECK(AnswerKey("other", 404) == "answer:other:404");
  CHECK(AnswerKey("chat", 200).rfind(std::string(kAnswerPrefix), 0) == 0);
}

}  // namespace
}  // namespace wsup::serving
