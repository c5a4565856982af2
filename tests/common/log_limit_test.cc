#include <catch2/catch.hpp>

#include "common/log_limit.h"

namespace wsup {
namespace {

TEST_CASE("LogLimiter lets one message a interval through and counts the ones it held back") {
  LogLimiter l(1000);
  uint64_t held = 99;
  CHECK(l.Allow(5, &held));  // the first one always
  CHECK(held == 0);
  // A timer every 5 ms for a second: all held back.
  int through = 0;
  for (int64_t t = 10; t < 1005; t += 5) through += l.Allow(t, &held);
  CHECK(through == 0);
  // A second after the last one let through: let through, with the count.
  CHECK(l.Allow(1005, &held));
  CHECK(held == 199);
  CHECK_FALSE(l.Allow(1006, &held));
  CHECK(l.Allow(3000, &held));
  CHECK(held == 1);
}

}  // namespace
}  // namespace wsup
