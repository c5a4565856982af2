// LayoutStore: the engine-made layouts of a holder started with --layout
// engine (wire/layout_protocol.h), one per fingerprint, and the memory each
// writer was granted. The server (holder/server.h) drives it from its
// connections; this class knows nothing of sockets, only of which
// connection id writes which layout and which ones wait for it.
//
// Memory comes from a LayoutMemory, the one place a backend plugs in:
//   host (HostLayoutMemory): each grant is a memfd of the asked size
//     rounded up to the page, sealed at once against growing and shrinking
//     (its size can never change under a reader), handed to the writer to
//     map read-write; the commit adds F_SEAL_WRITE (refused while any
//     writable mapping of it exists, so the writer must unmap first) and
//     F_SEAL_SEAL, which is what readers check (client/mapping.h).
//   cuda (CudaLayoutMemory): each grant a cuMemCreate allocation on the
//     holder's device, rounded up to the allocation granularity, exported
//     as a POSIX fd (as holder/arena.h does for checkpoint arenas); the
//     holder keeps only the fd, never a mapping. Seal() has nothing to seal
//     (VMM cannot map read-only on the owning device): readers map it as
//     they map a cuda arena, and immutability after the commit is a
//     contract. The device's primary context is retained only while some
//     layout is being written (Idle() lets it go), so a holder of committed
//     layouts holds fds and no context, like a loaded checkpoint arena. The
//     Python client's torch allocator (wsup_torch_malloc over a lease)
//     carves a model's tensors out of these grants, so `from_pretrained`
//     writes straight into them, and commit(state_dict) names them.
//
// States follow holder/layout_fsm.h; every change goes through
// NextLayoutTransition and is logged with its cause.
//
// The cap (max_bytes, wsup-holder --layout-max-bytes; 0: none) bounds the
// bytes granted to every writing and committed layout together. A grant
// that would pass it is refused with an error naming the cap, the bytes
// held and asked, and the fix; the layout stays writing, so its writer may
// commit what it has, ask for less, or abort.
//
// Adoption (a holder restarted with --adopt-layouts): Adopt() takes a
// committed layout from its record (wire/layout_record.h) and the fds the
// supervisor kept, checks that they agree (one fd per allocation, each a
// sealed memfd of the allocation's size; the manifest and its hash were
// checked when the record was read), and enters it committed under its old
// id, as if its writer had just committed it. A refusal names the layout
// and the fix, and leaves the store as it was (the fds are closed). The cap
// never refuses an adoption: the memory exists already; a store adopted
// past its cap refuses new grants until it is under it again.
//
// Ownership: the store owns every layout and its fds; a Layout* stays
// valid until Release() of that layout. Loop thread only.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "checkpoint/fingerprint.h"
#include "common/status.h"
#include "common/unique_fd.h"
#include "holder/layout_fsm.h"
#include "wire/layout_protocol.h"
#include "wire/layout_record.h"
#include "wire/manifest.h"

namespace wsup {

// Where a layout's memory comes from (see the top of this file).
class LayoutMemory {
 public:
  virtual ~LayoutMemory() = default;
  virtual const char* backend() const = 0;  // "host" or "cuda"
  virtual const char* handle() const = 0;   // the grant's handle: "memfd" or "cuda_vmm"
  virtual int device() const = 0;           // -1 for host
  virtual std::string device_uuid() const = 0;
  virtual uint64_t granularity() const = 0;
  // A new allocation of at least `bytes`; *size gets its actual size.
  virtual Result<UniqueFd> Allocate(uint64_t bytes, uint64_t* size) = 0;
  // Makes allocation `index` (fd) immutable for readers; refuses while the
  // writer can still change it, saying how to fix that.
  virtual Status Seal(int fd, uint32_t index) = 0;
  // No layout is being written any more: let go of what only writing needs.
  virtual void Idle() {}
  // For an adoption: refuses an fd that is not allocation `index` of a
  // committed layout of `size` bytes (sealed as Seal() leaves it).
  virtual Status CheckAdopted(int fd, uint32_t index, uint64_t size) const = 0;
};

// memfds, sealed as the top of this file says.
std::unique_ptr<LayoutMemory> MakeHostLayoutMemory();
// VMM allocations on cuda device `device`; refuses a device without VMM or
// POSIX fd handles, and a build or machine without CUDA.
Result<std::unique_ptr<LayoutMemory>> MakeCudaLayoutMemory(int device);

struct Layout {
  uint64_t id = 0;
  Fingerprint fingerprint;
  LayoutState state = LayoutState::kWriting;
  uint64_t writer = 0;  // the writing connection's id (0 once committed)
  std::string writer_name;
  int64_t writer_pid = 0;
  std::vector<UniqueFd> fds;  // one per grant, in grant order
  Manifest manifest;          // header from the grants; entries once committed
  std::string layout_hash;    // once committed
  // Built once at the commit, shared by every attach reply that carries it.
  std::shared_ptr<const std::string> table;
  nlohmann::json table_manifest;  // the header that announces the table
  nlohmann::json json_manifest;   // the whole manifest as JSON entries
  std::deque<uint64_t> waiters;   // connections waiting for the commit, oldest first
  uint64_t attaches = 0;
  uint64_t began_ms = 0;  // when the lease was granted, or the layout adopted (the caller's clock)
  bool adopted = false;   // taken from kept fds (Adopt), not written here
};

class LayoutStore {
 public:
  // max_bytes: the cap on granted layout memory (see the top); 0: none.
  explicit LayoutStore(std::unique_ptr<LayoutMemory> memory, uint64_t max_bytes = 0);
  LayoutStore(const LayoutStore&) = delete;
  LayoutStore& operator=(const LayoutStore&) = delete;

