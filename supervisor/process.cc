#include "supervisor/process.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>
#include <sstream>

#include "common/unique_fd.h"
#include "wire/death_word.h"

extern char** environ;

namespace wsup {
namespace {

int PidfdOpen(pid_t pid) { return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)); }

}  // namespace

Result<pid_t> SpawnChild(const ChildSpec& spec) {
  if (spec.argv.empty() || spec.argv[0].empty()) {
    return InvalidArgument("cannot start a child with an empty command; set the command in the config");
  }
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&fa);
  posix_spawnattr_init(&attr);
  struct Cleanup {
    posix_spawn_file_actions_t* fa;
    posix_spawnattr_t* attr;
    ~Cleanup() {
      posix_spawn_file_actions_destroy(fa);
      posix_spawnattr_destroy(attr);
    }
  } cleanup{&fa, &attr};

  // A fresh session: own process group, no controlling terminal, not in the
  // supervisor's group, so neither a terminal's ^C nor the supervisor's death
  // reaches it. Default signal dispositions and an empty mask.
  short flags = POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF;
  posix_spawnattr_setflags(&attr, flags);
  sigset_t empty, all;
  sigemptyset(&empty);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attr, &empty);
  posix_spawnattr_setsigdefault(&attr, &all);

  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  if (!spec.log_path.empty()) {
    posix_spawn_file_actions_addopen(&fa, 1, spec.log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0640);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
  }
  // dup2 onto 3.. could clobber a source fd that is itself numbered 3..;
  // move every source above the target range first.
  std::vector<UniqueFd> staged;
  int base = 3 + static_cast<int>(spec.pass_fds.size()) + 16;
  for (int fd : spec.pass_fds) {
    int moved = ::fcntl(fd, F_DUPFD_CLOEXEC, base);
    if (moved < 0) return ErrnoError(spec.argv[0] + ": cannot pass fd " + std::to_string(fd), errno);
    staged.emplace_back(moved);
  }
  for (size_t i = 0; i < staged.size(); ++i) {
    posix_spawn_file_actions_adddup2(&fa, staged[i].get(), 3 + static_cast<int>(i));
  }
  if (!spec.cwd.empty()) posix_spawn_file_actions_addchdir_np(&fa, spec.cwd.c_str());

  std::vector<std::string> env_store;
  for (char** e = environ; *e; ++e) {
    std::string kv(*e);
    bool overridden = false;
    for (const auto& [k, v] : spec.env_set) {
      if (kv.compare(0, k.size() + 1, k + "=") == 0) overridden = true;
    }
    if (!overridden) env_store.push_back(std::move(kv));
  }
  for (const auto& [k, v] : spec.env_set) env_store.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (auto& s : env_store) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<char*> argv;
  for (const auto& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);

  pid_t pid = -1;
  int rc = ::posix_spawnp(&pid, argv[0], &fa, &attr, argv.data(), envp.data());
  if (rc != 0) {
    return ErrnoError("cannot start " + spec.argv[0] + " (check the path in the config and that it is executable)",
                      rc);
  }
  return pid;
}

std::string ExitInfo::Describe() const {
  if (!known) return "exited (status unknown: not our child)";
  if (signal) return std::string("killed by ") + (sigabbrev_np(signal) ? "SIG" : "") +
                     (sigabbrev_np(signal) ? sigabbrev_np(signal) : std::to_string(signal).c_str());
  return "exit " + std::to_string(exit_code);
}

Result<ExitWatch*> ExitWatch::Start(uv_loop_t* loop, pid_t pid, Callback cb) {
  int fd = PidfdOpen(pid);
  if (fd < 0) return ErrnoError("pidfd_open(" + std::to_string(pid) + ")", errno);
  auto* w = new ExitWatch();
  w->pidfd_ = fd;
  w->pid_ = pid;
  w->cb_ = std::move(cb);
  w->poll_.data = w;
  int rc = uv_poll_init(loop, &w->poll_, fd);
  if (rc != 0) {
    ::close(fd);
    delete w;
    return IoError(std::string("uv_poll_init on a pidfd: ") + uv_strerror(rc));
  }
  uv_poll_start(&w->poll_, UV_READABLE, &ExitWatch::OnReadable);
  return w;
}

void ExitWatch::OnReadable(uv_poll_t* h, int status, int events) {
  static_cast<ExitWatch*>(h->data)->Fire();
}

