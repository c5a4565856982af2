#include "engine/tokenizer.h"

#include "text/utf8.h"

namespace wsup::engine {

std::vector<int32_t> EncodeBytes(std::string_view text) {
  std::vector<int32_t> out;
  out.reserve(text.size());
  for (unsigned char c : text) out.push_back(c);
  return out;
}

void AppendTokenText(int32_t token, std::string* out) {
  auto cp = static_cast<uint32_t>(token);
  if (token < 0 || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) cp = 0xfffd;
  text::AppendUtf8(cp, out);
}

std::string DecodeTokens(const std::vector<int32_t>& tokens) {
  std::string out;
  for (int32_t t : tokens) AppendTokenText(t, &out);
  return out;
}

}  // namespace wsup::engine
