// Child processes of the supervisor: spawning, watching for exit, signalling.
//
// Every supervised program (holder, engines, front) is started in its own
// session and process group, so that
//   - a signal to the group reaches an engine's helpers too (a hung engine is
//     killed whole), and
//   - the supervisor's own death (or a restart of its systemd unit with
//     KillMode=process) leaves them running, to be re-adopted.
//
// Exit is watched through a pidfd on the loop (pidfd_open, Linux >= 5.3), the
// same way for children we spawned and for processes a restarted supervisor
// adopts (which are not its children and cannot be waited for). For our own
// children the watcher also reaps them and reports the exit status.
//
// Ownership: an ExitWatch owns its uv_poll_t and pidfd; Close() starts
// uv_close and the memory is freed in the close callback. Loop thread only.
#pragma once

#include <sys/types.h>
#include <uv.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "common/unique_fd.h"

namespace wsup {

struct ChildSpec {
  std::vector<std::string> argv;                             // argv[0]: a path or a name on PATH
  std::vector<std::pair<std::string, std::string>> env_set;  // added to the supervisor's environment
  std::string log_path;         // stdout+stderr appended here; empty: inherit
  std::vector<int> pass_fds;    // become fds 3, 4, ... in the child, in order
  std::string cwd;              // empty: inherit
};

// Starts the child in a new session (setsid). Returns its pid, which is also
// its process group id. Fails with an Error naming argv[0] and the cause.
Result<pid_t> SpawnChild(const ChildSpec& spec);

struct ExitInfo {
  pid_t pid = -1;
  bool known = false;   // false for adopted processes: no status is available
  int exit_code = -1;   // when exited normally
  int signal = 0;       // when killed by a signal
  std::string Describe() const;  // "exit 3", "killed by SIGKILL", "exited (status unknown)"
};

// A watch on a process that someone may stop early (Close(): the callback
// does not run, and the watch frees itself).
class ProcessWatch {
 public:
  virtual ~ProcessWatch() = default;
  virtual void Close() = 0;
};

class ExitWatch final : public ProcessWatch {
 public:
  using Callback = std::function<void(const ExitInfo&)>;

  // Watches pid; cb runs once on the loop thread when it exits. If the
  // process is already gone, cb runs on the next loop iteration.
  static Result<ExitWatch*> Start(uv_loop_t* loop, pid_t pid, Callback cb);

  // Stops watching (cb will not run) and frees this object after uv_close.
  void Close() override;
  pid_t pid() const { return pid_; }

 private:
  ExitWatch() = default;
  static void OnReadable(uv_poll_t* h, int status, int events);
  void Fire();

  uv_poll_t poll_{};
  int pidfd_ = -1;
  pid_t pid_ = -1;
  Callback cb_;
  bool fired_ = false;
  bool closing_ = false;
};

// A lifeline: a pipe whose write end a child inherits and never uses. The
// kernel closes a dying process's files right after freeing its memory and
// before it becomes a zombie, so the read end's EOF shows a crash earlier
// than the pidfd does: for a killed CUDA engine about 43 ms after the kill
// instead of 88 ms (bench/engine_exit.py). The write end should be a low fd
// in the child (opened before its GPU files), as files close in fd order.
// A child that forks keeps the line open through its children; one that
// closes inherited fds at startup makes it useless (not wrong: the caller
// ignores an EOF that comes before the child was ready).
struct Lifeline {
  UniqueFd read_end;
  UniqueFd write_end;
  static Result<Lifeline> Make();
};

// Runs cb once on the loop thread when fd reaches EOF (every writer closed)
// or fails. Owns its uv_poll_t and the fd; Close() frees it after uv_close.
class HangupWatch {
 public:
  static Result<HangupWatch*> Start(uv_loop_t* loop, UniqueFd fd, std::function<void()> cb);
  void Close();

