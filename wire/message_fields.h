// Field access for the holder protocol's decoders (wire/protocol.cc,
// wire/layout_protocol.cc): never throws; every error names the message,
// the key and what was expected, and tells the peer to run the same wsup
// version. Internal to wire/.
#pragma once

#include <algorithm>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "checkpoint/fingerprint.h"
#include "common/status.h"

namespace wsup::fields {

using nlohmann::json;

inline Error FieldError(const char* type, const char* key, const char* want) {
  return Corrupt(std::string("'") + type + "' message: field '" + key + "' is missing or not " + want +
                 "; the peer does not speak this version of the holder protocol: run the same wsup "
                 "version on both sides");
}

inline Result<std::string> GetString(const json& j, const char* type, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string()) return FieldError(type, key, "a string");
  return it->get<std::string>();
}

inline std::string GetStringOr(const json& j, const char* key, std::string fallback) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string()) return fallback;
  return it->get<std::string>();
}

inline Result<uint64_t> GetU64(const json& j, const char* type, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number_unsigned()) return FieldError(type, key, "a non-negative integer");
  return it->get<uint64_t>();
}

// For fields added after a message's first version: absent means `fallback`,
// present but not a non-negative integer is still an error.
inline Result<uint64_t> GetU64Or(const json& j, const char* type, const char* key, uint64_t fallback) {
  if (!j.contains(key)) return fallback;
  return GetU64(j, type, key);
}

inline Result<int64_t> GetI64(const json& j, const char* type, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number_integer()) return FieldError(type, key, "an integer");
  return it->get<int64_t>();
}

inline Result<bool> GetBool(const json& j, const char* type, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_boolean()) return FieldError(type, key, "true or false");
  return it->get<bool>();
}

inline Result<Fingerprint> GetFingerprint(const json& j, const char* type, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_object()) return FieldError(type, key, "an object");
  try {
    auto fp = Fingerprint::FromJson(*it);
    if (!fp.ok()) return fp.error().With(std::string("'") + type + "' message: field '" + key + "'");
    return std::move(fp).value();
  } catch (const std::exception& e) {
    return Corrupt(std::string("'") + type + "' message: field '" + key + "': " + e.what());
  }
}

inline bool HasControlChars(std::string_view s) {
  return std::any_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; });
}

}  // namespace wsup::fields
