#include "tests/test_util.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

namespace wsup::test {

namespace {

// The build records where the test data and programs are; the environment
// may say otherwise (a bundle run on another machine).
std::string FromEnvOr(const char* var, const char* built_in) {
  const char* v = std::getenv(var);
  return v && *v ? std::string(v) : std::string(built_in);
}

}  // namespace

std::string TestData(const std::string& name) { return FromEnvOr("WSUP_TESTDATA_DIR", WSUP_TESTDATA_DIR) + "/" + name; }
std::string BinPath(const std::string& name) { return FromEnvOr("WSUP_BIN_DIR", WSUP_BIN_DIR) + "/" + name; }
bool HaveTestData(const std::string& name) { return std::filesystem::exists(TestData(name)); }

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = std::string(base && *base ? base : "/tmp") + "/wsup-test-XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (!::mkdtemp(buf.data())) {
    std::fprintf(stderr, "mkdtemp(%s): %s\n", tmpl.c_str(), std::strerror(errno));
    std::abort();
  }
  path_ = buf.data();
}

TempDir::~TempDir() {
  std::error_code ec;
  // Files made read-only by a test must not block the clean-up.
  std::filesystem::permissions(path_, std::filesystem::perms::owner_all,
                               std::filesystem::perm_options::add, ec);
  std::filesystem::remove_all(path_, ec);
}

bool WaitFor(const std::function<bool()>& cond, std::chrono::milliseconds limit) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  for (;;) {
    if (cond()) return true;
    if (std::chrono::steady_clock::now() >= deadline) return cond();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

Child::~Child() {
  if (pid_ > 0 && !reaped_) {
    ::kill(pid_, SIGKILL);
    int st = 0;
    ::waitpid(pid_, &st, 0);
  }
}

Child::Child(Child&& o) noexcept { *this = std::move(o); }

Child& Child::operator=(Child&& o) noexcept {
  if (this != &o) {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      int st = 0;
      ::waitpid(pid_, &st, 0);
    }
    pid_ = o.pid_;
    exit_code_ = o.exit_code_;
    reaped_ = o.reaped_;
    o.pid_ = -1;
    o.reaped_ = true;
  }
  return *this;
}

Child Child::Start(const std::vector<std::string>& argv, const std::string& log_path,
                   const std::vector<int>& extra_fds) {
  Child c;
  pid_t pid = ::fork();
  if (pid < 0) {
    std::fprintf(stderr, "fork: %s\n", std::strerror(errno));
    std::abort();
  }
  if (pid == 0) {
    if (!log_path.empty()) {
      int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
        ::close(fd);
      }
    }
    // Move extra fds out of the way first, then into 3, 4, ...
    std::vector<int> moved;
    for (int fd : extra_fds) moved.push_back(::fcntl(fd, F_DUPFD, 100));
    for (size_t i = 0; i < moved.size(); ++i) ::dup2(moved[i], 3 + static_cast<int>(i));
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    std::fprintf(stderr, "exec %s: %s\n", args[0], std::strerror(errno));
    ::_exit(127);
  }
  c.pid_ = pid;
  return c;
}

bool Child::running() {
  if (pid_ <= 0 || reaped_) return false;
  int st = 0;
  pid_t r = ::waitpid(pid_, &st, WNOHANG);
  if (r == pid_) {
    reaped_ = true;
    exit_code_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    return false;
  }
  return true;
}

void Child::Kill(int sig) {
  if (pid_ > 0 && !reaped_) ::kill(pid_, sig);
}

int Child::Wait(std::chrono::milliseconds limit) {
  if (!WaitFor([&] { return !running(); }, limit)) return -1;
  return exit_code_;
}

RunResult Run(const std::vector<std::string>& argv, std::chrono::milliseconds limit) {
  TempDir dir;
  std::string log = dir.Join("out.log");
  Child c = Child::Start(argv, log);
  RunResult r;
  if (c.Wait(limit) < 0) {
    c.Kill(SIGKILL);
    c.Wait(std::chrono::seconds(5));
    r.exit_code = -1;
  } else {
    r.exit_code = c.exit_code();
  }
  r.output = ReadAll(log);
  return r;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace wsup::test
