// The pre-tokenizers' split patterns, on PCRE2 (UTF, Unicode properties,
// JIT). The patterns in tokenizer.json are written for Oniguruma, which
// the reference tokenizers use. Two differences matter, and Compile()
// writes the pattern so that both libraries split the same text the same
// way:
//   - `\s`: Oniguruma's is U+0009..U+000D, U+0085 and the Z categories;
//     PCRE2's also has U+180E. `\s` and `\S` are written out as that class.
//   - the Unicode version: a PCRE2 older than the reference's Oniguruma
//     sees the characters assigned since as unassigned (U+1F6DC, a
//     symbol of Unicode 15, is not \p{S} to PCRE2 10.42). Each \p{..} of a
//     general category gets the characters that utf8proc's (newer) tables
//     put in it and PCRE2's do not.
//
// A Regex is immutable after Compile(); FindAll() may run on any thread at
// once (each call has its own match data).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"

namespace wsup::text {

class Regex {
 public:
  // `where` names the pattern in errors (a JSON path).
  static Result<Regex> Compile(const std::string& pattern, const std::string& where);
  Regex(Regex&&) noexcept;
  Regex& operator=(Regex&&) noexcept;
  ~Regex();

  // Calls found(begin, end) for each match, left to right, in valid UTF-8
  // `s`. An empty match moves the search on by one character.
  void FindAll(std::string_view s, const std::function<void(size_t begin, size_t end)>& found) const;

 private:
  struct Code;
  explicit Regex(std::unique_ptr<Code> code);
  std::unique_ptr<Code> code_;
};

// An Oniguruma pattern as PCRE2 should compile it (see above); an error for
// a construct the translation cannot carry (`\S` or `\P{..}` inside a
// class when they would need more characters).
Result<std::string> TranslateOnigPattern(const std::string& pattern);

}  // namespace wsup::text
