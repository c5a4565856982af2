// The client side of the weight holder: connect, present a fingerprint,
// attach (map the arena), look tensors up in O(1), detach.
//
// Weight-cache modes (decided here, so every engine behaves the same):
//   daemon: the holder must serve these weights. A missing holder is an
//           Error with Code::kUnavailable, a fingerprint mismatch one with
//           Code::kMismatch whose message lists the differing fields.
//   client: use the holder when it has exactly these weights; otherwise the
//           outcome says "load from disk instead", with the reason and the
//           differing fields, for the caller to load and to record the miss.
//   off:    never attach; the outcome says disk, reason "mode off".
// Every attempt returns an AttachOutcome {source, reason, diffs, ms, phases}.
//
// Every attach asks the holder for the binary tensor table
// (wire/manifest.h) unless told not to; a holder that does not send one
// sends JSON entries, which are read just the same.
//
// Roles: engines attach through Attach() with a fingerprint computed from
// their checkpoint's headers and their deployment (ComputeFingerprint in
// gpu/local_fingerprint.h, which reads no tensor bytes). The supervisor's
// fd keeper uses AttachKeeper(): manifest and raw fds, nothing mapped, no
// CUDA; on a holder of engine-made layouts, KeepLayouts() instead.
// `wsup cache verify` uses AttachInspect(), which takes the holder's
// fingerprint as given.
//
// Ownership: an Attachment owns its mapping and its connection. The mapping
// stays readable after the holder dies; the open connection only lets the
// holder count the client, and the holder closes it once it has been idle
// for the holder's idle limit (holder/server.h), which the mapping does not
// notice. Not thread-safe to mutate (Detach); const lookups
// may be made from any thread once Attach() has returned.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "checkpoint/fingerprint.h"
#include "checkpoint/sharding.h"
#include "client/mapping.h"
#include "common/status.h"
#include "common/unique_fd.h"
#include "gpu/local_fingerprint.h"
#include "wire/protocol.h"

namespace wsup {

enum class AttachMode { kDaemon, kClient, kOff };
const char* AttachModeName(AttachMode mode);
// "daemon", "client" or "off"; the error lists the three.
Result<AttachMode> ParseAttachMode(std::string_view name);

// kPublished: an engine-made layout this client wrote into the holder
// itself (client/publish.h), then attached.
enum class WeightSource { kHolder, kDisk, kPublished };
const char* WeightSourceName(WeightSource source);  // "holder", "disk", "published"

// Where an attach spent its time, in milliseconds; steps not reached stay 0.
struct AttachPhases {
  double connect_ms = 0;    // connect() to the holder's socket
  double handshake_ms = 0;  // hello sent to the whole reply received (manifest, table, fds)
  double decode_ms = 0;     // the reply's fields, the manifest's header and its tensor table
  double checks_ms = 0;     // Manifest::ValidateLayout()
  double index_ms = 0;      // the name index (and duplicate check)
  double map_ms = 0;        // mmap (host) or import + reserve + map + set access (cuda)
  // True when map_ms ran on a second thread beside the table's decode,
  // checks and index (MappedArena::Map): then the phases add up to more
  // than the attach took.
  bool overlapped = false;
};

struct AttachOutcome {
  WeightSource source = WeightSource::kDisk;
  // Empty when attached; otherwise why the caller must load from disk
  // ("mode off", "holder unavailable: ...", "fingerprint mismatch: ...").
  std::string reason;
  std::vector<FingerprintDiff> diffs;
  double ms = 0;  // connect + handshake + mapping
  AttachPhases phases;
};

struct AttachOptions {
  std::string socket_path;
  AttachMode mode = AttachMode::kDaemon;
  std::string client_name = "engine";
  int device = 0;  // cuda ordinal to map on (ignored for host arenas)
  int timeout_ms = 10'000;
  // Ask for the binary tensor table. false: JSON entries, as clients older
  // than the table get them (for comparisons and tests).
  bool tensor_table = true;
  // Attach() of an engine-made layout (wire/layout_protocol.h) that another
  // client is writing: wait up to this long for its commit (0: an error at
  // once). AttachOrPublish() takes its own wait.
  uint64_t layout_wait_ms = 0;
};

// A mapped arena from a holder, with the connection it came over.
class Attachment {
 public:
  Attachment(Channel channel, MappedArena arena, Fingerprint holder_fp, std::vector<FingerprintDiff> diffs);
  ~Attachment();
  Attachment(const Attachment&) = delete;
  Attachment& operator=(const Attachment&) = delete;

