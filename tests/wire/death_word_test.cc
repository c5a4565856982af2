// The death word against real processes: a forked child arms it, is
// killed (or exits), and the word must say so before its files close.
#include <catch2/catch.hpp>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <future>

#include "tests/armed_child.h"
#include "testkit/test_util.h"
#include "wire/death_word.h"

namespace wsup {
namespace {

using namespace std::chrono_literals;

using test::ArmedChild;
using test::AwaitGone;
using test::ForkArmedChild;

// A waiter on the page of `fd`, for this test's thread.
std::unique_ptr<DeathWordWaiter> Waiter(int fd) {
  auto w = DeathWordWaiter::Open(fd);
  REQUIRE(w.ok());
  return std::unique_ptr<DeathWordWaiter>(*w);
}

uint32_t WordOf(int fd) {
  DeathWordPage p{};
  REQUIRE(::pread(fd, &p, sizeof p, 0) == static_cast<ssize_t>(sizeof p));
  return p.word;
}

TEST_CASE("death word: a fresh page is a versioned header with the word 0") {
  auto fd = MakeDeathWord();
  REQUIRE(fd.ok());
  DeathWordPage p{};
  REQUIRE(::pread(fd->get(), &p, sizeof p, 0) == static_cast<ssize_t>(sizeof p));
  CHECK(p.magic == kDeathWordMagic);
  CHECK(p.version == kDeathWordVersion);
  CHECK(p.word == 0);
  CHECK(::lseek(fd->get(), 0, SEEK_END) == static_cast<off_t>(kDeathWordBytes));
  CHECK((::fcntl(fd->get(), F_GETFD) & FD_CLOEXEC) != 0);
}

TEST_CASE("death word: a killed engine's word is marked before its files close, and the waiter wakes") {
  auto fd = MakeDeathWord();
  REQUIRE(fd.ok());
  ArmedChild ch = ForkArmedChild(fd->get(), /*arm=*/true);
  auto w = Waiter(fd->get());
  DeathWordPage p{};
  REQUIRE(::pread(fd->get(), &p, sizeof p, 0) == static_cast<ssize_t>(sizeof p));
  CHECK(p.pid == static_cast<uint32_t>(ch.pid));
  CHECK(w->armed_tid() != 0);
  CHECK_FALSE(w->died());
  auto outcome = std::async(std::launch::async, [&] { return w->Wait(); });
  // Not while it lives.
  CHECK(outcome.wait_for(50ms) == std::future_status::timeout);
  REQUIRE(::kill(ch.pid, SIGKILL) == 0);
  // The kernel marks the word as the owning thread exits, before it closes
  // the process's files: by the lifeline's EOF it must be marked.
  pollfd pl{ch.life, POLLIN, 0};
  REQUIRE(::poll(&pl, 1, 10'000) == 1);
  CHECK(w->died());
  REQUIRE(outcome.wait_for(10s) == std::future_status::ready);
  CHECK(outcome.get() == DeathWordWaiter::Outcome::kDied);
  AwaitGone(ch);
}

TEST_CASE("death word: an engine that exits by itself marks it too") {
  auto fd = MakeDeathWord();
  REQUIRE(fd.ok());
  ArmedChild ch = ForkArmedChild(fd->get(), /*arm=*/true, /*exit_code=*/0);
  AwaitGone(ch);
  CHECK((WordOf(fd->get()) & 0x40000000u) != 0);  // FUTEX_OWNER_DIED
}

TEST_CASE("death word: an engine that never arms it is never taken for dead, and Stop ends the wait") {
  auto fd = MakeDeathWord();
  REQUIRE(fd.ok());
  ArmedChild ch = ForkArmedChild(fd->get(), /*arm=*/false);
  auto w = Waiter(fd->get());
  auto outcome = std::async(std::launch::async, [&] { return w->Wait(); });
  REQUIRE(::kill(ch.pid, SIGKILL) == 0);
  AwaitGone(ch);
  CHECK(WordOf(fd->get()) == 0);
  CHECK_FALSE(w->died());
  CHECK(outcome.wait_for(20ms) == std::future_status::timeout);
  w->Stop();
  REQUIRE(outcome.wait_for(10s) == std::future_status::ready);
  CHECK(outcome.get() == DeathWordWaiter::Outcome::kStopped);
}

TEST_CASE("death word: a waiter that starts before the engine arms wakes at its death") {
  auto fd = MakeDeathWord();
  REQUIRE(fd.ok());
  // The child is forked before this process starts a thread (a fork beside
  // a running thread may inherit a held allocator lock), and arms on cue.
  int go[2];
  REQUIRE(::pipe2(go, O_CLOEXEC) == 0);
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    char c;
    if (::read(go[0], &c, 1) != 1 || !ArmDeathWord(fd->get()).ok()) _exit(3);
    for (;;) ::pause();
  }
  ::close(go[0]);
  auto w = Waiter(fd->get());
  auto outcome = std::async(std::launch::async, [&] { return w->Wait(); });
  REQUIRE(::write(go[1], "g", 1) == 1);
  ::close(go[1]);
  REQUIRE(test::WaitFor([&] { return w->armed_tid() != 0; }, 10s));
  REQUIRE(::kill(pid, SIGKILL) == 0);
  REQUIRE(outcome.wait_for(10s) == std::future_status::ready);
  CHECK(outcome.get() == DeathWordWaiter::Outcome::kDied);
  REQUIRE(::waitpid(pid, nullptr, 0) == pid);
}

TEST_CASE("death word: a page armed once cannot be armed by a second engine") {
  auto fd = MakeDeathWord();
  REQUIRE(fd.ok());
  ArmedChild first = ForkArmedChild(fd->get(), /*arm=*/true);
  // The second child reports 'e': its ArmDeathWord failed.
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    Status st = ArmDeathWord(fd->get());
    const bool named = !st.ok() && st.error().message().find("already armed") != std::string::npos &&
                       st.error().message().find("fresh one from its supervisor") != std::string::npos;
    char c = named ? 'n' : 'x';
    _exit(::write(ready[1], &c, 1) == 1 ? 0 : 3);
  }
  ::close(ready[1]);
  char c = 0;
  REQUIRE(::read(ready[0], &c, 1) == 1);
  ::close(ready[0]);
  CHECK(c == 'n');
  REQUIRE(::waitpid(pid, nullptr, 0) == pid);
  REQUIRE(::kill(first.pid, SIGKILL) == 0);
  AwaitGone(first);
}

TEST_CASE("death word: what is not a death word is refused with its name") {
  SECTION("a page of another kind") {
    int fd = ::memfd_create("not-a-death-word", MFD_CLOEXEC);
    REQUIRE(fd >= 0);
    REQUIRE(::ftruncate(fd, kDeathWordBytes) == 0);
    auto w = DeathWordWaiter::Open(fd);
    REQUIRE_FALSE(w.ok());
    CHECK_THAT(w.error().message(), Catch::Contains("not a death word"));
    // Arming in a child, so that this process arms nothing.
    pid_t pid = ::fork();
    if (pid == 0) {
      Status st = ArmDeathWord(fd);
      _exit(!st.ok() && st.error().message().find("fd " + std::to_string(fd)) != std::string::npos ? 0 : 1);
    }
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
    ::close(fd);
  }
  SECTION("a page too short") {
    int fd = ::memfd_create("short", MFD_CLOEXEC);
    REQUIRE(fd >= 0);
    REQUIRE(::ftruncate(fd, 16) == 0);
    auto w = DeathWordWaiter::Open(fd);
    REQUIRE_FALSE(w.ok());
    CHECK_THAT(w.error().message(), Catch::Contains("16 bytes"));
    ::close(fd);
  }
  SECTION("a pipe") {
    int p[2];
    REQUIRE(::pipe(p) == 0);
    auto w = DeathWordWaiter::Open(p[0]);
    REQUIRE_FALSE(w.ok());
    ::close(p[0]);
    ::close(p[1]);
  }
}

TEST_CASE("death word: WSUP_DEATH_FD unset, not a number, or naming no file") {
  // Each in a child: the variable is the process's, and a success would arm.
  auto run = [](const char* value) -> std::string {
    int p[2];
    REQUIRE(::pipe(p) == 0);
    pid_t pid = ::fork();
    if (pid == 0) {
      ::close(p[0]);
      if (value) {
        ::setenv(kDeathFdEnv, value, 1);
      } else {
        ::unsetenv(kDeathFdEnv);
      }
      auto r = ArmDeathWordFromEnv();
      std::string out = r.ok() ? (*r ? "armed" : "unset") : r.error().message();
      (void)!::write(p[1], out.data(), out.size());
      _exit(0);
    }
    ::close(p[1]);
    std::string out;
    char buf[512];
    ssize_t n;
    while ((n = ::read(p[0], buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
    ::close(p[0]);
    REQUIRE(::waitpid(pid, nullptr, 0) == pid);
    return out;
  };
  CHECK(run(nullptr) == "unset");
  std::string bad = run("seven");
  CHECK_THAT(bad, Catch::Contains("WSUP_DEATH_FD='seven' is not a file descriptor number"));
  CHECK_THAT(bad, Catch::Contains("unset it"));
  CHECK_THAT(run("1000000"), Catch::Contains("names no open file"));
  CHECK_THAT(run("-3"), Catch::Contains("not a file descriptor number"));
}

}  // namespace
}  // namespace wsup
