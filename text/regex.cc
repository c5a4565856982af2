#define PCRE2_CODE_UNIT_WIDTH 8
#include "text/regex.h"

#include <pcre2.h>
#include <utf8proc.h>

#include <cstdio>
#include <map>
#include <utility>
#include <vector>

#include "text/utf8.h"

namespace wsup::text {

namespace {

// Oniguruma's \s for Unicode text (its doc/RE: "Unicode case: U+0009 -
// U+000D, U+0085, and General_Category Line_Separator, Paragraph_Separator,
// Space_Separator").
constexpr const char* kSpaceItems = "\\x{9}-\\x{D}\\x{85}\\p{Z}";

// The characters utf8proc assigns that PCRE2 does not know, by their
// two-letter general category ("So"), as class items ("\x{1F6DC}-\x{1F6DC}").
struct Newer {
  std::map<std::string, std::string> items;
  size_t count = 0;
};

const Newer& NewerAssignments() {
  static const Newer newer = [] {
    Newer n;
    int err = 0;
    PCRE2_SIZE off = 0;
    pcre2_code* cn = pcre2_compile(reinterpret_cast<PCRE2_SPTR>("\\p{Cn}"), PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_ANCHORED, &err, &off, nullptr);
    if (!cn) return n;
    (void)pcre2_jit_compile(cn, PCRE2_JIT_COMPLETE);
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(cn, nullptr);
    // Runs of consecutive code points of one category.
    std::map<std::string, std::vector<std::pair<char32_t, char32_t>>> runs;
    for (char32_t cp = 0; cp <= 0x10FFFF; ++cp) {
      if (cp >= 0xD800 && cp <= 0xDFFF) continue;
      const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
      // Unassigned to utf8proc too, or private use and surrogates, which
      // never change.
      if (cat == UTF8PROC_CATEGORY_CN || cat == UTF8PROC_CATEGORY_CO || cat == UTF8PROC_CATEGORY_CS) continue;
      std::string one;
      AppendUtf8(cp, &one);
      if (pcre2_match(cn, reinterpret_cast<PCRE2_SPTR>(one.data()), one.size(), 0, 0, md, nullptr) < 0) continue;
      const std::string name = utf8proc_category_string(static_cast<utf8proc_int32_t>(cp));
      auto& v = runs[name];
      if (!v.empty() && v.back().second + 1 == cp) {
        v.back().second = cp;
      } else {
        v.emplace_back(cp, cp);
      }
      ++n.count;
    }
    pcre2_match_data_free(md);
    pcre2_code_free(cn);
    char buf[48];
    for (const auto& [cat, v] : runs) {
      std::string items;
      for (const auto& [lo, hi] : v) {
        std::snprintf(buf, sizeof buf, "\\x{%X}-\\x{%X}", static_cast<unsigned>(lo), static_cast<unsigned>(hi));
        items += buf;
      }
      n.items[cat] = std::move(items);
    }
    return n;
  }();
  return newer;
}

// The extra class items of a property name: a category ("L") gathers its
// two-letter ones ("Lu", "Ll", ...); anything else (a script) gets none.
std::string ExtraItems(const std::string& property) {
  const Newer& n = NewerAssignments();
  std::string out;
  if (property.size() == 1) {
    for (const auto& [cat, items] : n.items) {
      if (cat[0] == property[0]) out += items;
    }
  } else if (property.size() == 2) {
    auto it = n.items.find(property);
    if (it != n.items.end()) out = it->second;
  }
  return out;
}

}  // namespace

Result<std::string> TranslateOnigPattern(const std::string& pattern) {
  std::string out;
  out.reserve(pattern.size() + 32);
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char n = pattern[i + 1];
      if (n == 's' || n == 'S') {
        const std::string items = std::string(kSpaceItems) + ExtraItems("Z");
        if (n == 's') {
          out += in_class ? items : "[" + items + "]";
        } else if (in_class) {
          return InvalidArgument("\\S inside a character class is not supported (at byte " + std::to_string(i) + ")");
        } else {
          out += "[^" + items + "]";
        }
        ++i;
        continue;
      }
      if ((n == 'p' || n == 'P') && i + 2 < pattern.size() && pattern[i + 2] == '{') {
        const size_t close = pattern.find('}', i + 3);
        if (close == std::string::npos) return InvalidArgument("an unclosed \\p{ at byte " + std::to_string(i));
        std::string name = pattern.substr(i + 3, close - i - 3);
        bool negated = n == 'P';
        if (!name.empty() && name[0] == '^') {
          negated = !negated;
          name.erase(0, 1);
        }
        const std::string extra = ExtraItems(name);
        const std::string prop = std::string("\\p{") + name + "}";
        if (extra.empty()) {
          out += pattern.substr(i, close - i + 1);
        } else if (!negated) {
          out += in_class ? prop + extra : "[" + prop + extra + "]";
        } else if (!in_class) {
          out += "[^" + prop + extra + "]";
        } else {
          return InvalidArgument("a negated property inside a character class is not supported (at byte " +
                                 std::to_string(i) + ")");
        }
        i = close;
        continue;
      }
      out += c;
      out += n;
      ++i;
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' first in a class (after an optional '^') is a literal.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') {
        out += '^';
        ++i;
      }
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') {
        out += ']';
        ++i;
      }
      continue;
    }
    if (in_class && c == '[') {
      return InvalidArgument("a nested character class is not supported (at byte " + std::to_string(i) + ")");
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

struct Regex::Code {
  pcre2_code* code = nullptr;
  ~Code() {
    if (code) pcre2_code_free(code);
  }
};

Regex::Regex(std::unique_ptr<Code> code) : code_(std::move(code)) {}
Regex::Regex(Regex&&) noexcept = default;
Regex& Regex::operator=(Regex&&) noexcept = default;
Regex::~Regex() = default;

Result<Regex> Regex::Compile(const std::string& pattern, const std::string& where) {
  auto translated = TranslateOnigPattern(pattern);
  if (!translated.ok()) return translated.error().With(where);
  int err = 0;
  PCRE2_SIZE offset = 0;
  auto code = std::make_unique<Code>();
  code->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated->data()), translated->size(),
                             PCRE2_UTF | PCRE2_UCP, &err, &offset, nullptr);
  if (!code->code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    return InvalidArgument(where + ": the pattern does not compile at byte " + std::to_string(offset) + ": " +
                           reinterpret_cast<const char*>(msg));
  }
  // JIT is an optimisation: a platform without it still matches, slower.
  (void)pcre2_jit_compile(code->code, PCRE2_JIT_COMPLETE);
  return Regex(std::move(code));
}

namespace {

// One match's data per thread, made once: FindAll runs for every piece of
// every text, and the whole match is all it reads (a data of one pair holds
// it for any pattern).
struct ThreadMatchData {
  pcre2_match_data* md = pcre2_match_data_create(1, nullptr);
  ~ThreadMatchData() { pcre2_match_data_free(md); }
};

}  // namespace

void Regex::FindAll(std::string_view s, const std::function<void(size_t, size_t)>& found) const {
  thread_local ThreadMatchData data;
  pcre2_match_data* md = data.md;
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
  size_t at = 0;
  while (at <= s.size()) {
    // The text was made valid UTF-8 before it got here.
    const int rc = pcre2_match(code_->code, subject, s.size(), at, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc < 0) break;  // PCRE2_ERROR_NOMATCH, or a limit: the rest is one gap
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t begin = ov[0];
    const size_t end = ov[1];
    if (end > begin) {
      found(begin, end);
      at = end;
    } else {
      if (begin >= s.size()) break;
      size_t n = WellFormedAt(s, begin);
      at = begin + (n == 0 ? 1 : n);
    }
  }
}

}  // namespace wsup::text
