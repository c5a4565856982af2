// ServingStats: what the front's clients saw of one loop's requests, as the
// serving counters of common/serving_counters.h: answers by route and
// status, and for the completion APIs the time to the first token, the time
// per output token and the whole request's time. The proxy's calls report
// to it (front/proxy_call.h); the proxy's status hands it on as counters.
//
// Measured at the front, these are the client's numbers: a request that
// waited in the queue through a failover, or a stream resumed on the other
// engine, shows the wait in its latency.
//
// The histograms are fixed arrays, so that counting a stream's tokens on the
// relay's path costs a few additions; the counters' keys are only written
// when the status is asked for.
//
// Thread-safety: one loop's; not thread-safe.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>

#include <nlohmann/json.hpp>

#include "common/serving_counters.h"

namespace wsup::front {

class ServingStats {
 public:
  // An answer's status on the request's path (0: no answer was started).
  void Answer(std::string_view path, int status);
  // A stream's first token, `us` after the front received the request.
  // `path` names the API (a path with no histogram of its own is ignored).
  void FirstToken(std::string_view path, int64_t us);
  // `tokens` more tokens of a stream, `us` after the tokens before them:
  // each counts as one output token of us / tokens.
  void Tokens(std::string_view path, int64_t us, size_t tokens);
  // A completion request's whole time, from its receipt to its end.
  void Duration(std::string_view path, int64_t us);

  // Adds the counters (the keys of common/serving_counters.h) into *counters.
  void AppendTo(nlohmann::json* counters) const;
  // One counter by its key (0 when it was never counted).
  uint64_t Get(const std::string& key) const;

 private:
  struct Histogram {
    std::array<uint64_t, serving::kBoundsSeconds.size() + 1> buckets{};  // the last is +Inf
    uint64_t sum_us = 0;
  };
  enum Kind : size_t { kTtft, kTpot, kDuration };  // serving::kHistograms' order
  void Observe(Kind kind, std::string_view path, int64_t us, uint64_t times);

  std::array<std::array<Histogram, serving::kApis.size()>, serving::kHistograms.size()> hists_{};
  // (route label, status): the labels are serving::RouteLabel's literals.
  std::map<std::pair<std::string_view, int>, uint64_t> answers_;
};

}  // namespace wsup::front
