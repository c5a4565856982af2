#include "common/unique_fd.h"

#include <fcntl.h>

#include <cerrno>

namespace wsup {

Result<UniqueFd> UniqueFd::Dup() const {
  int nfd = ::fcntl(fd_, F_DUPFD_CLOEXEC, 3);
  if (nfd < 0) return ErrnoError("dup of fd " + std::to_string(fd_), errno);
  return UniqueFd(nfd);
}

}  // namespace wsup
