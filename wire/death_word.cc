#include "wire/death_word.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

namespace wsup {
namespace {

std::atomic_ref<uint32_t> Word(DeathWordPage* p) { return std::atomic_ref<uint32_t>(p->word); }

long Futex(uint32_t* addr, int op, uint32_t val, const timespec* timeout) {
  // Not FUTEX_PRIVATE_FLAG: the word is shared with another process, and
  // the kernel's wake at a thread's death is a shared one.
  return ::syscall(SYS_futex, addr, op, val, timeout, nullptr, 0);
}

// Maps one page of `fd` and checks its header. `what` names the fd in errors.
Result<DeathWordPage*> MapPage(int fd, const std::string& what) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoError(what + " cannot be read", errno);
  if (st.st_size < static_cast<off_t>(kDeathWordBytes)) {
    return InvalidArgument(what + " is " + std::to_string(st.st_size) + " bytes, not a death word page of " +
                           std::to_string(kDeathWordBytes));
  }
  void* p = ::mmap(nullptr, kDeathWordBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return ErrnoError(what + " cannot be mapped shared for writing", errno);
  auto* page = static_cast<DeathWordPage*>(p);
  if (page->magic != kDeathWordMagic || page->version != kDeathWordVersion) {
    char buf[96];
    std::snprintf(buf, sizeof buf, " has magic 0x%08x version %u, not a death word (0x%08x version %u)",
                  page->magic, page->version, kDeathWordMagic, kDeathWordVersion);
    ::munmap(p, kDeathWordBytes);
    return InvalidArgument(what + buf);
  }
  return page;
}

// The engine's side, one per process: the page and the robust list that
// names its word, both for the life of the process.
struct Armed {
  std::mutex mu;
  dev_t dev = 0;
  ino_t ino = 0;
  DeathWordPage* page = nullptr;
  robust_list_head head{};
  robust_list entry{};
};
Armed& TheArmed() {
  static Armed* a = new Armed();  // never destroyed: its thread outlives main()
  return *a;
}

void OwnForEver(Armed* a, std::atomic<int>* result) {
  sigset_t all;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, nullptr);
  // This thread's robust list is the word and nothing else. (glibc had
  // registered its own, for robust mutexes; this thread takes none.)
  a->entry.next = &a->head.list;
  a->head.list.next = &a->entry;
  a->head.futex_offset = reinterpret_cast<char*>(&a->page->word) - reinterpret_cast<char*>(&a->entry);
  a->head.list_op_pending = nullptr;
  if (::syscall(SYS_set_robust_list, &a->head, sizeof a->head) != 0) {
    result->store(errno);
    Futex(reinterpret_cast<uint32_t*>(result), FUTEX_WAKE_PRIVATE, 1, nullptr);
    return;
  }
  const auto tid = static_cast<uint32_t>(::syscall(SYS_gettid));
  a->page->pid = static_cast<uint32_t>(::getpid());
  uint32_t expected = 0;
  if (!Word(a->page).compare_exchange_strong(expected, tid)) {
    result->store(EBUSY);
    Futex(reinterpret_cast<uint32_t*>(result), FUTEX_WAKE_PRIVATE, 1, nullptr);
    return;
  }
  // A watcher that started before the engine armed sleeps on 0.
  Futex(&a->page->word, FUTEX_WAKE, INT_MAX, nullptr);
  result->store(1);
  Futex(reinterpret_cast<uint32_t*>(result), FUTEX_WAKE_PRIVATE, 1, nullptr);
  for (;;) ::pause();
}

}  // namespace

