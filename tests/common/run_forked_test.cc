// test::RunForked (testkit/test_util.h): the one way tests run code in a
// forked child. It must refuse to fork a process that runs other threads,
// since such a child can hang on a lock held at the fork.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <atomic>
#include <csignal>
#include <chrono>
#include <thread>

#include "testkit/test_util.h"

namespace wsup {
namespace {

using namespace std::chrono_literals;

TEST_CASE("RunForked returns the body's exit code from a child process", "[testkit]") {
  const pid_t parent = ::getpid();
  CHECK(test::RunForked([&] { return ::getpid() != parent ? 7 : 1; }, 10s) == 7);
}

TEST_CASE("RunForked reports a signal as 128 + its number", "[testkit]") {
  CHECK(test::RunForked(
            [] {
              ::raise(SIGKILL);
              return 0;
            },
            10s) == 128 + SIGKILL);
}

TEST_CASE("RunForked kills a child that runs past its limit", "[testkit]") {
  CHECK(test::RunForked(
            [] {
              ::pause();
              return 0;
            },
            200ms) == -1);
}

TEST_CASE("RunForked refuses to fork while another thread runs", "[testkit]") {
  REQUIRE(test::ThreadCount() == 1);
  std::atomic<bool> stop{false};
  std::thread other([&] {
    while (!stop.load()) std::this_thread::yield();
  });
  REQUIRE(test::ThreadCount() == 2);
  int code = test::RunForked([] { return 0; }, 10s);
  stop = true;
  other.join();
  CHECK(code == test::kForkWithThreads);
  CHECK(test::WaitFor([] { return test::ThreadCount() == 1; }, 10s));
  CHECK(test::RunForked([] { return 0; }, 10s) == 0);
}

}  // namespace
}  // namespace wsup
