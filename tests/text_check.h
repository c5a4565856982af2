// Text checks the tests share.
#pragma once

#include <string>

namespace wsup::test {

// Whether needle occurs in haystack (error messages, logs, command output).
inline bool Has(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

}  // namespace wsup::test