Result<UniqueFd> MakeDeathWord() {
  int fd = ::memfd_create("wsup-death-word", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return ErrnoError("memfd_create for an engine's death word", errno);
  UniqueFd f(fd);
  if (::ftruncate(fd, kDeathWordBytes) != 0) return ErrnoError("sizing an engine's death word", errno);
  // The engine may write the page, never resize it.
  (void)::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
  DeathWordPage h{kDeathWordMagic, kDeathWordVersion, 0, 0};
  if (::pwrite(fd, &h, sizeof h, 0) != static_cast<ssize_t>(sizeof h)) {
    return ErrnoError("writing an engine's death word", errno);
  }
  return f;
}

Status ArmDeathWord(int fd) {
  const std::string what = "the death word on fd " + std::to_string(fd);
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoError(what + " cannot be read", errno);
  Armed& a = TheArmed();
  std::lock_guard<std::mutex> lock(a.mu);
  if (a.page) {
    if (a.dev == st.st_dev && a.ino == st.st_ino) return Status::Ok();
    return Refused(what + ": this process already armed another death word; a process has one");
  }
  auto page = MapPage(fd, what);
  if (!page.ok()) return page.error();
  if (const uint32_t w = Word(*page).load(); w != 0) {
    ::munmap(*page, kDeathWordBytes);
    char word[16];
    std::snprintf(word, sizeof word, "0x%08x", w);
    return Refused(what + " is already armed (word " + word +
                   "); each engine start gets a fresh one from its supervisor");
  }
  a.page = *page;
  a.dev = st.st_dev;
  a.ino = st.st_ino;
  std::atomic<int> result{0};
  std::thread(OwnForEver, &a, &result).detach();
  while (result.load() == 0) Futex(reinterpret_cast<uint32_t*>(&result), FUTEX_WAIT_PRIVATE, 0, nullptr);
  const int r = result.load();
  if (r != 1) {
    ::munmap(a.page, kDeathWordBytes);
    a.page = nullptr;
    return r == EBUSY ? Refused(what + " was armed by another process at the same time")
                      : ErrnoError(what + ": set_robust_list", r);
  }
  return Status::Ok();
}

Result<bool> ArmDeathWordFromEnv() {
  const char* v = std::getenv(kDeathFdEnv);
  if (!v) return false;
  char* end = nullptr;
  errno = 0;
  long fd = std::strtol(v, &end, 10);
  if (*v == '\0' || *end != '\0' || errno != 0 || fd < 0 || fd > INT_MAX) {
    return InvalidArgument(std::string(kDeathFdEnv) + "='" + std::string(v).substr(0, 32) +
                           "' is not a file descriptor number; unset it, or let the supervisor set it");
  }
  if (::fcntl(static_cast<int>(fd), F_GETFD) < 0) {
    return InvalidArgument(std::string(kDeathFdEnv) + "=" + v +
                           " names no open file in this process; unset it, or start the engine from the "
                           "supervisor that passes it");
  }
  Status st = ArmDeathWord(static_cast<int>(fd));
  if (!st.ok()) return st.error().With(std::string(kDeathFdEnv) + "=" + v);
  return true;
}

Result<DeathWordWaiter*> DeathWordWaiter::Open(int fd) {
  auto page = MapPage(fd, "an engine's death word");
  if (!page.ok()) return page.error();
  auto* w = new DeathWordWaiter();
  w->page_ = *page;
  return w;
}

DeathWordWaiter::~DeathWordWaiter() {
  if (page_) ::munmap(page_, kDeathWordBytes);
}

uint32_t DeathWordWaiter::armed_tid() const { return Word(page_).load() & FUTEX_TID_MASK; }

bool DeathWordWaiter::died() const { return (Word(page_).load() & FUTEX_OWNER_DIED) != 0; }

DeathWordWaiter::Outcome DeathWordWaiter::Wait() {
  auto word = Word(page_);
  for (;;) {
    uint32_t v = word.load();
    if (v & FUTEX_OWNER_DIED) return Outcome::kDied;
    if (stop_.load()) return Outcome::kStopped;
    if ((v & FUTEX_TID_MASK) != 0 && !(v & FUTEX_WAITERS)) {
      // The kernel wakes a dead owner's waiters only when this bit says
      // there are some; it keeps the bit when it marks the word.
      if (!word.compare_exchange_strong(v, v | FUTEX_WAITERS)) continue;
      v |= FUTEX_WAITERS;
    }
    // Bounded, so that a Stop() that lands between the check above and the
    // sleep is seen at the latest this much later.
    timespec bound{0, 200 * 1000 * 1000};
    Futex(&page_->word, FUTEX_WAIT, v, &bound);
  }
}

void DeathWordWaiter::Stop() {
  stop_.store(true);
  Futex(&page_->word, FUTEX_WAKE, INT_MAX, nullptr);
}

}  // namespace wsup
