// Checked reads of the fields of a JSON object that another process wrote:
// the supervisor's control requests, the front's events and status, an
// engine's /wsup/status and role answers.
//
// nlohmann::json's own accessors throw on a field of another type
// (`msg.value("kill", false)` on {"kill": 3} throws type_error), and an
// exception on a libuv callback ends the process. These never throw: a
// field of the wrong type is an Error that names the field, the type it
// has and the type it needs:
//   field 'kill' is a number (3), not true or false
// Callers put the message's name in front (Error::With) and the fix after.
//
//   Field<T>(obj, "key")             required: absent is an error
//   FieldOr<T>(obj, "key", fallback) absent or null reads as fallback
//   ObjectFieldOr / ArrayFieldOr     a nested object or array, or nullptr
//                                    when absent or null
//
// T is one of bool, std::string, int64_t, uint64_t, int, double. Integers
// must be integers (a fraction or a value out of T's range is an error);
// double takes any number. A non-object `obj` is an error naming what it is.
//
// Pure functions; any thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace wsup {

// What a JSON value is, for messages: "a string", "an integer", "a number",
// "true or false", "an object", "an array", "null".
const char* JsonTypeName(const nlohmann::json& v);

// A short rendering of a value for messages (at most about 40 bytes).
std::string JsonExcerpt(const nlohmann::json& v);

template <typename T>
Result<T> Field(const nlohmann::json& obj, std::string_view key);

template <typename T>
Result<T> FieldOr(const nlohmann::json& obj, std::string_view key, T fallback);

Result<const nlohmann::json*> ObjectFieldOr(const nlohmann::json& obj, std::string_view key);
Result<const nlohmann::json*> ArrayFieldOr(const nlohmann::json& obj, std::string_view key);

extern template Result<bool> Field<bool>(const nlohmann::json&, std::string_view);
extern template Result<std::string> Field<std::string>(const nlohmann::json&, std::string_view);
extern template Result<int64_t> Field<int64_t>(const nlohmann::json&, std::string_view);
extern template Result<uint64_t> Field<uint64_t>(const nlohmann::json&, std::string_view);
extern template Result<int> Field<int>(const nlohmann::json&, std::string_view);
extern template Result<double> Field<double>(const nlohmann::json&, std::string_view);
extern template Result<bool> FieldOr<bool>(const nlohmann::json&, std::string_view, bool);
extern template Result<std::string> FieldOr<std::string>(const nlohmann::json&, std::string_view, std::string);
extern template Result<int64_t> FieldOr<int64_t>(const nlohmann::json&, std::string_view, int64_t);
extern template Result<uint64_t> FieldOr<uint64_t>(const nlohmann::json&, std::string_view, uint64_t);
extern template Result<int> FieldOr<int>(const nlohmann::json&, std::string_view, int);
extern template Result<double> FieldOr<double>(const nlohmann::json&, std::string_view, double);

}  // namespace wsup
