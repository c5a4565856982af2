#include "common/sha256.h"

#include <openssl/evp.h>

namespace wsup {
namespace {

std::string ToHex(const unsigned char* d, size_t n) {
  static const char* kDigits = "0123456789abcdef";
  std::string out(n * 2, '0');
  for (size_t i = 0; i < n; ++i) {
    out[2 * i] = kDigits[d[i] >> 4];
    out[2 * i + 1] = kDigits[d[i] & 15];
  }
  return out;
}

}  // namespace

std::string Sha256Hex(const void* data, size_t len) {
  Sha256 h;
  h.Update(data, len);
  return h.FinishHex();
}

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
  EVP_DigestInit_ex(static_cast<EVP_MD_CTX*>(ctx_), EVP_sha256(), nullptr);
}

Sha256::~Sha256() { EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(ctx_)); }

void Sha256::Update(const void* data, size_t len) {
  EVP_DigestUpdate(static_cast<EVP_MD_CTX*>(ctx_), data, len);
}

std::string Sha256::FinishHex() {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned n = 0;
  EVP_DigestFinal_ex(static_cast<EVP_MD_CTX*>(ctx_), md, &n);
  return ToHex(md, n);
}

}  // namespace wsup
