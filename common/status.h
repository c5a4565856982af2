// The one error type of wsup.
//
// Everything that can fail returns a Status (success or an Error) or a
// Result<T> (a value or an Error). Exceptions never cross a module boundary,
// and never cross a libuv callback: code that calls a throwing library
// (nlohmann::json, toml++) catches at its edge and turns the exception into
// an Error.
//
// An Error's message is written for the operator who reads it in a log: it
// names the thing (a file, a tensor, a config key, a socket) and ends with
// what to do about it. Callers that add context prepend it with
// Error::With(), so the final message reads from the outside in:
//   "model/shard-3.safetensors: tensor 'x': ends at byte 9000 past ..."
//
// Thread-safety: values; no shared state.
#pragma once

#include <cassert>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace wsup {

enum class Code {
  kOk = 0,
  kInvalidArgument,  // the caller passed something unusable (config, flag, request)
  kNotFound,         // a file, tensor, socket or process that should exist does not
  kIo,               // the operating system said no (read, write, socket, mmap)
  kCorrupt,          // data that claims a format breaks it (checkpoint, message)
  kRefused,          // well-formed but not allowed (quantization, foreign uid)
  kMismatch,         // a fingerprint or identity differs
  kTimeout,          // a bound on time was reached
  kUnavailable,      // a needed facility is absent (no GPU, no driver)
  kInternal,         // a bug in wsup: the message says what invariant broke
};

const char* CodeName(Code code);

class Error {
 public:
  Error(Code code, std::string message) : code_(code), message_(std::move(message)) {
    assert(code != Code::kOk);
  }

  Code code() const { return code_; }
  const std::string& message() const { return message_; }

  // Returns a copy with "context: " in front of the message.
  Error With(std::string_view context) const;

  // "corrupt: model.safetensors: ..." for logs and CLI output.
  std::string ToString() const;

 private:
  Code code_;
  std::string message_;
};

// Status: success or one Error. [[nodiscard]] so a forgotten check is a
// compile error under -Werror.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Error error) : error_(std::move(error)) {}  // NOLINT: implicit by design

  static Status Ok() { return Status(); }

  bool ok() const { return !error_.has_value(); }
  explicit operator bool() const { return ok(); }
  const Error& error() const {
    assert(error_.has_value());
    return *error_;
  }
  Code code() const { return ok() ? Code::kOk : error_->code(); }
  std::string ToString() const { return ok() ? "ok" : error_->ToString(); }

 private:
  std::optional<Error> error_;
};

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}      // NOLINT: implicit by design
  Result(Error error) : v_(std::move(error)) {}  // NOLINT: implicit by design

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }

  T& value() & {
    assert(ok());
    return std::get<0>(v_);
  }
  const T& value() const& {
    assert(ok());
    return std::get<0>(v_);
  }
  T&& value() && {
    assert(ok());
    return std::get<0>(std::move(v_));
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

  const Error& error() const {
    assert(!ok());
    return std::get<1>(v_);
  }
  Status status() const { return ok() ? Status() : Status(error()); }

 private:
  std::variant<T, Error> v_;
};

// Shorthands that keep call sites short and the message first.
inline Error InvalidArgument(std::string m) { return Error(Code::kInvalidArgument, std::move(m)); }
inline Error NotFound(std::string m) { return Error(Code::kNotFound, std::move(m)); }
inline Error IoError(std::string m) { return Error(Code::kIo, std::move(m)); }
inline Error Corrupt(std::string m) { return Error(Code::kCorrupt, std::move(m)); }
inline Error Refused(std::string m) { return Error(Code::kRefused, std::move(m)); }
inline Error Mismatch(std::string m) { return Error(Code::kMismatch, std::move(m)); }
inline Error Timeout(std::string m) { return Error(Code::kTimeout, std::move(m)); }
inline Error Unavailable(std::string m) { return Error(Code::kUnavailable, std::move(m)); }
inline Error Internal(std::string m) { return Error(Code::kInternal, std::move(m)); }

// An IoError whose message ends with strerror(errno_value).
Error ErrnoError(std::string what, int errno_value);

}  // namespace wsup

// Propagate a failed Status or Result from the enclosing function.
#define WSUP_RETURN_IF_ERROR(expr)                      \
  do {                                                  \
    auto wsup_status_ = (expr);                         \
    if (!wsup_status_.ok()) return wsup_status_.error(); \
  } while (0)

#define WSUP_CONCAT_INNER_(a, b) a##b
#define WSUP_CONCAT_(a, b) WSUP_CONCAT_INNER_(a, b)
// WSUP_ASSIGN_OR_RETURN(auto x, MakeX()); declares x from a Result or returns its error.
#define WSUP_ASSIGN_OR_RETURN(decl, expr)                                  \
  auto WSUP_CONCAT_(wsup_result_, __LINE__) = (expr);                      \
  if (!WSUP_CONCAT_(wsup_result_, __LINE__).ok())                          \
    return WSUP_CONCAT_(wsup_result_, __LINE__).error();                   \
  decl = std::move(WSUP_CONCAT_(wsup_result_, __LINE__)).value()  // NOLINT(bugprone-macro-parentheses): decl is a declaration
