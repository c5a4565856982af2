// The death word: how an engine lets the supervisor see its death at the
// moment of the kill, not after the kernel has torn it down.
//
// Why: the lifeline (an inherited pipe, supervisor/process.h) reads EOF only
// once the kernel has freed the dying process's memory and reached its
// files. For a CUDA engine that is 20 to 45 ms after a SIGKILL, and more with
// GPU work in flight; for a CPU engine with 2 GiB of ordinary pages, about
// 100 ms (bench/engine_exit.py, bench/teardown.sh). The kernel does one thing
// much earlier: as each thread exits, before the memory goes, it walks the
// thread's robust futex list and marks every futex word the thread owned
// with FUTEX_OWNER_DIED, waking its waiters. So:
//
//   - the supervisor makes a one-page memfd (MakeDeathWord) and passes it to
//     the engine, whose environment names its fd (WSUP_DEATH_FD);
//   - the engine (ArmDeathWord) starts one thread that does nothing but own
//     the word: it writes its tid there, registers the word as its only
//     robust futex, blocks every signal and sleeps for ever;
//   - the supervisor's watcher (DeathWordWaiter, run on a thread of its own)
//     sleeps on the word and wakes when the kernel marks it.
//
// The thread exits only when the whole process does (killed, crashed,
// exit(), or execve() by another thread), so a marked word means the engine
// is gone, even though its GPU work may still be running: it says when to
// move the traffic, not when to hand the engine's memory on (that still
// waits for the exit, supervisor/kv_handover.h).
//
// The page (native byte order, every field 4-byte aligned):
//   offset 0  uint32 magic    0x57534457 ("WSDW")
//   offset 4  uint32 version  1
//   offset 8  uint32 word     0 until armed; then the owning thread's tid,
//                             with FUTEX_WAITERS (bit 31) while watched and
//                             FUTEX_OWNER_DIED (bit 30) once it died
//   offset 12 uint32 pid      the engine's pid, written when it arms
// Any engine may implement it (docs/architecture.md, "Seeing a death").
// One that does not leaves the word 0 and is seen through its lifeline.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "common/status.h"
#include "common/unique_fd.h"

namespace wsup {

inline constexpr char kDeathFdEnv[] = "WSUP_DEATH_FD";
inline constexpr uint32_t kDeathWordMagic = 0x57534457;
inline constexpr uint32_t kDeathWordVersion = 1;
inline constexpr size_t kDeathWordBytes = 4096;

struct DeathWordPage {
  uint32_t magic;
  uint32_t version;
  uint32_t word;
  uint32_t pid;
};

// The supervisor's side: a fresh page (memfd, close-on-exec, sealed at one
// page) with its header written and the word 0.
Result<UniqueFd> MakeDeathWord();

// The engine's side: arms the page on `fd` (which stays the caller's; the
// mapping is kept for the life of the process). Returns once the owning
// thread has written its tid. Idempotent within a process: a second call
// for the same page is a no-op, for another page an error.
Status ArmDeathWord(int fd);

// Arms the page named by WSUP_DEATH_FD. Ok(false) when the variable is
// unset (a supervisor without death words, or no supervisor); an error
// names the variable and what is wrong with it.
Result<bool> ArmDeathWordFromEnv();

// Blocks on a mapped page until its owner dies or Stop() is called.
// Thread-safe: Wait() on one thread, Stop() from any.
class DeathWordWaiter {
 public:
  enum class Outcome { kDied, kStopped };
  // Maps the page of `fd` (dup'ed, so the caller keeps its fd).
  static Result<DeathWordWaiter*> Open(int fd);
  ~DeathWordWaiter();
  DeathWordWaiter(const DeathWordWaiter&) = delete;
  DeathWordWaiter& operator=(const DeathWordWaiter&) = delete;

  Outcome Wait();
  void Stop();
  // The owner's tid once armed, else 0.
  uint32_t armed_tid() const;
  bool died() const;

 private:
  DeathWordWaiter() = default;
  DeathWordPage* page_ = nullptr;
  std::atomic<bool> stop_{false};
};

}  // namespace wsup
