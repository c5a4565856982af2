// Engine-made layouts in the holder protocol (wire/protocol.h): the messages
// by which an engine writes its own post-load weights into a holder started
// with --layout engine, and by which every later engine attaches them.
//
// A layout is keyed by its fingerprint: the checkpoint's identity plus the
// engine's (checkpoint/fingerprint.h AddEngineLayout). Its life, in the
// holder (holder/layout_fsm.h): writing -> committed, or writing ->
// released (the writer aborted, or its connection closed before a commit).
// Only committed layouts are ever attached.
//
// Conversation (one connection; the client speaks first):
//   hello {..., role: engine, fingerprint, publish: true, wait_ms: W}
//     -> attach {manifest, fingerprint, layout: {id, hash}, fds: N, blob?}
//                                      a committed layout: as for a checkpoint
//      | lease {layout, fingerprint, backend, device, device_uuid,
//               alignment, granularity, max_allocations}
//                                      nobody has it: this client writes it
//      | error {code, message}         (not_found: none committed and no
//                                      publish offered; timeout: W passed)
//     While another client writes the layout, the reply waits (at most W ms,
//     0: answer at once with an error) for the commit (-> attach), or for
//     the writer's loss (-> lease to the waiter that came first).
//   alloc {bytes} -> grant {alloc, size, handle, fds: 1} (+ the memory's fd)
//                  | error
//     host: handle "memfd", a memfd of `size` bytes (bytes rounded up to
//     the page), sealed against growing and shrinking; the writer maps it
//     shared read-write. cuda (wsup-holder --backend cuda): handle
//     "cuda_vmm", a POSIX fd of a VMM allocation of `size` bytes on the
//     holder's GPU (rounded up to the granularity), which the writer
//     imports and maps read-write on that GPU.
//   commit {layout_hash, manifest, blob?}
//     -> attach (as above; the writer's own mapping of its grants becomes
//        the attachment: host read-only, cuda as it was)
//      | error {code, message}         the lease is kept: fix and commit
//                                      again, or abort
//     The manifest is the layout's: the lease's backend and device, one
//     allocation per grant in grant order (their sizes), and the entries
//     (names, dtypes, shapes, strides, offsets), as JSON entries or as a
//     binary tensor table in the binary part (wire/manifest.h). The holder
//     checks it (Manifest::Validate: bounds, overlaps, alignment, dtypes,
//     sizes against shapes and strides, duplicate names), checks that
//     layout_hash is LayoutHash() of its entries, and seals the memory
//     (host: F_SEAL_WRITE, which fails while any writable mapping exists,
//     so the writer must drop its writable mappings first; then
//     F_SEAL_SEAL; cuda: nothing to seal, VMM cannot map read-only on the
//     owning device).
//   abort {reason} -> aborted {layout}   the memory is released
// A writer whose connection closes before its commit loses the lease; the
// holder closes its fds, so the memory is freed once the writer's own fds
// and mappings are gone (a dead writer's are). alloc, commit or abort on a
// connection without a lease is refused with an error, and the connection
// is closed. A grant that would take the holder's layout memory (every
// grant of every writing and committed layout) past its cap
// (--layout-max-bytes) is refused with an error that names the cap, the
// bytes held and asked; the writer keeps its lease and may abort.
//
// The supervisor's keeper (role keeper) takes each committed layout's
// record and fds, so that a holder restarted after a crash adopts them
// (--adopt-layouts, wire/layout_record.h) and no engine loads them again:
//   hello {role: keeper, client}
//     -> committed {layouts: [{id, layout_hash, allocations}]}
//                                      every committed layout, in id order;
//                                      one being written is never listed
//   keep {layout: id}
//     -> kept {record: {id, layout_hash, fingerprint, manifest}, fds: N}
//                                      (+ its N fds, one per allocation)
//      | error {code, message}         (not_found: no such committed layout)
//   bye
// One layout per `kept`, so a reply carries at most one layout's fds (up to
// 4096, a layout's most allocations, spread over several sendmsg calls:
// wire/protocol.h); the
// keeper checks that it got as many fds as the record has allocations, and
// keeps the layout whole or not at all. keep from a connection that is not
// a keeper's is refused.
//
// Thread-safety: values and pure functions.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "checkpoint/fingerprint.h"
#include "common/status.h"
#include "wire/layout_record.h"
#include "wire/manifest.h"

