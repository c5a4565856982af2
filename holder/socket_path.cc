// PrepareSocketPath (holder/server.h): the holder socket's directory and a
// stale socket file, checked before the server binds.
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "common/fs.h"
#include "holder/server.h"

namespace wsup {

namespace {

std::string Octal(unsigned mode) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0%03o", mode & 07777);
  return buf;
}

}  // namespace

Status PrepareSocketPath(const std::string& socket_path) {
  if (socket_path.empty()) {
    return InvalidArgument("no socket path given; pass --socket PATH in a private directory (mode 0700)");
  }
  if (socket_path.size() > MaxSocketPathLength()) {
    return InvalidArgument(socket_path + ": socket path is " + std::to_string(socket_path.size()) +
                           " bytes, longer than the " + std::to_string(MaxSocketPathLength()) +
                           " a Unix socket allows; choose a shorter --socket path");
  }
  std::string dir = DirName(socket_path);
  struct stat st{};
  if (::stat(dir.c_str(), &st) != 0) {
    if (errno != ENOENT) return ErrnoError(dir + ": cannot inspect the socket directory", errno);
    WSUP_RETURN_IF_ERROR(MakeDirs(dir, 0700));
    // The umask may have trimmed the mode; it must be exactly private.
    if (::chmod(dir.c_str(), 0700) != 0) return ErrnoError(dir + ": cannot set mode 0700", errno);
    spdlog::info("created socket directory {} (mode 0700)", dir);
    if (::stat(dir.c_str(), &st) != 0) return ErrnoError(dir + ": cannot inspect the socket directory", errno);
  }
  if (!S_ISDIR(st.st_mode)) {
    return InvalidArgument(dir + ": the socket's directory is not a directory; choose another --socket");
  }
  if (st.st_uid != ::geteuid()) {
    return Refused(dir + ": the socket directory belongs to uid " + std::to_string(st.st_uid) +
                   ", not to uid " + std::to_string(::geteuid()) +
                   " that runs this holder; use a directory of your own (mode 0700) for --socket");
  }
  if (st.st_mode & S_IRWXO) {
    return Refused(dir + ": the socket directory has mode " + Octal(st.st_mode) +
                   ", so every user on the host could reach the holder socket; run 'chmod 700 " + dir +
                   "' or choose --socket in a private directory");
  }
  if (st.st_mode & S_IRWXG) {
    spdlog::warn("{}: the socket directory is group-accessible (mode {}); connections from other uids "
                 "are still refused, but 'chmod 700 {}' is safer",
                 dir, Octal(st.st_mode), dir);
  }
  if (::lstat(socket_path.c_str(), &st) != 0) {
    if (errno == ENOENT) return Status::Ok();
    return ErrnoError(socket_path + ": cannot inspect", errno);
  }
  if (!S_ISSOCK(st.st_mode)) {
    return InvalidArgument(socket_path + ": exists and is not a socket; remove it or choose another --socket");
  }
  // A socket file is left behind when a holder dies; one that nobody
  // accepts on is stale. One that accepts belongs to a live holder.
  UniqueFd probe(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!probe.valid()) return ErrnoError(socket_path + ": cannot create a socket", errno);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, socket_path.data(), socket_path.size());
  if (::connect(probe.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 || errno == EAGAIN) {
    return Refused(socket_path + ": another holder is serving on this socket; stop it first, or give this "
                   "holder another --socket");
  }
  if (errno != ECONNREFUSED) return ErrnoError(socket_path + ": cannot probe the existing socket", errno);
  if (::unlink(socket_path.c_str()) != 0 && errno != ENOENT) {
    return ErrnoError(socket_path + ": cannot remove the stale socket", errno);
  }
  spdlog::info("removed stale socket {} (no process was listening on it)", socket_path);
  return Status::Ok();
}

}  // namespace wsup
