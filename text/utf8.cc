#include "text/utf8.h"

namespace wsup::text {

namespace {

// Unicode 15, table 3-7: the well-formed byte sequences. For a lead byte,
// the range its first continuation byte must fall in.
bool SecondInRange(unsigned char lead, unsigned char b) {
  switch (lead) {
    case 0xE0:
      return b >= 0xA0 && b <= 0xBF;
    case 0xED:
      return b >= 0x80 && b <= 0x9F;
    case 0xF0:
      return b >= 0x90 && b <= 0xBF;
    case 0xF4:
      return b >= 0x80 && b <= 0x8F;
    default:
      return b >= 0x80 && b <= 0xBF;
  }
}

// The sequence length a lead byte announces; 0 for a byte that leads none.
size_t LeadLength(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;
}

bool Continuation(unsigned char b) { return b >= 0x80 && b <= 0xBF; }

}  // namespace

size_t WellFormedAt(std::string_view s, size_t i, size_t* subpart) {
  const auto lead = static_cast<unsigned char>(s[i]);
  const size_t want = LeadLength(lead);
  if (want == 0) {
    if (subpart) *subpart = 1;
    return 0;
  }
  size_t have = 1;
  while (have < want && i + have < s.size()) {
    const auto b = static_cast<unsigned char>(s[i + have]);
    const bool ok = have == 1 ? SecondInRange(lead, b) : Continuation(b);
    if (!ok) break;
    ++have;
  }
  if (have == want) {
    if (subpart) *subpart = want;
    return want;
  }
  // A truncated or broken sequence: the bytes that were a valid prefix are
  // one maximal subpart.
  if (subpart) *subpart = have;
  return 0;
}

std::string ToValidUtf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    size_t part = 0;
    const size_t n = WellFormedAt(s, i, &part);
    if (n > 0) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      out.append(kReplacement);
      i += part;
    }
  }
  return out;
}

bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const size_t n = WellFormedAt(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

size_t IncompleteTail(std::string_view s) {
  // A character is at most 4 bytes: look back at most 3.
  for (size_t back = 1; back <= 3 && back <= s.size(); ++back) {
    const size_t i = s.size() - back;
    const auto lead = static_cast<unsigned char>(s[i]);
    if (Continuation(lead)) continue;
    const size_t want = LeadLength(lead);
    if (want <= back) return 0;
    size_t part = 0;
    WellFormedAt(s, i, &part);
    // Incomplete only when every byte after the lead still fits.
    return part == back ? back : 0;
  }
  return 0;
}

char32_t CodePointAt(std::string_view s, size_t i, size_t n) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (n == 1) return b0;
  char32_t cp = b0 & (0xFF >> (n + 1));
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  return cp;
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace wsup::text
