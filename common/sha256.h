// SHA-256 helpers (libcrypto), hex-encoded lower case.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace wsup {

std::string Sha256Hex(const void* data, size_t len);
inline std::string Sha256Hex(std::string_view s) { return Sha256Hex(s.data(), s.size()); }

// Incremental hashing for data that arrives in pieces.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void Update(const void* data, size_t len);
  std::string FinishHex();

 private:
  void* ctx_;
};

}  // namespace wsup
