// What the tests of the holder's wire formats and layouts share: a host
// manifest to build entries on, and the check that a call failed with the
// expected code, saying why.
#pragma once

#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "common/status.h"
#include "tests/text_check.h"
#include "wire/manifest.h"

namespace wsup::test {

// A host manifest (no device) of these allocations; no entries.
inline Manifest HostManifest(const std::vector<ManifestAllocation>& allocations) {
  Manifest m;
  m.backend = "host";
  m.device = -1;
  m.device_uuid = "host";
  m.allocations = allocations;
  return m;
}

// r (a Result or Status) failed with `code`, its message naming each of
// `says`.
template <typename R>
void CheckFailed(const R& r, Code code, const std::vector<std::string>& says) {
  REQUIRE_FALSE(r.ok());
  INFO(r.error().message());
  CHECK(r.error().code() == code);
  for (const std::string& s : says) CHECK(Has(r.error().message(), s));
}

// r (a decoder's Result) failed as corrupt input, its message naming each
// of `says`.
template <typename R>
void CheckCorrupt(const R& r, const std::vector<std::string>& says) {
  CheckFailed(r, Code::kCorrupt, says);
}

}  // namespace wsup::test