  // The layout for this fingerprint, writing or committed; nullptr if none.
  Layout* Find(const Fingerprint& fp);
  Layout* Get(uint64_t id);

  // Grants a write lease for a fingerprint nobody writes or has committed.
  Result<Layout*> Begin(const Fingerprint& fp, uint64_t writer, const std::string& writer_name, int64_t writer_pid,
                        uint64_t now_ms);
  // What the lease reply says (backend, device, alignment, limits).
  LeaseMsg Lease(const Layout& l) const;

  // A new allocation for a writing layout; its fd (a dup: the store keeps
  // its own) goes to the writer.
  struct Grant {
    GrantMsg msg;
    UniqueFd fd;
  };
  Result<Grant> Allocate(Layout* l, uint64_t bytes);

  // Checks a writer's commit against the grants (backend, device, one
  // allocation per grant with its size), Validate()s it, checks its hash,
  // seals the memory and moves the layout to committed. On any refusal the
  // layout stays writing (LayoutEvent::kCommitRefused) and the error says
  // what to fix. The device context kept for writers is not let go here:
  // the caller calls IdleIfNoWriter() once the writer has its reply.
  Status Commit(Layout* l, Manifest manifest, const std::string& layout_hash);

  // Lets the device context go when no layout is being written. Tearing a
  // CUDA context down takes tens of milliseconds, so the server does it
  // after the committing writer's reply is on its way, not before.
  void IdleIfNoWriter();

  // A committed layout from a record and the fds kept for it (see the top).
  Result<Layout*> Adopt(LayoutRecord record, std::vector<UniqueFd> fds, uint64_t now_ms);

  // What a keeper is told: every committed layout, in id order, and the
  // record of one (its fds are the caller's to duplicate).
  std::vector<CommittedLayout> Committed() const;
  static LayoutRecord Record(const Layout& l);

  // writing -> released (`event` is kAbort or kWriterLost): closes the
  // store's fds and forgets the layout. The Layout* is invalid afterwards.
  // Its waiters are handed back for the caller to serve.
  std::deque<uint64_t> Release(Layout* l, LayoutEvent event, const std::string& cause);

  std::vector<LayoutInfo> Info(uint64_t now_ms) const;
  uint64_t granted_bytes() const;  // sum of every grant still held
  uint64_t max_bytes() const { return max_bytes_; }
  size_t size() const { return layouts_.size(); }
  const LayoutMemory& memory() const { return *memory_; }

  // A grant of more than this is refused, and at most this many per layout.
  static constexpr uint64_t kMaxGrantBytes = 1ull << 40;  // the manifest's 1 TiB
  static constexpr uint64_t kMaxGrants = kMaxLayoutAllocations;  // the manifest's allocations

 private:
  void Move(Layout* l, LayoutEvent event, const std::string& cause);
  static std::string Key(const Fingerprint& fp);
  std::unique_ptr<LayoutMemory> memory_;
  uint64_t max_bytes_ = 0;
  std::map<uint64_t, std::unique_ptr<Layout>> layouts_;
  std::map<std::string, uint64_t> by_key_;
  uint64_t next_id_ = 1;
};

}  // namespace wsup
