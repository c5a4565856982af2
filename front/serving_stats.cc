#include "front/serving_stats.h"

#include <algorithm>

#include "common/serving_counters.h"

namespace wsup::front {

void ServingStats::Answer(std::string_view path, int status) {
  ++counts_[serving::AnswerKey(serving::RouteLabel(path), status)];
}

void ServingStats::Observe(std::string_view hist, std::string_view path, int64_t us, uint64_t times) {
  const std::string_view api = serving::RouteLabel(path);
  if (std::find(serving::kApis.begin(), serving::kApis.end(), api) == serving::kApis.end()) return;
  us = std::max<int64_t>(us, 0);
  counts_[serving::BucketKey(hist, api, serving::BucketIndex(us))] += times;
  counts_[serving::SumKey(hist, api)] += static_cast<uint64_t>(us) * times;
}

void ServingStats::FirstToken(std::string_view path, int64_t us) { Observe("ttft", path, us, 1); }

void ServingStats::Tokens(std::string_view path, int64_t us, size_t tokens) {
  if (tokens == 0) return;
  // The gap's tokens came together: each is counted at its share of it, so
  // that the histogram's sum stays the stream's time (give or take the
  // rounding of the share).
  const auto n = static_cast<int64_t>(tokens);
  Observe("tpot", path, std::max<int64_t>(us, 0) / n, tokens);
}

void ServingStats::Duration(std::string_view path, int64_t us) { Observe("duration", path, us, 1); }

void ServingStats::AppendTo(nlohmann::json* counters) const {
  for (const auto& [k, v] : counts_) (*counters)[k] = v;
}

uint64_t ServingStats::Get(const std::string& key) const {
  auto it = counts_.find(key);
  return it == counts_.end() ? 0 : it->second;
}

}  // namespace wsup::front
