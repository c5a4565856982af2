// Runs after every other test (a CTest fixture cleanup): fails, and kills
// them, when any process started by the suite of this build tree is still
// running. Each test process already checks its own; this catches what
// escaped it (a process started after its owner exited, a test killed by
// the CTest timeout before it could clean up).
#include <cstdio>
#include <cstdlib>
#include <string>

#include "testkit/test_util.h"

int main() {
  const char* run = std::getenv("WSUP_TEST_RUN");
  std::string tag = run && *run ? run : WSUP_BUILD_DIR;
  auto left = wsup::test::KillLeftovers("WSUP_TEST_RUN", tag, std::chrono::seconds(5));
  for (const auto& p : left) {
    std::fprintf(stderr, "LEFTOVER: pid %d of the test suite (%s) was still running and was killed: %s\n", p.pid,
                 tag.c_str(), p.cmdline.c_str());
  }
  if (!left.empty()) {
    std::fprintf(stderr, "FAILED: %zu process(es) outlived the test suite\n", left.size());
    return 1;
  }
  std::printf("no process of the test suite (%s) is left running\n", tag.c_str());
  return 0;
}
