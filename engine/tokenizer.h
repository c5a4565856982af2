// The byte tokenizer of the reference engine and its golden outputs: one
// token per UTF-8 byte of the prompt, no special tokens; token id t renders
// as the character U+00tt, so response text is the UTF-8 encoding of those
// code points. Pure functions; any thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace wsup::engine {

std::vector<int32_t> EncodeBytes(std::string_view text);

// Appends the UTF-8 encoding of code point `token` (ids past U+10FFFF or in
// the surrogate range render as U+FFFD).
void AppendTokenText(int32_t token, std::string* out);
std::string DecodeTokens(const std::vector<int32_t>& tokens);

}  // namespace wsup::engine
