#include "common/json_fields.h"

#include <limits>

namespace wsup {

using nlohmann::json;

namespace {

// What each T must be, in the words of the messages.
template <typename T>
constexpr const char* Wanted() {
  if constexpr (std::is_same_v<T, bool>) {
    return "true or false";
  } else if constexpr (std::is_same_v<T, std::string>) {
    return "a string";
  } else if constexpr (std::is_same_v<T, uint64_t>) {
    return "a non-negative integer";
  } else if constexpr (std::is_integral_v<T>) {
    return "an integer";
  } else {
    return "a number";
  }
}

Error WrongType(std::string_view key, const json& v, const char* want) {
  return InvalidArgument("field '" + std::string(key) + "' is " + JsonTypeName(v) + " (" + JsonExcerpt(v) +
                         "), not " + want);
}

Error NotAnObject(const json& obj) {
  return InvalidArgument(std::string("expected a JSON object, got ") + JsonTypeName(obj) + " (" + JsonExcerpt(obj) +
                         ")");
}

// v (present, not null) as T.
template <typename T>
Result<T> As(std::string_view key, const json& v) {
  if constexpr (std::is_same_v<T, bool>) {
    if (!v.is_boolean()) return WrongType(key, v, Wanted<T>());
    return v.get<bool>();
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (!v.is_string()) return WrongType(key, v, Wanted<T>());
    return v.get<std::string>();
  } else if constexpr (std::is_integral_v<T>) {
    if (!v.is_number_integer()) return WrongType(key, v, Wanted<T>());
    // Compared as the type the parser stored, so that nothing wraps.
    auto out_of_range = [&](const std::string& shown) {
      return InvalidArgument("field '" + std::string(key) + "' is " + shown + ", out of range for " + Wanted<T>() +
                             " (" + std::to_string(std::numeric_limits<T>::min()) + " to " +
                             std::to_string(std::numeric_limits<T>::max()) + ")");
    };
    if (v.is_number_unsigned()) {
      const uint64_t u = v.get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<T>::max())) return out_of_range(std::to_string(u));
      return static_cast<T>(u);
    }
    const int64_t i = v.get<int64_t>();
    if (i < static_cast<int64_t>(std::numeric_limits<T>::min()) ||
        (std::is_signed_v<T> && i > static_cast<int64_t>(std::numeric_limits<T>::max()))) {
      return out_of_range(std::to_string(i));
    }
    return static_cast<T>(i);
  } else {
    if (!v.is_number()) return WrongType(key, v, Wanted<T>());
    return v.get<double>();
  }
}

// The field, or nullptr when absent; an error when obj is no object.
Result<const json*> Find(const json& obj, std::string_view key) {
  if (!obj.is_object()) return NotAnObject(obj);
  auto it = obj.find(key);
  return it == obj.end() ? nullptr : &*it;
}

Result<const json*> Nested(const json& obj, std::string_view key, bool object) {
  WSUP_ASSIGN_OR_RETURN(const json* v, Find(obj, key));
  if (!v || v->is_null()) return nullptr;
  if (object ? !v->is_object() : !v->is_array()) return WrongType(key, *v, object ? "an object" : "an array");
  return v;
}

}  // namespace

const char* JsonTypeName(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::object: return "an object";
    case json::value_t::array: return "an array";
    case json::value_t::string: return "a string";
    case json::value_t::boolean: return "true or false";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "an integer";
    case json::value_t::number_float: return "a number";
    default: return "binary data";
  }
}

std::string JsonExcerpt(const json& v) {
  // Values from a peer may hold invalid UTF-8: replaced, never thrown on.
  std::string s = v.is_object() ? "{...}" : v.is_array() ? "[...]" : v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  return s;
}

template <typename T>
Result<T> Field(const json& obj, std::string_view key) {
  WSUP_ASSIGN_OR_RETURN(const json* v, Find(obj, key));
  if (!v) return InvalidArgument("field '" + std::string(key) + "' is missing; it must be " + Wanted<T>());
  return As<T>(key, *v);
}

template <typename T>
Result<T> FieldOr(const json& obj, std::string_view key, T fallback) {
  WSUP_ASSIGN_OR_RETURN(const json* v, Find(obj, key));
  if (!v || v->is_null()) return fallback;
  return As<T>(key, *v);
}

Result<const json*> ObjectFieldOr(const json& obj, std::string_view key) {
  return Nested(obj, key, true);
}

Result<const json*> ArrayFieldOr(const json& obj, std::string_view key) {
  return Nested(obj, key, false);
}

template Result<bool> Field<bool>(const json&, std::string_view);
template Result<std::string> Field<std::string>(const json&, std::string_view);
template Result<int64_t> Field<int64_t>(const json&, std::string_view);
template Result<uint64_t> Field<uint64_t>(const json&, std::string_view);
template Result<int> Field<int>(const json&, std::string_view);
template Result<double> Field<double>(const json&, std::string_view);
template Result<bool> FieldOr<bool>(const json&, std::string_view, bool);
template Result<std::string> FieldOr<std::string>(const json&, std::string_view, std::string);
template Result<int64_t> FieldOr<int64_t>(const json&, std::string_view, int64_t);
template Result<uint64_t> FieldOr<uint64_t>(const json&, std::string_view, uint64_t);
template Result<int> FieldOr<int>(const json&, std::string_view, int);
template Result<double> FieldOr<double>(const json&, std::string_view, double);

}  // namespace wsup
