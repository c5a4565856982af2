// UTF-8 as the tokenizers need it: text from a client may hold bytes that
// are not UTF-8, and a token's bytes may end inside a character.
//
// Invalid input is replaced the way a browser's TextDecoder and Python's
// decode(errors="replace") do it: each maximal subpart of an ill-formed
// sequence becomes one U+FFFD (Unicode's "substitution of maximal
// subparts"), so wsup and the reference tokenizers see the same text.
//
// Pure functions; any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace wsup::text {

inline constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// The length of the well-formed character at s[i], or 0 when s[i] starts
// no well-formed character; *subpart (when given) gets the length of the
// maximal subpart to replace by one U+FFFD (at least 1).
size_t WellFormedAt(std::string_view s, size_t i, size_t* subpart = nullptr);

// `s` with every ill-formed subpart replaced by U+FFFD.
std::string ToValidUtf8(std::string_view s);
bool IsValidUtf8(std::string_view s);

// How many bytes at the end of `s` are the start of a character that more
// bytes could still complete (0 to 3). Bytes that can never be completed
// are not counted: they are ill-formed already.
size_t IncompleteTail(std::string_view s);

// The code point of the well-formed character at s[i] (of length n).
char32_t CodePointAt(std::string_view s, size_t i, size_t n);
void AppendUtf8(char32_t cp, std::string* out);

}  // namespace wsup::text
