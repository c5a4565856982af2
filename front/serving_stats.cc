#include "front/serving_stats.h"

#include <algorithm>

namespace wsup::front {

void ServingStats::Answer(std::string_view path, int status) { ++answers_[{serving::RouteLabel(path), status}]; }

void ServingStats::Observe(Kind kind, std::string_view path, int64_t us, uint64_t times) {
  const auto api = std::find(serving::kApis.begin(), serving::kApis.end(), serving::RouteLabel(path));
  if (api == serving::kApis.end()) return;
  us = std::max<int64_t>(us, 0);
  Histogram& h = hists_[kind][static_cast<size_t>(api - serving::kApis.begin())];
  h.buckets[serving::BucketIndex(us)] += times;
  h.sum_us += static_cast<uint64_t>(us) * times;
}

void ServingStats::FirstToken(std::string_view path, int64_t us) { Observe(kTtft, path, us, 1); }

void ServingStats::Tokens(std::string_view path, int64_t us, size_t tokens) {
  if (tokens == 0) return;
  // The gap's tokens came together: each is counted at its share of it, so
  // that the histogram's sum stays the stream's time (give or take the
  // rounding of the share).
  const auto n = static_cast<int64_t>(tokens);
  Observe(kTpot, path, std::max<int64_t>(us, 0) / n, tokens);
}

void ServingStats::Duration(std::string_view path, int64_t us) { Observe(kDuration, path, us, 1); }

void ServingStats::AppendTo(nlohmann::json* counters) const {
  for (const auto& [answer, n] : answers_) (*counters)[serving::AnswerKey(answer.first, answer.second)] = n;
  // Only what was observed: an API with no request has no keys.
  for (size_t k = 0; k < hists_.size(); ++k) {
    for (size_t a = 0; a < serving::kApis.size(); ++a) {
      const Histogram& h = hists_[k][a];
      for (size_t i = 0; i < h.buckets.size(); ++i) {
        if (h.buckets[i] == 0) continue;
        (*counters)[serving::BucketKey(serving::kHistograms[k], serving::kApis[a], i)] = h.buckets[i];
      }
      if (h.sum_us > 0) (*counters)[serving::SumKey(serving::kHistograms[k], serving::kApis[a])] = h.sum_us;
    }
  }
}

uint64_t ServingStats::Get(const std::string& key) const {
  nlohmann::json all = nlohmann::json::object();
  AppendTo(&all);
  auto it = all.find(key);
  return it == all.end() ? 0 : it->get<uint64_t>();
}

}  // namespace wsup::front
