// LayoutRecord: one committed engine-made layout (wire/layout_protocol.h) as
// the supervisor's keeper holds it, so that a holder restarted after a crash
// serves it again without any engine loading or publishing it: its id and
// layout hash in the holder, its fingerprint, and its manifest (JSON
// entries, as the keeper's arena record has them: wire/protocol.h
// ArenaRecord). Its memory travels beside it as fds, one per allocation in
// allocation order: with the holder's `kept` reply (SCM_RIGHTS) and, in a
// layouts record file, as the numbers of the fds a new holder inherits.
//
// A layouts record file (<runtime_dir>/holder-RANK.layouts.json), written by
// the supervisor right before it starts a holder with --adopt-layouts:
//   {"format": "wsup-layouts-record", "version": 1,
//    "layouts": [{id, layout_hash, fingerprint, manifest, fds: [3, 4]}, ...]}
// The file as a whole is refused only when it is not such a record (not
// JSON, another format or version, no layouts array). Each layout in it is
// decoded and checked on its own: one that is damaged is refused with its
// id and the fds it named (for the holder to close), and the others are
// read; LayoutsRecord says which is which.
//
// Checks of one layout (LayoutRecordFromJson): id 1 or more; layout_hash 64
// lower-case hex digits and the LayoutHash() of the entries; a fingerprint
// of an engine-made layout (IsEngineLayout); a manifest that Validate()s
// with at least one entry; in a file, one fd number (3 or more, none named
// twice in the file) per allocation. Whether the fds are what the record
// says (their sizes and seals) is the adopting holder's check
// (holder/layout_store.h LayoutStore::Adopt).
//
// Thread-safety: values and pure functions, apart from the file's I/O.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "checkpoint/fingerprint.h"
#include "common/status.h"
#include "wire/manifest.h"

namespace wsup {

inline constexpr int kLayoutsRecordVersion = 1;

struct LayoutRecord {
  uint64_t id = 0;  // the layout's id in its holder, kept by the next one
  std::string layout_hash;
  Fingerprint fingerprint;
  Manifest manifest;
  // In a layouts record file only: the inherited fd of each allocation.
  std::vector<int> fds;
};

// "layout 3 (hash 0123456789abcdef)", for messages.
std::string DescribeLayout(uint64_t id, const std::string& layout_hash);

// with_fds: write (and require) the fd numbers, as a layouts record file has.
nlohmann::json LayoutRecordToJson(const LayoutRecord& r, bool with_fds);
// `what` names the record in errors (e.g. "'kept' message: record").
Result<LayoutRecord> LayoutRecordFromJson(const nlohmann::json& j, bool with_fds, const std::string& what);

// One layout of a layouts record file that was refused: why, and the fd
// numbers it named (when it named any that no other layout took), which
// the holder closes so that their memory is not held for nothing.
struct RefusedLayout {
  uint64_t id = 0;  // 0 when the entry has no readable id
  Error error = Internal("unset");
  std::vector<int> fds;
};

struct LayoutsRecord {
  std::vector<LayoutRecord> layouts;
  std::vector<RefusedLayout> refused;
};

nlohmann::json LayoutsRecordToJson(const std::vector<LayoutRecord>& layouts);
Result<LayoutsRecord> LayoutsRecordFromJson(const nlohmann::json& j);
// Written atomically (mode 0600: it names the model).
Status WriteLayoutsRecord(const std::string& path, const std::vector<LayoutRecord>& layouts);
// Errors name the path; refused layouts are in the result, not errors.
Result<LayoutsRecord> ReadLayoutsRecord(const std::string& path);

}  // namespace wsup
