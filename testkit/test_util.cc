#include "testkit/test_util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <grp.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string_view>
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
                   const std::vector<int>& extra_fds,
                   const std::vector<std::pair<std::string, std::string>>& env_set) {
  // Everything the child needs is made here, before the fork. The test
  // process has threads (fake engines, readers), and one of them may hold the
  // allocator's lock at the fork: a child that allocates (std::vector,
  // setenv, stdio) can then wait on that lock for ever. Under ASan this hung
  // a front start in CI, its log empty. Between fork and exec the child makes
  // only async-signal-safe calls.
  std::vector<char*> args;
  args.reserve(argv.size() + 1);
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);

  std::vector<std::string> env_text;
  for (char** e = environ; e && *e; ++e) {
    std::string_view entry(*e);
    bool replaced = false;
    for (const auto& [k, v] : env_set) {
      replaced = replaced || (entry.size() > k.size() && entry.compare(0, k.size(), k) == 0 && entry[k.size()] == '=');
    }
    if (!replaced) env_text.emplace_back(entry);
  }
  for (const auto& [k, v] : env_set) env_text.push_back(k + "=" + v);
  std::vector<char*> envp;
  envp.reserve(env_text.size() + 1);
  for (auto& e : env_text) envp.push_back(e.data());
  envp.push_back(nullptr);

  // Copies of the extra fds out of the way of 3, 4, ... (close-on-exec, so
  // only the dup2 targets survive the exec; dup2 clears the flag on those).
  std::vector<int> moved;
  for (int fd : extra_fds) {
    int m = ::fcntl(fd, F_DUPFD_CLOEXEC, 100);
    if (m < 0) {
      std::fprintf(stderr, "fcntl(F_DUPFD_CLOEXEC, %d): %s\n", fd, std::strerror(errno));
      std::abort();
    }
    moved.push_back(m);
  }
  const std::string exec_failed = "exec " + argv.at(0) + " failed\n";

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
    for (size_t i = 0; i < moved.size(); ++i) ::dup2(moved[i], 3 + static_cast<int>(i));
    ::signal(SIGPIPE, SIG_DFL);  // the test process ignores it (test_main.cc); a program starts with the default
    ::execve(args[0], args.data(), envp.data());
    ssize_t ignored = ::write(2, exec_failed.data(), exec_failed.size());
    (void)ignored;
    ::_exit(127);
  }
  for (int m : moved) ::close(m);
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

std::vector<TaggedProcess> TaggedProcesses(const std::string& var, const std::string& value) {
  std::vector<TaggedProcess> out;
  const std::string needle = var + "=" + value;
  const pid_t self = ::getpid();
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    pid_t pid = static_cast<pid_t>(std::atoi(name.c_str()));
    if (pid == self) continue;
    // Zombies have no environment left to read and are not running.
    std::string stat = ReadAll("/proc/" + name + "/stat");
    auto rp = stat.rfind(')');
    if (rp == std::string::npos || rp + 2 >= stat.size() || stat[rp + 2] == 'Z' || stat[rp + 2] == 'X') continue;
    std::string env = ReadAll("/proc/" + name + "/environ");
    bool found = false;
    for (size_t pos = 0; pos < env.size();) {
      size_t end = env.find('\0', pos);
      if (end == std::string::npos) end = env.size();
      if (env.compare(pos, end - pos, needle) == 0) {
        found = true;
        break;
      }
      pos = end + 1;
    }
    if (!found) continue;
    std::string cmd = ReadAll("/proc/" + name + "/cmdline");
    for (char& c : cmd) {
      if (c == '\0') c = ' ';
    }
    out.push_back({pid, cmd});
  }
  return out;
}

std::vector<TaggedProcess> KillLeftovers(const std::string& var, const std::string& value,
                                         std::chrono::milliseconds grace) {
  if (TaggedProcesses(var, value).empty()) return {};
  WaitFor([&] { return TaggedProcesses(var, value).empty(); }, grace);
  std::vector<TaggedProcess> left = TaggedProcesses(var, value);
  for (const auto& p : left) ::kill(p.pid, SIGKILL);
  WaitFor([&] { return TaggedProcesses(var, value).empty(); }, std::chrono::seconds(5));
  return left;
}

std::string OwnerTag() {
  const char* v = std::getenv("WSUP_TEST_OWNER");
  return v ? v : "";
}

namespace {

bool WriteProcFile(const char* path, const std::string& text) {
  int fd = ::open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ::close(fd);
  return ok;
}

}  // namespace

int ThreadCount() {
  std::error_code ec;
  int n = 0;
  for (auto it = std::filesystem::directory_iterator("/proc/self/task", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    ++n;
  }
  return n;
}

int RunForked(const std::function<int()>& body, std::chrono::milliseconds limit) {
  if (int threads = ThreadCount(); threads != 1) {
    std::fprintf(stderr,
                 "RunForked: this process runs %d threads; a forked child could hang on a lock another thread "
                 "held. Fork before starting threads, or start a program (test::Child) instead\n",
                 threads);
    return kForkWithThreads;
  }
  std::fflush(nullptr);  // nothing buffered is written twice
  pid_t pid = ::fork();
  if (pid < 0) return -1;
  if (pid == 0) ::_exit(body());
  int code = -1;
  const bool done = WaitFor(
      [&] {
        int st = 0;
        if (::waitpid(pid, &st, WNOHANG) != pid) return false;
        code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        return true;
      },
      limit);
  if (!done) {
    ::kill(pid, SIGKILL);
    int st = 0;
    ::waitpid(pid, &st, 0);
    return -1;
  }
  return code;
}

int RunForkedAs(uid_t uid, const std::function<int()>& body, std::chrono::milliseconds limit) {
  return RunForked(
      [&] {
        if (::setgroups(0, nullptr) != 0 || ::setgid(uid) != 0 || ::setuid(uid) != 0) return 99;
        return body();
      },
      limit);
}

int RunWithReadOnlyMount(const std::string& dir, const std::function<int()>& body, std::chrono::milliseconds limit) {
  return RunForked(
      [&] {
        const uid_t uid = ::geteuid();
        const gid_t gid = ::getegid();
        if (::unshare(CLONE_NEWNS) != 0) {
          // Not allowed to mount here: a user namespace of our own, as its root.
          if (::unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0) return kNoReadOnlyMount;
          if (!WriteProcFile("/proc/self/setgroups", "deny") ||
              !WriteProcFile("/proc/self/uid_map", "0 " + std::to_string(uid) + " 1") ||
              !WriteProcFile("/proc/self/gid_map", "0 " + std::to_string(gid) + " 1")) {
            return kNoReadOnlyMount;
          }
        }
        if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
            ::mount("tmpfs", dir.c_str(), "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, "size=64k") != 0) {
          return kNoReadOnlyMount;
        }
        return body();
      },
      limit);
}

int FreeLoopbackPort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0;
  ::close(fd);
  return ok ? ntohs(a.sin_port) : 0;
}

}  // namespace wsup::test