 private:
  HangupWatch() = default;
  static void OnReadable(uv_poll_t* h, int status, int events);
  uv_poll_t poll_{};
  UniqueFd fd_;
  std::function<void()> cb_;
  bool fired_ = false;
  bool closing_ = false;
};

// Runs cb once on the loop thread when the engine that armed a death word
// (wire/death_word.h) dies: at its SIGKILL, before the kernel tears it down
// and long before its lifeline reads EOF. A thread of its own sleeps on the
// word (a futex has no fd a loop could poll); it hands the death to the loop
// through the watch's uv_async_t. An engine that never arms the word never
// fires it. Owns the uv_async_t; Close() stops the thread (cb does not run)
// and frees the watch after uv_close, without waiting for the thread, which
// ends within 200 ms and frees what it shares.
class DeathWatch {
 public:
  // `fd` is the supervisor's copy of the page given to the engine.
  static Result<DeathWatch*> Start(uv_loop_t* loop, int fd, std::function<void()> cb);
  void Close();
  // Whether the engine has armed its word (it may still, while it starts).
  bool armed() const;

 private:
  struct Shared;
  DeathWatch() = default;
  uv_async_t async_{};
  std::shared_ptr<Shared> shared_;
  std::function<void()> cb_;
  bool fired_ = false;
  bool closing_ = false;
};

// Reads one line from a pipe a child writes its readiness to (a holder's
// --ready-fd, an engine's {ready_fd}); cb runs once on the loop thread with
// the line (without the newline), or with an error when the pipe reached EOF
// (or failed) before a whole line. Lines longer than 4 KiB are cut there.
// Owns its uv_pipe_t and the fd; Close() stops it (cb does not run) and frees
// it after uv_close.
class LineWatch {
 public:
  static Result<LineWatch*> Start(uv_loop_t* loop, UniqueFd fd, std::function<void(Result<std::string>)> cb);
  void Close();

 private:
  LineWatch() = default;
  static void OnRead(uv_stream_t* s, ssize_t n, const uv_buf_t* buf);
  void Finish(Result<std::string> r);
  uv_pipe_t pipe_{};
  std::string buf_;
  std::function<void(Result<std::string>)> cb_;
  bool done_ = false;
  bool closing_ = false;
};

// Signals a whole process group (the pid of a session leader we spawned).
Status SignalGroup(pid_t pgid, int sig);

// A duplicate of another process's fd `target_fd` (pidfd_getfd, Linux >= 5.6;
// needs the right to ptrace it: same user without Yama restrictions, or
// CAP_SYS_PTRACE). A restarted supervisor takes the front's listening socket
// back this way when no service manager kept it.
Result<UniqueFd> TakeFdFrom(pid_t pid, int target_fd);

// True while a process with this pid exists (and is not a zombie of ours).
bool ProcessAlive(pid_t pid);

// The process's scheduler state, field 3 of /proc/PID/stat: 'R' running,
// 'S' sleeping, 'D' in uninterruptible I/O, 'T' stopped (SIGSTOP), 't'
// stopped by a tracer, 'Z' zombie, ... NotFound when there is no such process.
Result<char> ProcessRunState(pid_t pid);

// The processes that hold a LISTENING TCP socket on `port` (any local
// address, IPv4 or IPv6): the sockets are looked up in /proc/net/tcp{,6} by
// port and state, then found among the fds of each process in /proc. Only
// processes this user may inspect are seen. Used to prove that what answers
// on an engine's port is the engine the supervisor started, and to name
// whoever holds a port another node wants.
Result<std::vector<pid_t>> ListeningPortOwners(int port);

// True when a process of process group `pgid` holds a listening socket on
// `port`. Cheaper than ListeningPortOwners: only that group's processes are
// searched.
Result<bool> GroupListensOn(pid_t pgid, int port);

// A short description of a process for messages: "pid 123 (wsup-engine)".
std::string DescribeProcess(pid_t pid);

// The process's start time in clock ticks since boot (field 22 of
// /proc/PID/stat). With the pid it identifies a process across pid reuse,
// which re-adoption relies on.
Result<uint64_t> ProcessStartTime(pid_t pid);

}  // namespace wsup
