#include "common/clock.h"

#include <ctime>

namespace wsup {
namespace {

int64_t ReadUs(clockid_t id) {
  timespec ts{};
  clock_gettime(id, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000 + ts.tv_nsec / 1000;
}

class SystemClock : public Clock {
 public:
  int64_t MonotonicMs() const override { return ReadUs(CLOCK_MONOTONIC) / 1000; }
  int64_t MonotonicUs() const override { return ReadUs(CLOCK_MONOTONIC); }
  int64_t WallMs() const override { return ReadUs(CLOCK_REALTIME) / 1000; }
};

}  // namespace

Clock& RealClock() {
  static SystemClock clock;
  return clock;
}

}  // namespace wsup