void ExitWatch::Fire() {
  if (fired_ || closing_) return;
  fired_ = true;
  uv_poll_stop(&poll_);
  ExitInfo info;
  info.pid = pid_;
  int st = 0;
  pid_t r = ::waitpid(pid_, &st, WNOHANG);
  if (r == pid_) {
    info.known = true;
    if (WIFEXITED(st)) info.exit_code = WEXITSTATUS(st);
    if (WIFSIGNALED(st)) info.signal = WTERMSIG(st);
  }
  if (cb_) cb_(info);
}

void ExitWatch::Close() {
  if (closing_) return;
  closing_ = true;
  uv_close(reinterpret_cast<uv_handle_t*>(&poll_), [](uv_handle_t* h) {
    auto* w = static_cast<ExitWatch*>(h->data);
    ::close(w->pidfd_);
    delete w;
  });
}

Result<Lifeline> Lifeline::Make() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return ErrnoError("pipe2 for an engine lifeline", errno);
  Lifeline l;
  l.read_end = UniqueFd(fds[0]);
  l.write_end = UniqueFd(fds[1]);
  return l;
}

Result<HangupWatch*> HangupWatch::Start(uv_loop_t* loop, UniqueFd fd, std::function<void()> cb) {
  auto* w = new HangupWatch();
  w->fd_ = std::move(fd);
  w->cb_ = std::move(cb);
  w->poll_.data = w;
  int rc = uv_poll_init(loop, &w->poll_, w->fd_.get());
  if (rc != 0) {
    delete w;
    return IoError(std::string("uv_poll_init on a lifeline: ") + uv_strerror(rc));
  }
  uv_poll_start(&w->poll_, UV_READABLE | UV_DISCONNECT, &HangupWatch::OnReadable);
  return w;
}

void HangupWatch::OnReadable(uv_poll_t* h, int status, int events) {
  auto* w = static_cast<HangupWatch*>(h->data);
  if (w->fired_ || w->closing_) return;
  if (status == 0 && !(events & UV_DISCONNECT)) {
    // Nobody writes to a lifeline; anything readable that is not EOF is drained.
    char buf[256];
    ssize_t n = ::read(w->fd_.get(), buf, sizeof buf);
    if (n > 0 || (n < 0 && (errno == EAGAIN || errno == EINTR))) return;
  }
  w->fired_ = true;
  uv_poll_stop(&w->poll_);
  if (w->cb_) w->cb_();
}

void HangupWatch::Close() {
  if (closing_) return;
  closing_ = true;
  uv_close(reinterpret_cast<uv_handle_t*>(&poll_), [](uv_handle_t* h) { delete static_cast<HangupWatch*>(h->data); });
}

// What the loop's watch and its waiting thread share. `async` is valid
// while `open`; the thread checks that under `mu` before it signals.
struct DeathWatch::Shared {
  std::unique_ptr<DeathWordWaiter> waiter;
  std::mutex mu;
  bool open = true;
  uv_async_t* async = nullptr;
};

Result<DeathWatch*> DeathWatch::Start(uv_loop_t* loop, int fd, std::function<void()> cb) {
  auto waiter = DeathWordWaiter::Open(fd);
  if (!waiter.ok()) return waiter.error();
  auto* w = new DeathWatch();
  w->cb_ = std::move(cb);
  w->shared_ = std::make_shared<Shared>();
  w->shared_->waiter.reset(*waiter);
  w->async_.data = w;
  int rc = uv_async_init(loop, &w->async_, [](uv_async_t* a) {
    auto* self = static_cast<DeathWatch*>(a->data);
    if (self->fired_ || self->closing_) return;
    self->fired_ = true;
    if (self->cb_) self->cb_();
  });
  if (rc != 0) {
    delete w;
    return IoError(std::string("uv_async_init for a death word: ") + uv_strerror(rc));
  }
  w->shared_->async = &w->async_;
  try {
    std::thread([s = w->shared_] {
      if (s->waiter->Wait() != DeathWordWaiter::Outcome::kDied) return;
      std::lock_guard<std::mutex> lock(s->mu);
      if (s->open) uv_async_send(s->async);
    }).detach();
  } catch (const std::system_error& e) {
    w->Close();
    return IoError(std::string("starting the thread that watches a death word: ") + e.what());
  }
  return w;
}

bool DeathWatch::armed() const { return shared_->waiter->armed_tid() != 0 || shared_->waiter->died(); }

void DeathWatch::Close() {
  if (closing_) return;
  closing_ = true;
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->open = false;
  }
  shared_->waiter->Stop();
  uv_close(reinterpret_cast<uv_handle_t*>(&async_), [](uv_handle_t* h) { delete static_cast<DeathWatch*>(h->data); });
}

