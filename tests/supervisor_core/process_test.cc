#include <catch2/catch.hpp>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>

#include "supervisor/process.h"
#include "tests/armed_child.h"
#include "testkit/test_util.h"
#include "wire/death_word.h"

namespace wsup {
namespace {

using namespace std::chrono_literals;

// Runs the loop until done() or the bound passes; returns done().
bool RunUntil(uv_loop_t* loop, const std::function<bool()>& done, std::chrono::milliseconds limit) {
  return test::WaitFor(
      [&] {
        uv_run(loop, UV_RUN_NOWAIT);
        return done();
      },
      limit);
}

// An exit watch that records the exit: got once it came, info what it was.
struct ExitRecord {
  bool got = false;
  ExitInfo info;
  ExitWatch* watch = nullptr;  // closed by the test
  void Watch(uv_loop_t* loop, pid_t pid) {
    auto w = ExitWatch::Start(loop, pid, [this](const ExitInfo& i) {
      got = true;
      info = i;
    });
    REQUIRE(w.ok());
    watch = *w;
  }
};

void CloseLoop(uv_loop_t* loop) {
  uv_walk(loop, [](uv_handle_t* h, void*) { if (!uv_is_closing(h)) uv_close(h, nullptr); }, nullptr);
  uv_run(loop, UV_RUN_DEFAULT);
  REQUIRE(uv_loop_close(loop) == 0);
}

TEST_CASE("a spawned child runs in its own session and its exit status is reported") {
  uv_loop_t loop;
  uv_loop_init(&loop);
  test::TempDir dir;
  ChildSpec spec;
  spec.argv = {"/bin/sh", "-c", "echo sid=$(ps -o sid= -p $$ | tr -d ' ') pid=$$; exit 7"};
  spec.log_path = dir.Join("child.log");
  auto pid = SpawnChild(spec);
  REQUIRE(pid.ok());
  ExitRecord watched;
  watched.Watch(&loop, *pid);
  REQUIRE(RunUntil(&loop, [&] { return watched.got; }, 10s));
  CHECK(watched.info.known);
  CHECK(watched.info.exit_code == 7);
  CHECK(watched.info.Describe() == "exit 7");
  std::string log = test::ReadAll(spec.log_path);
  std::string want = "sid=" + std::to_string(*pid) + " pid=" + std::to_string(*pid);
  CHECK(log.find(want) != std::string::npos);
  watched.watch->Close();
  CloseLoop(&loop);
}

TEST_CASE("SignalGroup kills the child and its own children") {
  uv_loop_t loop;
  uv_loop_init(&loop);
  test::TempDir dir;
  ChildSpec spec;
  // The grandchild writes its pid; both block until killed.
  spec.argv = {"/bin/sh", "-c", "sleep 600 & echo $! > " + dir.Join("gc.pid") + "; wait"};
  auto pid = SpawnChild(spec);
  REQUIRE(pid.ok());
  ExitRecord watched;
  watched.Watch(&loop, *pid);
  REQUIRE(test::WaitFor([&] { return test::ReadAll(dir.Join("gc.pid")).find('\n') != std::string::npos; }, 10s));
  pid_t gc = std::stoi(test::ReadAll(dir.Join("gc.pid")));
  REQUIRE(ProcessAlive(gc));
  REQUIRE(SignalGroup(*pid, SIGKILL).ok());
  REQUIRE(RunUntil(&loop, [&] { return watched.got; }, 10s));
  CHECK(watched.info.signal == SIGKILL);
  CHECK(watched.info.Describe() == "killed by SIGKILL");
  // The grandchild is reparented and reaped by init (or a subreaper); it must be gone.
  CHECK(test::WaitFor([&] { return !ProcessAlive(gc); }, 10s));
  watched.watch->Close();
  CloseLoop(&loop);
}

TEST_CASE("passed fds arrive as 3, 4 in order") {
  test::TempDir dir;
  int p1[2], p2[2];
  REQUIRE(::pipe(p1) == 0);
  REQUIRE(::pipe(p2) == 0);
  ChildSpec spec;
  spec.argv = {"/bin/sh", "-c", "echo one >&3; echo two >&4"};
  spec.pass_fds = {p1[1], p2[1]};
  auto pid = SpawnChild(spec);
  REQUIRE(pid.ok());
  ::close(p1[1]);
  ::close(p2[1]);
  char buf[16] = {};
  CHECK(::read(p1[0], buf, sizeof buf) == 4);
  CHECK(std::string(buf, 3) == "one");
  CHECK(::read(p2[0], buf, sizeof buf) == 4);
  CHECK(std::string(buf, 3) == "two");
  ::close(p1[0]);
  ::close(p2[0]);
  int st;
  ::waitpid(*pid, &st, 0);
}

TEST_CASE("a death watch runs its callback on the loop when the engine that armed the word is killed") {
  uv_loop_t loop;
  uv_loop_init(&loop);
  auto fd = MakeDeathWord();
  REQUIRE(fd.ok());
  test::ArmedChild child = test::ForkArmedChild(fd->get(), /*arm=*/true);
  int fired = 0;
  auto w = DeathWatch::Start(&loop, fd->get(), [&] { ++fired; });
  REQUIRE(w.ok());
  CHECK((*w)->armed());
  uv_run(&loop, UV_RUN_NOWAIT);
  CHECK(fired == 0);
  REQUIRE(::kill(child.pid, SIGKILL) == 0);
  REQUIRE(RunUntil(&loop, [&] { return fired > 0; }, 10s));
  test::AwaitGone(child);
  uv_run(&loop, UV_RUN_NOWAIT);
  CHECK(fired == 1);
  (*w)->Close();
  uv_run(&loop, UV_RUN_DEFAULT);
  REQUIRE(uv_loop_close(&loop) == 0);
}

TEST_CASE("a death watch closed before the death, or on an engine that never armed, never calls back") {
  uv_loop_t loop;
  uv_loop_init(&loop);
  const bool arm = GENERATE(true, false);
  auto fd = MakeDeathWord();
  REQUIRE(fd.ok());
  test::ArmedChild child = test::ForkArmedChild(fd->get(), arm);
  int fired = 0;
  auto w = DeathWatch::Start(&loop, fd->get(), [&] { ++fired; });
  REQUIRE(w.ok());
  CHECK((*w)->armed() == arm);
  if (arm) (*w)->Close();  // closed first, then the death
  REQUIRE(::kill(child.pid, SIGKILL) == 0);
  test::AwaitGone(child);
  // The word (if armed) is marked by now. A closed watch's thread never
  // signals the loop, and an unarmed word is never marked: nothing to wait for.
  uv_run(&loop, UV_RUN_NOWAIT);
  CHECK(fired == 0);
  if (!arm) (*w)->Close();
  uv_run(&loop, UV_RUN_DEFAULT);
  REQUIRE(uv_loop_close(&loop) == 0);
}

TEST_CASE("a missing program gives an error naming it") {
  ChildSpec spec;
  spec.argv = {"/nonexistent/wsup-engine"};
  auto pid = SpawnChild(spec);
  REQUIRE_FALSE(pid.ok());
  CHECK(pid.error().message().find("/nonexistent/wsup-engine") != std::string::npos);
  ChildSpec empty;
  CHECK_FALSE(SpawnChild(empty).ok());
}

TEST_CASE("an adopted process (not our child) is watched too, with status unknown") {
  uv_loop_t loop;
  uv_loop_init(&loop);
  // A grandchild: our child forks it and exits at once, so it is not ours.
  int p[2];
  REQUIRE(::pipe(p) == 0);
  pid_t mid = ::fork();
  if (mid == 0) {
    pid_t gc = ::fork();
    if (gc == 0) {
      ::close(p[0]);
      ::close(p[1]);
      // Not Catch's handler (inherited by the fork): just die.
      ::signal(SIGTERM, SIG_DFL);
      for (;;) ::pause();  // until the test's SIGTERM
    }
    ::dprintf(p[1], "%d\n", gc);
    ::_exit(0);
  }
  ::close(p[1]);
  int st;
  ::waitpid(mid, &st, 0);
  char buf[32] = {};
  REQUIRE(::read(p[0], buf, sizeof buf - 1) > 0);
  ::close(p[0]);
  pid_t gc = std::atoi(buf);
  REQUIRE(gc > 1);
  REQUIRE(ProcessAlive(gc));
  REQUIRE(ProcessStartTime(gc).ok());
  ExitRecord watched;
  watched.Watch(&loop, gc);
  uv_run(&loop, UV_RUN_NOWAIT);
  CHECK_FALSE(watched.got);
  ::kill(gc, SIGTERM);
  REQUIRE(RunUntil(&loop, [&] { return watched.got; }, 10s));
  CHECK_FALSE(watched.info.known);
  watched.watch->Close();
  CloseLoop(&loop);
}

}  // namespace
}  // namespace wsup
