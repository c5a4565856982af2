// The front's serving counters (answers by route and status, and the
// latency histograms of the completion APIs) as flat keys of its `status`
// "counters" object, so that they travel and add up exactly as its other
// counters do: summed over its loops (front/status_merge.h), then over every
// front process the supervisor has seen (supervisor/front_link.h), and
// rendered by the supervisor as Prometheus series (supervisor/metrics.cc).
// The key names are the contract between the two, defined here once.
//
// A histogram is kept as one counter per bucket (not cumulative: a count of
// observations at most that bound and above the one before; the last
// bucket is +Inf) and the sum of its observations in microseconds, so that
// every key is an unsigned count that only grows.
//
// Values and pure functions; any thread.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace wsup::serving {

// What a route is called in labels: completions, chat, models, health, or
// other (any other path, forwarded or refused by the front).
std::string_view RouteLabel(std::string_view path);
// The routes that have a label of their own, in the order they render.
inline constexpr std::array<std::string_view, 5> kRoutes = {"completions", "chat", "models", "health", "other"};
// The completion APIs whose latency is measured: the label `api`.
inline constexpr std::array<std::string_view, 2> kApis = {"completions", "chat"};

// The latency histograms.
//   ttft: a stream's first token, from the front's receipt of the request
//         (the client's wait, queueing and failovers included);
//   tpot: each later token of a stream, from the token before it (a
//         failover in the middle of a stream shows as one long gap);
//   duration: a completion request from its receipt to the end of its
//         answer, streamed or not.
inline constexpr std::array<std::string_view, 3> kHistograms = {"ttft", "tpot", "duration"};

// Upper bounds in seconds, shared by the three histograms: from a
// millisecond (a tiny model's token on the CPU) to 80 s (a long prompt on
// a busy engine), close to vLLM's and finer at the low end.
inline constexpr std::array<double, 19> kBoundsSeconds = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075,
                                                          0.1,   0.15,   0.25,  0.5,  0.75,  1.0,  2.5,
                                                          5.0,   10.0,   20.0,  40.0, 80.0};

// The bucket an observation of `us` microseconds falls in:
// 0..kBoundsSeconds.size()-1, or kBoundsSeconds.size() for +Inf.
size_t BucketIndex(int64_t us);

// "answer:<route>:<code>": answers of that status on that route; code 0
// is a request that ended with no answer head (its client went away first,
// or the front was stopped).
std::string AnswerKey(std::string_view route, int code);
inline constexpr std::string_view kAnswerPrefix = "answer:";
// "<hist>_bucket:<api>:<index>" and "<hist>_sum_us:<api>".
std::string BucketKey(std::string_view hist, std::string_view api, size_t index);
std::string SumKey(std::string_view hist, std::string_view api);

}  // namespace wsup::serving