Result<LineWatch*> LineWatch::Start(uv_loop_t* loop, UniqueFd fd, std::function<void(Result<std::string>)> cb) {
  auto* w = new LineWatch();
  w->cb_ = std::move(cb);
  w->pipe_.data = w;
  int rc = uv_pipe_init(loop, &w->pipe_, 0);
  if (rc == 0) rc = uv_pipe_open(&w->pipe_, fd.get());
  if (rc != 0) {
    delete w;
    return IoError(std::string("watching a readiness pipe: ") + uv_strerror(rc));
  }
  fd.Release();  // the pipe handle owns it now
  rc = uv_read_start(
      reinterpret_cast<uv_stream_t*>(&w->pipe_),
      [](uv_handle_t*, size_t, uv_buf_t* b) {
        static thread_local char buf[4096];
        *b = uv_buf_init(buf, sizeof buf);
      },
      &LineWatch::OnRead);
  if (rc != 0) {
    w->done_ = true;
    w->Close();
    return IoError(std::string("reading a readiness pipe: ") + uv_strerror(rc));
  }
  return w;
}

void LineWatch::OnRead(uv_stream_t* s, ssize_t n, const uv_buf_t* buf) {
  auto* w = static_cast<LineWatch*>(s->data);
  if (w->done_ || w->closing_) return;
  if (n > 0) {
    w->buf_.append(buf->base, static_cast<size_t>(n));
    auto nl = w->buf_.find('\n');
    if (nl != std::string::npos || w->buf_.size() >= 4096) {
      w->Finish(w->buf_.substr(0, std::min(nl, size_t{4096})));
    }
    return;
  }
  if (n < 0) {
    w->Finish(n == UV_EOF ? Unavailable("the pipe closed before a readiness line (the process exited or closed it)")
                          : IoError(std::string("reading a readiness pipe: ") + uv_strerror(static_cast<int>(n))));
  }
}

void LineWatch::Finish(Result<std::string> r) {
  done_ = true;
  uv_read_stop(reinterpret_cast<uv_stream_t*>(&pipe_));
  auto cb = std::move(cb_);
  Close();
  if (cb) cb(std::move(r));
}

void LineWatch::Close() {
  if (closing_) return;
  closing_ = true;
  uv_close(reinterpret_cast<uv_handle_t*>(&pipe_), [](uv_handle_t* h) { delete static_cast<LineWatch*>(h->data); });
}

Result<UniqueFd> TakeFdFrom(pid_t pid, int target_fd) {
  UniqueFd pidfd(PidfdOpen(pid));
  if (!pidfd.valid()) return ErrnoError("pidfd_open(" + std::to_string(pid) + ")", errno);
  int fd = static_cast<int>(::syscall(SYS_pidfd_getfd, pidfd.get(), target_fd, 0));
  if (fd < 0) {
    return ErrnoError("cannot take fd " + std::to_string(target_fd) + " of process " + std::to_string(pid) +
                          " (pidfd_getfd; run the supervisor as the same user with ptrace allowed, or under "
                          "systemd with its fd store)",
                      errno);
  }
  return UniqueFd(fd);
}

Status SignalGroup(pid_t pgid, int sig) {
  if (pgid <= 1) return InvalidArgument("refusing to signal process group " + std::to_string(pgid));
  if (::kill(-pgid, sig) != 0 && errno != ESRCH) {
    return ErrnoError("kill(-" + std::to_string(pgid) + ", " + std::to_string(sig) + ")", errno);
  }
  return Status::Ok();
}

bool ProcessAlive(pid_t pid) {
  if (pid <= 0) return false;
  auto st = ProcessStartTime(pid);  // a zombie still has /proc; check its state too
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(in, line)) return false;
  auto rp = line.rfind(')');
  if (rp == std::string::npos || rp + 2 >= line.size()) return false;
  char state = line[rp + 2];
  return st.ok() && state != 'Z' && state != 'X';
}

Result<uint64_t> ProcessStartTime(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(in, line)) return NotFound("process " + std::to_string(pid) + " does not exist");
  // The command name (field 2) may hold spaces and parentheses: fields after
  // the last ')' are plain.
  auto rp = line.rfind(')');
  if (rp == std::string::npos) return Corrupt("/proc/" + std::to_string(pid) + "/stat: unexpected format");
  std::istringstream rest(line.substr(rp + 2));
  std::string field;
  // rest starts at field 3 (state); start time is field 22.
  for (int i = 3; i <= 22; ++i) {
    if (!(rest >> field)) return Corrupt("/proc/" + std::to_string(pid) + "/stat: too few fields");
  }
  return std::stoull(field);
}

}  // namespace wsup

