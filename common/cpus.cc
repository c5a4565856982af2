#include "common/cpus.h"

#include <sched.h>

#include <thread>

namespace wsup {

int UsableCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  // A machine with more CPUs than cpu_set_t holds (1024) fails the call
  // above (EINVAL); the online count is the best answer left there.
  unsigned hw = std::thread::hardware_concurrency();
  return hw > 0 ? static_cast<int>(hw) : 1;
}

}  // namespace wsup
