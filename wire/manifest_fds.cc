#include "wire/manifest_fds.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace wsup {
namespace {

std::string AllocName(size_t i) { return "arena allocation " + std::to_string(i); }

}  // namespace

Status CheckAllocationFds(const Manifest& m, const std::vector<UniqueFd>& fds, std::string_view fix) {
  if (fds.size() != m.allocations.size()) {
    return InvalidArgument("arena: got " + std::to_string(fds.size()) + " fds for " +
                           std::to_string(m.allocations.size()) + " allocations in the manifest: " +
                           std::string(fix));
  }
  for (size_t i = 0; i < fds.size(); ++i) {
    if (!fds[i].valid()) return InvalidArgument(AllocName(i) + ": no fd was passed for it: " + std::string(fix));
  }
  return {};
}

Status CheckSealedMemfd(size_t alloc, int fd, uint64_t size, MemfdSize rule, std::string_view fix) {
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0) {
    return Refused(AllocName(alloc) + ": fd " + std::to_string(fd) + " is not a memfd sealed read-only (F_GET_SEALS: " +
                   std::strerror(errno) + "); host arenas are memfds a wsup holder made and sealed: " +
                   std::string(fix));
  }
  if ((seals & (F_SEAL_WRITE | F_SEAL_SHRINK)) != (F_SEAL_WRITE | F_SEAL_SHRINK)) {
    return Refused(AllocName(alloc) +
                   ": the fd is not a memfd sealed read-only (it is not sealed against writes and shrinking), so its bytes "
                   "could change or vanish under a reader: " +
                   std::string(fix));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) return ErrnoError(AllocName(alloc) + ": fstat of its fd", errno);
  const auto held = static_cast<uint64_t>(st.st_size);
  if (rule == MemfdSize::kExact ? held != size : held < size) {
    return Mismatch(AllocName(alloc) + ": the memfd holds " + std::to_string(held) + " bytes but the manifest says " +
                    std::to_string(size) + ": the fds and the manifest belong to different arenas; " +
                    std::string(fix));
  }
  return {};
}

}  // namespace wsup
