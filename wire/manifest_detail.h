// What wire/manifest.cc and wire/tensor_table.cc share: the manifest's
// bounds, how an entry is named in errors, the one error of a bad manifest
// (kCorrupt, ending with the fix), and the one spelling of strides.
// Internal to wire/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "wire/manifest.h"

namespace wsup::manifest_detail {

// Bounds well past any real model (see manifest.cc).
inline constexpr uint64_t kMaxEntries = 4'000'000;
inline constexpr size_t kMaxRank = 8;

// "manifest entry 3 ('name')", the name cut at 80 bytes.
std::string EntryName(size_t i, const std::string& name);
// Corrupt(what + fix); an empty fix says the sender is broken and to
// restart the holder that sent it.
Error Bad(const std::string& what, std::string_view fix = {});
// Clears strides equal to the contiguous ones.
void Canonicalize(ManifestEntry* e);
bool AnyStrided(const std::vector<ManifestEntry>& entries);

}  // namespace wsup::manifest_detail
