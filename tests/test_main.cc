// The main of every test executable: Catch2's, with a process ledger around
// it. Before any test runs, this process tags its environment (see
// test_util.h TaggedProcesses); after the tests, any process it started that
// still runs is killed and reported, and the run fails: every test must end
// every process it caused, also when it fails.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "testkit/test_util.h"

int main(int argc, char** argv) {
  // As in every wsup program's main: a vanished peer is an error code, not
  // a death. The libraries tested in this process write to sockets whose
  // peers close at any moment (testkit/test_util.cc gives children the
  // default back).
  ::signal(SIGPIPE, SIG_IGN);
  // The suite's tag is inherited when ctest runs us; a test binary started
  // by hand tags its own run.
  if (!std::getenv("WSUP_TEST_RUN")) ::setenv("WSUP_TEST_RUN", WSUP_BUILD_DIR, 1);
  const std::string owner = std::to_string(::getpid());
  ::setenv("WSUP_TEST_OWNER", owner.c_str(), 1);

  int rc = Catch::Session().run(argc, argv);

  auto left = wsup::test::KillLeftovers("WSUP_TEST_OWNER", owner, std::chrono::seconds(3));
  for (const auto& p : left) {
    std::fprintf(stderr, "LEFTOVER: pid %d was still running after the tests and was killed: %s\n", p.pid,
                 p.cmdline.c_str());
  }
  if (!left.empty()) {
    std::fprintf(stderr, "FAILED: %zu process(es) started by these tests outlived them; every test must end the "
                 "processes it starts (also when it fails)\n", left.size());
    return rc != 0 ? rc : 1;
  }
  return rc;
}
