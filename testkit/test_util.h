// Helpers shared by the tests: temporary directories, test data paths,
// spawning real processes, and bounded polling instead of sleeping.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace wsup::test {

// testdata/<name> in the repository, or $WSUP_TESTDATA_DIR/<name> when set.
std::string TestData(const std::string& name);
// build/bin/<name>, or $WSUP_BIN_DIR/<name> when set.
std::string BinPath(const std::string& name);
// True when the named checkpoint folder exists (a WSUP_TESTDATA_DIR may lack some).
bool HaveTestData(const std::string& name);

// A fresh directory under $TMPDIR, removed (recursively) on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string Join(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Polls cond every few milliseconds until it holds or `limit` passes.
// Returns whether it held. The only sanctioned way for a test to wait.
bool WaitFor(const std::function<bool()>& cond, std::chrono::milliseconds limit);

// A child process started with fork/exec; stdout and stderr go to a file.
// The destructor SIGKILLs and reaps it if it is still running.
class Child {
 public:
  Child() = default;
  ~Child();
  Child(Child&& o) noexcept;
  Child& operator=(Child&& o) noexcept;
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  // argv[0] is the program path. `log_path` receives stdout+stderr (empty: inherit).
  // extra_fds are dup'ed into the child as fds 3, 4, ... in order.
  // env_set: variables added to (or replacing in) the child's environment.
  static Child Start(const std::vector<std::string>& argv, const std::string& log_path = "",
                     const std::vector<int>& extra_fds = {},
                     const std::vector<std::pair<std::string, std::string>>& env_set = {});

  pid_t pid() const { return pid_; }
  bool running();
  void Kill(int sig);
  // Waits up to `limit` for exit; returns the wait status, or -1 on timeout.
  int Wait(std::chrono::milliseconds limit);
  // Exit code if exited normally, else 128+signal, or -1 while running.
  int exit_code() const { return exit_code_; }

 private:
  pid_t pid_ = -1;
  int exit_code_ = -1;
  bool reaped_ = false;
};

// Runs a program to completion (bounded); returns exit code and combined output.
struct RunResult {
  int exit_code = -1;
  std::string output;
};
RunResult Run(const std::vector<std::string>& argv, std::chrono::milliseconds limit = std::chrono::seconds(60));

std::string ReadAll(const std::string& path);

// Processes a test leaves behind. Every test process puts two variables in
// its environment before any test runs (test_main.cc), and every process it
// starts inherits them, grandchildren too (the supervisor passes its
// environment to the front, holders and engines):
//   WSUP_TEST_RUN=<build dir>   the whole suite of one build tree
//   WSUP_TEST_OWNER=<pid>       this test process
// TaggedProcesses() finds live processes (not zombies) whose environment
// holds var=value. A test process ends by killing and reporting any process
// it owns that is still running (it fails then); the suite ends with a check
// for any process of the run (tests/leftover_check.cc).
struct TaggedProcess {
  pid_t pid = 0;
  std::string cmdline;  // arguments joined by spaces
};
std::vector<TaggedProcess> TaggedProcesses(const std::string& var, const std::string& value);
// Kills the processes tagged var=value that do not exit by themselves
// within `grace` (a test's own clean-up may still be in progress); returns
// those it had to kill.
std::vector<TaggedProcess> KillLeftovers(const std::string& var, const std::string& value,
                                         std::chrono::milliseconds grace);
// The tag of this test process (WSUP_TEST_OWNER's value).
std::string OwnerTag();

// What RunForked returns when it refuses to fork: the process runs more
// than one thread, and a child forked from such a process runs its body on a
// copy of memory whose locks (the allocator's, a logger's) another thread may
// have held at the fork, so it can hang for ever. Fork before starting
// threads, or start a program instead (Child, Run).
inline constexpr int kForkWithThreads = -2;
// The number of threads this process runs now (/proc/self/task).
int ThreadCount();
// Runs `body` in a forked child and returns its exit code (128 + the signal
// when one ended it); `limit` bounds the wait, after which the child is
// killed and -1 returned. `body` may allocate and call anything: the fork is
// refused (kForkWithThreads, with the reason on stderr) unless this process
// runs one thread.
int RunForked(const std::function<int()>& body, std::chrono::milliseconds limit);
// RunForked, with the child's uid and gid set to `uid` first (it needs
// root; the child exits 99 when it cannot change them).
int RunForkedAs(uid_t uid, const std::function<int()>& body, std::chrono::milliseconds limit);

// The exit code of a child that could not mount (no namespaces on this
// machine): the caller skips, and says so.
inline constexpr int kNoReadOnlyMount = 77;
// Runs `body` in a forked child that sees a read-only filesystem (an empty
// tmpfs) at `dir`, which must exist: a mount namespace of its own (and a
// user namespace when not root), so nothing outside the child sees the
// mount. Waits up to `limit`. Returns the child's exit code: body's return
// value (or the exit code of a program it execs), kNoReadOnlyMount when no
// mount could be made, -1 when it ran past the limit (it is then killed).
int RunWithReadOnlyMount(const std::string& dir, const std::function<int()>& body, std::chrono::milliseconds limit);

// A loopback TCP port the kernel had free a moment ago, for programs that
// take a listen address and cannot report a port they picked (Prometheus,
// etcd). 0 when no socket could be bound.
int FreeLoopbackPort();

}  // namespace wsup::test
