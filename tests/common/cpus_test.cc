#include <catch2/catch.hpp>
#include <sched.h>

#include <thread>

#include "common/cpus.h"

namespace wsup {
namespace {

// Runs UsableCpus() on a thread whose mask holds the first `keep` CPUs of
// this process's mask (a thread's mask is its own, so the test's other
// threads are untouched).
int UsableOnFirst(int keep) {
  int seen = -1;
  std::thread t([&] {
    cpu_set_t all, some;
    CPU_ZERO(&all);
    CPU_ZERO(&some);
    REQUIRE(::sched_getaffinity(0, sizeof(all), &all) == 0);
    int kept = 0;
    for (int c = 0; c < CPU_SETSIZE && kept < keep; ++c) {
      if (CPU_ISSET(c, &all)) {
        CPU_SET(c, &some);
        ++kept;
      }
    }
    REQUIRE(::sched_setaffinity(0, sizeof(some), &some) == 0);
    seen = UsableCpus();
  });
  t.join();
  return seen;
}

TEST_CASE("UsableCpus counts the CPUs in the affinity mask, not every CPU online") {
  cpu_set_t mine;
  CPU_ZERO(&mine);
  REQUIRE(::sched_getaffinity(0, sizeof(mine), &mine) == 0);
  CHECK(UsableCpus() == CPU_COUNT(&mine));
  CHECK(UsableOnFirst(1) == 1);
  if (CPU_COUNT(&mine) >= 2) {
    CHECK(UsableOnFirst(2) == 2);
  }
}

}  // namespace
}  // namespace wsup
