// How long the kernel and the CUDA driver take to tear down a SIGKILLed
// process, by what the process held on the GPU. The supervisor learns of
// an engine's death when its lifeline (an inherited pipe at fd 3) reads
// EOF, which the kernel does only after the process's memory is torn down;
// its exit (pidfd) comes after its files are closed. A node's KV pool made
// that moment later (docs/benchmarks.md, "The node's KV pool on the GPU"):
// this isolates which of the GPU memory an engine holds costs what.
//
// Each run starts this program again as a child (`--child MODE`) that
// inherits the lifeline at fd 3, takes MODE's memory, tells the parent it
// is ready and waits (or, with --busy, keeps the GPU writing). The parent
// SIGKILLs it and times, from the kill, the lifeline's EOF and the exit.
// Modes run interleaved (one run of each, then the next round), so drift
// in the machine touches all alike.
//
//   wsup-bench-teardown --device 0 --size-mib 2048 --runs 10
//       [--modes context,private,vmm,import,import_keep,scratch_import] [--busy] [--sibling]
//
// Modes (every one has the primary context of --device current):
//   context         nothing more;
//   private         cuMemAlloc of --size-mib, written;
//   vmm             cuMemCreate of --size-mib, mapped, access set, written; the handle released;
//   import          the parent's allocation of --size-mib (cuMemCreate, POSIX fd) imported from its fd,
//                   mapped, access set, written; the imported handle released and the fd closed;
//   import_keep     the same, keeping the imported handle and the fd open (as a pooled engine does);
//   scratch_import  a 64 MiB vmm of its own beside import (a pooled engine's scratch and pool).
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "common/unique_fd.h"
#include "gpu/cuda_driver.h"

