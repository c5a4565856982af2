// A forked child that arms a death word (wire/death_word.h), for tests of
// the word and of the supervisor's watch on it against a real process.
#pragma once

#include <catch2/catch.hpp>
#include <fcntl.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>

#include "wire/death_word.h"

namespace wsup::test {

struct ArmedChild {
  pid_t pid = -1;
  int life = -1;  // read end of a pipe only the child holds open: EOF once its files close
};

// Forks a child that arms the page on `fd` (unless !arm), says so on a pipe
// and then waits to be killed, or exits with `exit_code` >= 0 (through
// atexit, as an engine's clean exit). Returns once the child has armed.
inline ArmedChild ForkArmedChild(int fd, bool arm, int exit_code = -1) {
  int life[2], ready[2];
  REQUIRE(::pipe2(life, O_CLOEXEC) == 0);
  REQUIRE(::pipe2(ready, O_CLOEXEC) == 0);
  pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::close(life[0]);
    ::close(ready[0]);
    char c = 'r';
    if (arm && !ArmDeathWord(fd).ok()) c = 'e';
    if (::write(ready[1], &c, 1) != 1) _exit(3);
    if (exit_code >= 0) std::exit(exit_code);
    for (;;) ::pause();
  }
  ::close(life[1]);
  ::close(ready[1]);
  char c = 0;
  REQUIRE(::read(ready[0], &c, 1) == 1);
  ::close(ready[0]);
  REQUIRE(c == 'r');
  return ArmedChild{pid, life[0]};
}

// Waits (10 s at most) for the child's files to close, then reaps it.
inline void AwaitGone(ArmedChild& ch) {
  pollfd p{ch.life, POLLIN, 0};
  REQUIRE(::poll(&p, 1, 10'000) == 1);
  ::close(ch.life);
  ch.life = -1;
  int status = 0;
  REQUIRE(::waitpid(ch.pid, &status, 0) == ch.pid);
}

}  // namespace wsup::test
