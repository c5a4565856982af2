#include "common/serving_counters.h"

#include <cmath>

namespace wsup::serving {

std::string_view RouteLabel(std::string_view path) {
  if (path == "/v1/completions") return "completions";
  if (path == "/v1/chat/completions") return "chat";
  if (path == "/v1/models") return "models";
  if (path == "/health") return "health";
  return "other";
}

size_t BucketIndex(int64_t us) {
  // Compared in microseconds, so that an observation exactly at a bound
  // falls in that bound's bucket whatever the rounding of the doubles.
  for (size_t i = 0; i < kBoundsSeconds.size(); ++i) {
    if (us <= std::llround(kBoundsSeconds[i] * 1e6)) return i;
  }
  return kBoundsSeconds.size();
}

std::string AnswerKey(std::string_view route, int code) {
  std::string k(kAnswerPrefix);
  k += route;
  k += ':';
  k += std::to_string(code);
  return k;
}

std::string BucketKey(std::string_view hist, std::string_view api, size_t index) {
  std::string k(hist);
  k += "_bucket:";
  k += api;
  k += ':';
  k += std::to_string(index);
  return k;
}

std::string SumKey(std::string_view hist, std::string_view api) {
  std::string k(hist);
  k += "_sum_us:";
  k += api;
  return k;
}

}  // namespace wsup::serving