namespace wsup {
namespace {

double NowMs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

[[noreturn]] void Die(const std::string& what, const Error& e) {
  std::fprintf(stderr, "wsup-bench-teardown: %s: %s\n", what.c_str(), e.message().c_str());
  std::exit(1);
}
template <typename T>
T Must(Result<T> r, const std::string& what) {
  if (!r.ok()) Die(what, r.error());
  return std::move(*r);
}
void Must(const Status& st, const std::string& what) {
  if (!st.ok()) Die(what, st.error());
}

// Maps `handle` at a fresh reservation of `size` bytes with access for
// `device`, and fills it.
cuda::DevicePtr MapAndWrite(cuda::MemHandle handle, uint64_t size, uint64_t gran, int device) {
  cuda::DevicePtr p = Must(cuda::VmmReserve(size, gran), "reserving address space");
  Must(cuda::VmmMap(p, size, handle), "mapping");
  Must(cuda::VmmSetAccess(p, size, device), "setting access");
  Must(cuda::MemsetD8(p, 1, size), "writing");
  return p;
}

// The child: takes MODE's memory, says "ready" on ready_fd, then waits to be
// killed. Never returns.
[[noreturn]] void Child(const std::string& mode, int device, uint64_t size, int ready_fd, int import_fd, bool busy) {
  Must(cuda::Init(), "cuda init");
  cuda::PrimaryContext ctx = Must(cuda::PrimaryContext::Retain(device), "retaining the primary context");
  Must(ctx.MakeCurrent(), "making the context current");
  const uint64_t gran = Must(cuda::VmmGranularity(device), "granularity");
  cuda::DevicePtr busy_ptr = 0;
  uint64_t busy_len = 0;
  if (mode == "private") {
    busy_ptr = Must(cuda::MemAlloc(size), "cuMemAlloc");
    busy_len = size;
    Must(cuda::MemsetD8(busy_ptr, 1, size), "writing");
  } else if (mode == "vmm") {
    cuda::MemHandle h = Must(cuda::VmmCreate(device, size), "cuMemCreate");
    busy_ptr = MapAndWrite(h, size, gran, device);
    busy_len = size;
    Must(cuda::VmmRelease(h), "releasing the handle");
  } else if (mode == "import" || mode == "import_keep" || mode == "scratch_import") {
    if (mode == "scratch_import") {
      cuda::MemHandle s = Must(cuda::VmmCreate(device, 64ull << 20), "cuMemCreate (scratch)");
      (void)MapAndWrite(s, 64ull << 20, gran, device);
      Must(cuda::VmmRelease(s), "releasing the scratch handle");
    }
    cuda::MemHandle h = Must(cuda::VmmImport(import_fd), "importing the parent's allocation");
    busy_ptr = MapAndWrite(h, size, gran, device);
    busy_len = size;
    if (mode != "import_keep") {
      Must(cuda::VmmRelease(h), "releasing the imported handle");
      ::close(import_fd);
    }
  } else if (mode == "hold") {
    // The sibling of --sibling: the allocation imported, not mapped, as a
    // standby holds the pool it prepared ahead of its grant.
    (void)Must(cuda::VmmImport(import_fd), "importing the parent's allocation");
  } else if (mode != "context") {
    std::fprintf(stderr, "wsup-bench-teardown: unknown mode '%s'\n", mode.c_str());
    std::exit(2);
  }
  Must(cuda::ContextSynchronize(), "synchronizing");
  if (::write(ready_fd, "r", 1) != 1) std::exit(1);
  ::close(ready_fd);
  if (busy && busy_len > 0) {
    // Work in flight at the kill, as an engine under load has.
    for (uint8_t v = 0;; ++v) Must(cuda::MemsetD8(busy_ptr, v, busy_len), "writing");
  }
  for (;;) ::pause();
}

struct Times {
  double eof_ms = -1, exit_ms = -1;
};

// One run: start a child in `mode`, kill it once ready, time what follows.
Times Run(const std::string& self, const std::string& mode, int device, uint64_t size, int import_fd, bool busy) {
  int life[2], ready[2];
  if (::pipe2(life, O_CLOEXEC) != 0 || ::pipe2(ready, O_CLOEXEC) != 0) {
    std::perror("pipe");
    std::exit(1);
  }
  pid_t pid = ::fork();
  if (pid == 0) {
    // fd 3: the lifeline, first of the child's own files, as an engine's.
    ::dup2(life[1], 3);
    ::dup2(ready[1], 4);
    int imp = -1;
    if (import_fd >= 0) {
      ::dup2(import_fd, 5);
      imp = 5;
    }
    std::vector<std::string> args = {self,  "--child", mode, "--device", std::to_string(device), "--size-mib",
                                      std::to_string(size >> 20), "--ready-fd", "4", "--import-fd",
                                      std::to_string(imp)};
    if (busy) args.push_back("--busy");
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(self.c_str(), argv.data());
    _exit(127);
  }
  ::close(life[1]);
  ::close(ready[1]);
  char c;
  if (::read(ready[0], &c, 1) != 1) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    std::fprintf(stderr, "wsup-bench-teardown: the %s child failed before it was ready (status %d)\n", mode.c_str(),
                 status);
    std::exit(1);
  }
  ::close(ready[0]);
  int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  // Idle a moment so that the child's setup is not in the measurement.
  ::usleep(200 * 1000);
  Times t;
  const double t0 = NowMs();
  ::kill(pid, SIGKILL);
  pollfd p[2] = {{life[0], POLLIN, 0}, {pidfd, POLLIN, 0}};
  while (t.eof_ms < 0 || t.exit_ms < 0) {
    if (::poll(p, 2, 10000) <= 0) break;
    const double now = NowMs() - t0;
    if (t.eof_ms < 0 && (p[0].revents & (POLLIN | POLLHUP))) {
      t.eof_ms = now;
      p[0].fd = -1;
    }
    if (t.exit_ms < 0 && (p[1].revents & POLLIN)) {
      t.exit_ms = now;
      p[1].fd = -1;
    }
  }
  ::close(life[0]);
  ::close(pidfd);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return t;
}

std::string Summary(std::vector<double> v) {
  if (v.empty()) return "-";
  std::sort(v.begin(), v.end());
  char buf[96];
  std::snprintf(buf, sizeof buf, "%.1f (%.1f..%.1f)", v[v.size() / 2], v.front(), v.back());
  return buf;
}

int Main(int argc, char** argv) {
  CLI::App app{"time a SIGKILLed process's teardown by the GPU memory it held"};
  int device = 0, runs = 10, ready_fd = -1, import_fd = -1;
  uint64_t size_mib = 2048;
  std::string modes = "context,private,vmm,import,import_keep,scratch_import", child;
  bool busy = false, sibling = false;
  app.add_option("--device", device, "CUDA device ordinal");
  app.add_flag("--sibling", sibling,
               "another process holds the shared allocation imported (unmapped) through every run, as a standby "
               "that prepared the pool does");
  app.add_option("--size-mib", size_mib, "MiB each mode holds")->check(CLI::Range(2, 1 << 20));
  app.add_option("--runs", runs, "kills per mode")->check(CLI::Range(1, 1000));
  app.add_option("--modes", modes, "comma-separated modes");
  app.add_flag("--busy", busy, "the child keeps the GPU writing its memory until the kill");
  app.add_option("--child", child)->group("");
  app.add_option("--ready-fd", ready_fd)->group("");
  app.add_option("--import-fd", import_fd)->group("");
  CLI11_PARSE(app, argc, argv);
  const uint64_t size = size_mib << 20;
  if (!child.empty()) Child(child, device, size, ready_fd, import_fd, busy);

  Must(cuda::Init(), "cuda init (is there a GPU and its driver?)");
  const uint64_t gran = Must(cuda::VmmGranularity(device), "granularity");
  if (size % gran != 0) {
    std::fprintf(stderr, "wsup-bench-teardown: --size-mib %llu is not a multiple of the device's granularity (%llu "
                 "bytes)\n", static_cast<unsigned long long>(size_mib), static_cast<unsigned long long>(gran));
    return 2;
  }
  // The allocation the import modes map, made here as a holder makes the pool.
  cuda::MemHandle pool = Must(cuda::VmmCreate(device, size), "making the shared allocation");
  UniqueFd pool_fd = Must(cuda::VmmExport(pool), "exporting it");
  const std::string self = "/proc/self/exe";
  std::vector<std::string> list;
  for (size_t at = 0; at <= modes.size();) {
    size_t end = modes.find(',', at);
    if (end == std::string::npos) end = modes.size();
    if (end > at) list.push_back(modes.substr(at, end - at));
    at = end + 1;
  }
  pid_t holder_pid = 0;
  if (sibling) {
    // Started as a run's child is, but never killed until the end.
    int ready[2];
    if (::pipe2(ready, O_CLOEXEC) != 0) return 1;
    holder_pid = ::fork();
    if (holder_pid == 0) {
      ::dup2(ready[1], 4);
      ::dup2(pool_fd.get(), 5);
      std::vector<std::string> args = {self, "--child", "hold", "--device", std::to_string(device), "--size-mib",
                                        std::to_string(size_mib), "--ready-fd", "4", "--import-fd", "5"};
      std::vector<char*> av;
      for (auto& a : args) av.push_back(a.data());
      av.push_back(nullptr);
      ::execv(self.c_str(), av.data());
      _exit(127);
    }
    ::close(ready[1]);
    char c;
    if (::read(ready[0], &c, 1) != 1) {
      std::fprintf(stderr, "wsup-bench-teardown: the sibling that holds the allocation failed to start\n");
      return 1;
    }
    ::close(ready[0]);
  }
  std::map<std::string, std::vector<double>> eof, exited;
  for (int r = 0; r < runs; ++r) {
    for (const auto& m : list) {
      const bool imports = m.find("import") != std::string::npos;
      Times t = Run(self, m, device, size, imports ? pool_fd.get() : -1, busy);
      if (t.eof_ms >= 0) eof[m].push_back(t.eof_ms);
      if (t.exit_ms >= 0) exited[m].push_back(t.exit_ms);
    }
  }
  if (holder_pid > 0) {
    ::kill(holder_pid, SIGKILL);
    ::waitpid(holder_pid, nullptr, 0);
  }
  std::printf("| mode (%llu MiB%s%s) | kill to lifeline EOF, ms: median (min..max) | kill to exit, ms | runs |\n",
              static_cast<unsigned long long>(size_mib), busy ? ", GPU busy at the kill" : "",
              sibling ? ", another process holding the shared allocation imported" : "");
  std::printf("|---|---:|---:|---:|\n");
  for (const auto& m : list) {
    std::printf("| %s | %s | %s | %zu |\n", m.c_str(), Summary(eof[m]).c_str(), Summary(exited[m]).c_str(),
                eof[m].size());
  }
  (void)cuda::VmmRelease(pool);
  return 0;
}

}  // namespace
}  // namespace wsup

int main(int argc, char** argv) { return wsup::Main(argc, argv); }