  const MappedArena& arena() const { return arena_; }
  const Manifest& manifest() const { return arena_.manifest(); }
  TensorView Find(std::string_view name) const { return arena_.Find(name); }
  TensorView At(size_t i) const { return arena_.At(i); }
  size_t size() const { return arena_.size(); }
  const Fingerprint& holder_fingerprint() const { return holder_fp_; }
  // Inspection only: how the presented fingerprint differs from the holder's.
  const std::vector<FingerprintDiff>& diffs() const { return diffs_; }
  bool connected() const { return channel_.connected(); }

  // Says bye, closes the connection and unmaps. Pointers from Find() are
  // invalid afterwards. Also done by the destructor.
  void Detach();

 private:
  Channel channel_;
  MappedArena arena_;
  Fingerprint holder_fp_;
  std::vector<FingerprintDiff> diffs_;
  bool detached_ = false;
};

struct AttachResult {
  AttachOutcome outcome;
  std::unique_ptr<Attachment> attachment;  // set exactly when outcome.source == kHolder
};

// An engine's attach, with the mode's semantics (see the top of this file).
// Errors only in daemon mode, or for misuse (an empty socket path).
Result<AttachResult> Attach(const AttachOptions& opts, const Fingerprint& ours);

// The second half of Attach(): completes it from the reply to a hello sent
// on `ch` at t0 (attach, mismatch or error), with the mode's semantics.
// `phases` holds what was measured before the reply. client/publish.cc
// uses it for the replies of a publishing client, passing its own mapping
// of the grants as `writer` (MappedArena::Map) once it committed.
Result<AttachResult> AttachFromReply(const AttachOptions& opts, const Fingerprint& ours, Channel ch, Frame reply,
                                     std::chrono::steady_clock::time_point t0, AttachPhases phases = {},
                                     std::shared_ptr<GrantMapping> writer = nullptr);

// Inspection: attaches whatever the holder serves. When `ours` is given the
// differences are reported in Attachment::diffs(), never refused. A cuda
// arena is mapped on the local device with the manifest's UUID.
Result<std::unique_ptr<Attachment>> AttachInspect(const std::string& socket_path, const std::string& client_name,
                                                  int timeout_ms, const Fingerprint* ours = nullptr);

// What a keeper holds: the arena's record and its fds (in allocation order),
// plus the open connection (its EOF tells the keeper the holder died). The
// holder exempts an attached keeper from its idle limit for that reason, so
// the link needs no keepalive.
struct KeptArena {
  ArenaRecord record;
  std::vector<UniqueFd> fds;
  Channel channel;
};
// The keeper's attach: nothing is mapped and no CUDA is touched. With
// `expected`, a differing holder is refused (Code::kMismatch).
Result<KeptArena> AttachKeeper(const std::string& socket_path, const std::string& client_name, int timeout_ms,
                               const Fingerprint* expected = nullptr);

// What a keeper holds of one committed engine-made layout: its record and
// its fds, in allocation order (wire/layout_record.h).
struct KeptLayout {
  LayoutRecord record;
  std::vector<UniqueFd> fds;
};
// One keeper round on a holder of engine-made layouts (wire/layout_protocol.h):
// every layout the holder has committed (id, hash, allocations), and the
// record and fds of each one that `have` lacks (by id and hash), fetched
// while their fds fit in `max_fds`. A layout comes whole or not at all: one
// whose reply is refused, damaged or short of fds is not fetched, and
// `skipped` says why. Connection-level failures are the round's Error.
// Blocking; nothing is mapped.
struct LayoutKeepRound {
  std::vector<CommittedLayout> committed;
  std::vector<KeptLayout> fetched;
  std::vector<std::string> skipped;
};
Result<LayoutKeepRound> KeepLayouts(const std::string& socket_path, const std::string& client_name, int timeout_ms,
                                    const std::vector<CommittedLayout>& have, uint64_t max_fds);

// The holder's `info` reply.
Result<InfoMsg> QueryHolderInfo(const std::string& socket_path, int timeout_ms);

}  // namespace wsup