namespace wsup {

Result<char> ProcessRunState(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(in, line)) return NotFound("process " + std::to_string(pid) + " does not exist");
  auto rp = line.rfind(')');
  if (rp == std::string::npos || rp + 2 >= line.size())
    return Corrupt("/proc/" + std::to_string(pid) + "/stat: unexpected format");
  return line[rp + 2];
}

namespace {

// Inodes of the sockets in LISTEN state (st 0A) on `port`, from one of
// /proc/net/tcp or /proc/net/tcp6. Lines: "sl local_address rem_address st
// tx:rx tr:when retrnsmt uid timeout inode ...", addresses as HEX:PORTHEX.
void ListenInodes(const char* table, int port, std::vector<uint64_t>* out) {
  std::ifstream in(table);
  std::string line;
  std::getline(in, line);  // header
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string sl, local, remote, st, txrx, trwhen, retr, uid, timeout, inode;
    if (!(f >> sl >> local >> remote >> st >> txrx >> trwhen >> retr >> uid >> timeout >> inode)) continue;
    if (st != "0A") continue;
    auto colon = local.rfind(':');
    if (colon == std::string::npos) continue;
    int p = 0;
    try {
      p = std::stoi(local.substr(colon + 1), nullptr, 16);
    } catch (...) {
      continue;
    }
    if (p != port) continue;
    try {
      out->push_back(std::stoull(inode));
    } catch (...) {
    }
  }
}

std::vector<uint64_t> ListenInodes(int port) {
  std::vector<uint64_t> inodes;
  ListenInodes("/proc/net/tcp", port, &inodes);
  ListenInodes("/proc/net/tcp6", port, &inodes);
  return inodes;
}

// True when one of pid's fds is a socket with one of `inodes`.
bool HoldsSocket(pid_t pid, const std::vector<uint64_t>& inodes) {
  std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    char target[64];
    ssize_t n = ::readlink(e.path().c_str(), target, sizeof target - 1);
    if (n <= 0) continue;
    target[n] = 0;
    // "socket:[12345]"
    if (std::strncmp(target, "socket:[", 8) != 0) continue;
    uint64_t ino = std::strtoull(target + 8, nullptr, 10);
    if (std::find(inodes.begin(), inodes.end(), ino) != inodes.end()) return true;
  }
  return false;
}

// Every pid in /proc, with its process group (field 5 of stat).
std::vector<std::pair<pid_t, pid_t>> AllProcesses() {
  std::vector<std::pair<pid_t, pid_t>> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename().string();
    if (name.empty() || !std::isdigit(static_cast<unsigned char>(name[0]))) continue;
    pid_t pid = static_cast<pid_t>(std::atoi(name.c_str()));
    std::ifstream in("/proc/" + name + "/stat");
    std::string line;
    if (!std::getline(in, line)) continue;
    auto rp = line.rfind(')');
    if (rp == std::string::npos) continue;
    std::istringstream rest(line.substr(rp + 2));
    std::string state, ppid, pgrp;
    if (!(rest >> state >> ppid >> pgrp)) continue;
    out.emplace_back(pid, static_cast<pid_t>(std::atoi(pgrp.c_str())));
  }
  return out;
}

}  // namespace

Result<std::vector<pid_t>> ListeningPortOwners(int port) {
  if (port <= 0 || port > 65535) return InvalidArgument("port " + std::to_string(port) + " is not a TCP port");
  std::vector<uint64_t> inodes = ListenInodes(port);
  std::vector<pid_t> owners;
  if (inodes.empty()) return owners;
  for (const auto& [pid, pgrp] : AllProcesses()) {
    if (HoldsSocket(pid, inodes)) owners.push_back(pid);
  }
  return owners;
}

Result<bool> GroupListensOn(pid_t pgid, int port) {
  if (pgid <= 1) return InvalidArgument("process group " + std::to_string(pgid) + " is not one the supervisor started");
  std::vector<uint64_t> inodes = ListenInodes(port);
  if (inodes.empty()) return false;
  // The leader first: an engine normally listens in its own main process.
  if (HoldsSocket(pgid, inodes)) return true;
  for (const auto& [pid, pgrp] : AllProcesses()) {
    if (pgrp == pgid && pid != pgid && HoldsSocket(pid, inodes)) return true;
  }
  return false;
}

std::string DescribeProcess(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/comm");
  std::string comm;
  std::getline(in, comm);
  return "pid " + std::to_string(pid) + (comm.empty() ? "" : " (" + comm + ")");
}

}  // namespace wsup
