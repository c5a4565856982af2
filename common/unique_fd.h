// UniqueFd: sole owner of one file descriptor; closes it on destruction.
//
// Arena fds are the most precious thing wsup holds (an open fd keeps GPU
// memory alive), so ownership is always explicit: move it, Release() it into
// a message, or Dup() it to keep a copy.
#pragma once

#include <unistd.h>

#include <utility>

#include "common/status.h"

namespace wsup {

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { Reset(); }
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.Release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) Reset(o.Release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int Release() { return std::exchange(fd_, -1); }
  void Reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }
  // A new descriptor for the same open file (close-on-exec set).
  Result<UniqueFd> Dup() const;

 private:
  int fd_ = -1;
};

}  // namespace wsup
