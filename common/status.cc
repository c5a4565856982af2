#include "common/status.h"

#include <cstring>

namespace wsup {

const char* CodeName(Code code) {
  switch (code) {
    case Code::kOk: return "ok";
    case Code::kInvalidArgument: return "invalid argument";
    case Code::kNotFound: return "not found";
    case Code::kIo: return "i/o error";
    case Code::kCorrupt: return "corrupt";
    case Code::kRefused: return "refused";
    case Code::kMismatch: return "mismatch";
    case Code::kTimeout: return "timeout";
    case Code::kUnavailable: return "unavailable";
    case Code::kInternal: return "internal error";
  }
  return "unknown";
}

Error Error::With(std::string_view context) const {
  std::string m;
  m.reserve(context.size() + 2 + message_.size());
  m.append(context);
  m.append(": ");
  m.append(message_);
  return Error(code_, std::move(m));
}

std::string Error::ToString() const {
  std::string s = CodeName(code_);
  s += ": ";
  s += message_;
  return s;
}

Error ErrnoError(std::string what, int errno_value) {
  what += ": ";
  what += std::strerror(errno_value);
  return Error(Code::kIo, std::move(what));
}

}  // namespace wsup
