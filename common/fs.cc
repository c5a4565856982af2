#include "common/fs.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "common/unique_fd.h"

namespace wsup {

Result<std::string> ReadFile(const std::string& path, size_t max_bytes) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return ErrnoError(path + ": cannot open", errno);
  struct stat st{};
  if (::fstat(fd.get(), &st) != 0) return ErrnoError(path + ": cannot stat", errno);
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    return InvalidArgument(path + ": file is " + std::to_string(st.st_size) +
                           " bytes, more than the " + std::to_string(max_bytes) +
                           " allowed here; check that the path names the right file");
  }
  std::string out;
  out.resize(static_cast<size_t>(st.st_size));
  size_t done = 0;
  while (done < out.size()) {
    ssize_t n = ::read(fd.get(), out.data() + done, out.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(path + ": read failed", errno);
    }
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  out.resize(done);
  return out;
}

Status WriteFileAtomic(const std::string& path, const std::string& contents, int mode) {
  std::string tmp = path + ".tmp." + std::to_string(::getpid());
  UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode));
  if (!fd.valid()) return ErrnoError(tmp + ": cannot create", errno);
  size_t done = 0;
  while (done < contents.size()) {
    ssize_t n = ::write(fd.get(), contents.data() + done, contents.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      int e = errno;
      ::unlink(tmp.c_str());
      return ErrnoError(tmp + ": write failed", e);
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd.get()) != 0) {
    int e = errno;
    ::unlink(tmp.c_str());
    return ErrnoError(tmp + ": fsync failed", e);
  }
  fd.Reset();
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int e = errno;
    ::unlink(tmp.c_str());
    return ErrnoError("rename " + tmp + " -> " + path, e);
  }
  return Status::Ok();
}

Status MakeDirs(const std::string& dir, int mode) {
  if (dir.empty()) return Status::Ok();
  std::string cur;
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = dir.find('/', pos + 1);
    cur = dir.substr(0, pos);
    if (cur.empty()) continue;
    if (::mkdir(cur.c_str(), static_cast<mode_t>(mode)) != 0 && errno != EEXIST) {
      return ErrnoError(cur + ": cannot create directory", errno);
    }
  }
  struct stat st{};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return InvalidArgument(dir + ": exists but is not a directory; remove it or choose another path");
  }
  return Status::Ok();
}

Result<bool> MakePrivateDir(const std::string& dir, const std::string& what) {
  WSUP_RETURN_IF_ERROR(MakeDirs(dir, 0700));
  struct stat st{};
  if (::stat(dir.c_str(), &st) != 0) return ErrnoError(what + " " + dir + ": cannot stat", errno);
  if ((st.st_mode & 077) == 0) return false;
  char mode[8];
  std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
  const std::string me = std::to_string(::geteuid());
  if (st.st_uid != ::geteuid()) {
    return InvalidArgument(what + " " + dir + ": is mode " + mode + " and owned by uid " + std::to_string(st.st_uid) +
                           ", not by this user (uid " + me + "): other local users may read what wsup keeps there "
                           "(the ledger, the logs), and wsup does not change a folder it does not own; make it "
                           "private (chown " + me + " " + dir + " && chmod 0700 " + dir + ") or choose a folder of "
                           "this user");
  }
  if (::chmod(dir.c_str(), st.st_mode & 07700) != 0) {
    return IoError(what + " " + dir + ": is mode " + std::string(mode) + " and cannot be made private (chmod 0700: " +
                   std::strerror(errno) + "); run chmod 0700 " + dir + " as its owner");
  }
  return true;
}

std::string DirName(const std::string& path) {
  auto pos = path.find_last_of('/');
  if (pos == std::string::npos) return ".";
  if (pos == 0) return "/";
  return path.substr(0, pos);
}

std::string BaseName(const std::string& path) {
  auto pos = path.find_last_of('/');
  return pos == std::string::npos ? path : path.substr(pos + 1);
}

std::string JoinPath(const std::string& lhs, const std::string& rhs) {
  if (rhs.empty()) return lhs;
  if (rhs[0] == '/' || lhs.empty()) return rhs;
  if (lhs.back() == '/') return lhs + rhs;
  return lhs + "/" + rhs;
}

}  // namespace wsup
