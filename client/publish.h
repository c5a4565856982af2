// Engine-made layouts, the client's side (wire/layout_protocol.h): attach
// the layout this engine computes from when a holder has it committed, and
// otherwise write it, once, for every engine after this one.
//
//   AttachOrPublish(opts, fingerprint, wait_ms)
//     -> attachment: the layout was committed (by this holder's earlier
//                    writer), mapped read-only as a checkpoint arena is
//      | publication: nobody had it; this client holds the write lease:
//                    Allocate() memory from the holder (mapped read-write
//                    here: host memory, or device memory on a cuda holder),
//                    write the tensors with the engine's own loader, then
//                    Commit() the entries: the holder checks and seals the
//                    memory, and the same connection brings the layout
//                    back as an Attachment (source "published") whose
//                    tensors are where the writer wrote them
//      | neither:    load from disk (client mode; outcome.reason says why)
//   While another client writes the layout, the hello's answer waits for
//   its commit (or, if that writer is lost, for this client's own lease) up
//   to wait_ms; past it the holder answers with a timeout that names the
//   bound. Modes are Attach()'s (client/client.h): daemon turns every
//   failure into an Error, client into "load from disk", off never asks.
//
// The fingerprint must be an engine layout's (AddEngineLayout in
// checkpoint/fingerprint.h): the checkpoint's identity plus the engine's
// name, version and transform, so another revision or another transform is
// another layout.
//
// Ownership: a Publication owns the lease's connection and shares the
// writer's mapping of its grants (GrantMapping, client/mapping.h), whose
// addresses never change: a refused commit leaves every region where it
// was, and a committed layout's Attachment shares the same mapping (host:
// mapped read-only in place; cuda: as it is), so the writer's pointers
// are the layout's and stay valid for as long as the Attachment (or any
// other owner of the mapping) lives. Destroying the Publication (or
// Abort()) before Commit() gives the lease up; the holder releases the
// memory once every mapping of it is gone. Not thread-safe; Allocate()d
// memory may be written from any thread until Commit() (host: no access
// during the commit, read-only after it) or Abort().
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/fingerprint.h"
#include "client/client.h"
#include "common/status.h"
#include "common/unique_fd.h"
#include "wire/layout_protocol.h"
#include "wire/manifest.h"
#include "wire/protocol.h"

namespace wsup {

// How long a client waits for another's commit unless told otherwise: a
// large model takes minutes to load.
inline constexpr uint64_t kDefaultLayoutWaitMs = 600'000;

class Publication {
 public:
  struct Region {
    uint32_t alloc = 0;     // the allocation's index: ManifestEntry::alloc
    void* data = nullptr;   // mapped read-write in this process (a device pointer on cuda)
    uint64_t size = 0;      // bytes (the request rounded up to the granularity)
  };

  Publication(AttachOptions opts, Fingerprint fp, Channel channel, LeaseMsg lease);
  ~Publication();
  Publication(const Publication&) = delete;
  Publication& operator=(const Publication&) = delete;

  const LeaseMsg& lease() const { return lease_; }
  // The cuda ordinal this process maps a cuda lease's memory on.
  int device() const { return opts_.device; }
  const std::vector<Region>& regions() const { return regions_; }
  // The grants' fds, in allocation order (for a writer that maps them
  // itself; on host it must unmap before Commit()).
  const std::vector<UniqueFd>& fds() const { return fds_; }
  // The mapping of the grants (null before the first Allocate()).
  const std::shared_ptr<GrantMapping>& mapping() const { return mapping_; }

  // Asks the holder for `bytes` more bytes and maps them read-write (on
  // the device of AttachOptions::device for a cuda lease).
  Result<Region> Allocate(uint64_t bytes);

  // Which grant holds `p` (an address in a Region), and where in it; a
  // NotFound error when none does.
  Status Locate(const void* p, uint32_t* alloc, uint64_t* offset) const;

  // Sends the entries (a binary tensor table, with their LayoutHash()) and
  // waits for the holder's checks and seals; on host the writable mappings
  // are parked first (see the top of this file). On success the layout
  // comes back as an Attachment over this Publication's own mapping
  // (outcome source kPublished) and this Publication is done. A refused
  // commit keeps the lease and the regions as they were: fix the entries
  // and commit again, or Abort(). The error names what the holder refused.
  Result<AttachResult> Commit(std::vector<ManifestEntry> entries);

  // Gives the lease up; the holder releases the memory.
  Status Abort(const std::string& reason);

  bool done() const { return done_; }
  // Wall milliseconds spent in Allocate() so far: the holder's round trips
  // and this process's mappings (what a publish costs beyond the load).
  double grant_ms() const { return grant_ms_; }

 private:
  Status Unpark();
  void Forget();

  AttachOptions opts_;
  Fingerprint fp_;
  Channel channel_;
  LeaseMsg lease_;
  std::vector<Region> regions_;
  std::vector<UniqueFd> fds_;
  std::shared_ptr<GrantMapping> mapping_;
  bool done_ = false;
  double grant_ms_ = 0;
};

struct LayoutResult {
  AttachOutcome outcome;                     // source kHolder when attached, kDisk otherwise
  std::unique_ptr<Attachment> attachment;    // the committed layout
  std::unique_ptr<Publication> publication;  // this client writes it
};

// See the top of this file. Errors only in daemon mode, or for misuse.
Result<LayoutResult> AttachOrPublish(const AttachOptions& opts, const Fingerprint& ours,
                                     uint64_t wait_ms = kDefaultLayoutWaitMs);

}  // namespace wsup