namespace wsup {

// "checkpoint" (a holder with one arena loaded from --model) or "engine"
// (a holder of engine-made layouts).
enum class HolderLayout { kCheckpoint, kEngine };
const char* HolderLayoutName(HolderLayout layout);
Result<HolderLayout> ParseHolderLayout(std::string_view name);

// The longest a client may ask to wait for another's commit (an hour).
inline constexpr uint64_t kMaxLayoutWaitMs = 3'600'000;
// The most allocations (grants, fds) one layout may have.
inline constexpr uint64_t kMaxLayoutAllocations = 4096;

struct LeaseMsg {
  uint64_t layout = 0;  // the layout's id in this holder
  Fingerprint fingerprint;
  std::string backend = "host";
  int device = -1;
  std::string device_uuid = "host";
  uint64_t alignment = Manifest::kTensorAlignment;  // every offset a multiple of it
  uint64_t granularity = 4096;                      // grants are rounded up to it
  uint64_t max_allocations = 4096;
};

struct AllocMsg {
  uint64_t bytes = 0;
};

struct GrantMsg {
  uint32_t alloc = 0;   // index of this allocation in the layout's manifest
  uint64_t size = 0;    // bytes, the request rounded up to the granularity
  std::string handle;   // "memfd" (host); "cuda_vmm" (cuda)
};

struct CommitMsg {
  std::string layout_hash;
  Manifest manifest;  // decoded, not validated: the holder validates it
};

struct AbortMsg {
  std::string reason;
};

struct AbortedMsg {
  uint64_t layout = 0;
};

// One layout as `info` reports it.
struct LayoutInfo {
  uint64_t id = 0;
  std::string state;        // "writing" or "committed"
  Fingerprint fingerprint;
  uint64_t tensors = 0;     // committed: entries; writing: 0
  uint64_t bytes = 0;       // committed: sum of tensor sizes; writing: bytes granted so far
  uint64_t arena_bytes = 0; // sum of the grants' sizes
  uint64_t allocations = 0;
  std::string layout_hash;  // committed only
  std::string writer;       // the writer's name while writing
  int64_t writer_pid = 0;
  uint64_t waiters = 0;     // clients waiting for the commit
  uint64_t attaches = 0;    // attach replies sent for it
  uint64_t age_ms = 0;      // since the lease was granted (or, adopted, since the holder started)
  bool adopted = false;     // taken over from kept fds at the holder's start (--adopt-layouts)
};

// The keeper's messages (see the top of this file).
struct CommittedLayout {
  uint64_t id = 0;
  std::string layout_hash;
  uint64_t allocations = 0;  // the fds a `kept` reply brings
};
struct CommittedMsg {
  std::vector<CommittedLayout> layouts;
};
struct KeepMsg {
  uint64_t layout = 0;
};

nlohmann::json EncodeLease(const LeaseMsg& m);
nlohmann::json EncodeAlloc(const AllocMsg& m);
nlohmann::json EncodeGrant(const GrantMsg& m);  // the fd goes to OutgoingFrame::Make
// `manifest` as ManifestToJson() or ManifestHeaderToJson() (then the
// tensor table is the binary part).
nlohmann::json EncodeCommit(const std::string& layout_hash, nlohmann::json manifest);
nlohmann::json EncodeAbort(const AbortMsg& m);
nlohmann::json EncodeAborted(const AbortedMsg& m);
nlohmann::json LayoutInfoToJson(const LayoutInfo& l);
nlohmann::json EncodeCommitted(const CommittedMsg& m);
nlohmann::json EncodeKeep(const KeepMsg& m);
// The record's manifest as JSON entries; the fds go to OutgoingFrame::Make.
nlohmann::json EncodeKept(const LayoutRecord& r);

Result<LeaseMsg> DecodeLease(const nlohmann::json& j);
Result<AllocMsg> DecodeAlloc(const nlohmann::json& j);
Result<GrantMsg> DecodeGrant(const nlohmann::json& j);
// `table` is the message's binary part.
Result<CommitMsg> DecodeCommit(const nlohmann::json& j, std::string_view table = {});
Result<AbortMsg> DecodeAbort(const nlohmann::json& j);
Result<AbortedMsg> DecodeAborted(const nlohmann::json& j);
Result<LayoutInfo> LayoutInfoFromJson(const nlohmann::json& j);
Result<CommittedMsg> DecodeCommitted(const nlohmann::json& j);
Result<KeepMsg> DecodeKeep(const nlohmann::json& j);
// Checked as LayoutRecordFromJson() checks (wire/layout_record.h); the
// caller compares the fds that came with it against its allocations.
Result<LayoutRecord> DecodeKept(const nlohmann::json& j);

// The hash a commit names: sha256 (hex) over every entry's name, dtype,
// shape, strides, allocation, offset and size, in entry order. Readers get
// it with the attach reply, so two layouts can be told apart at a glance.
std::string LayoutHash(const std::vector<ManifestEntry>& entries);

}  // namespace wsup
