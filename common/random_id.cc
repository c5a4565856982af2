#include "common/random_id.h"

#include <sys/random.h>

#include <random>

namespace wsup {

std::string RandomHexId() {
  unsigned char b[16] = {};
  size_t got = 0;
  while (got < sizeof b) {
    ssize_t n = ::getrandom(b + got, sizeof b - got, 0);
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  // getrandom() does not fail on a Linux that runs wsup; should it, the
  // C++ library's own source fills the rest.
  if (got < sizeof b) {
    std::random_device rd;
    for (size_t i = got; i < sizeof b; ++i) b[i] = static_cast<unsigned char>(rd());
  }
  static const char* kHex = "0123456789abcdef";
  std::string s;
  s.reserve(32);
  for (unsigned char c : b) {
    s += kHex[c >> 4];
    s += kHex[c & 15];
  }
  return s;
}

}  // namespace wsup
