// The group's epoch: which side serves, as one etcd key holds it, and a
// member's decisions about it (docs/architecture.md, "Groups"). Pure logic,
// no I/O: the supervisor carries the decisions out against etcd
// (group/etcd.h) and its slots.
//
// The key (EpochKey) holds {"epoch": N, "active": "primary"|"standby",
// "by": member, "trigger": "..."}. Epochs only grow, and a swap is a
// compare-and-put on the key's modification revision, so of two members
// proposing from the same record exactly one wins and the other learns the
// winner (EtcdClient::PutIf). The epoch is the fencing token: a member
// applies a record only when its epoch is newer than the one it applied,
// so a late or replayed watch event can never move it back.
//
// EpochTracker, per member:
//   Observe(record)      a record read or watched: Apply when newer;
//   Propose(dead, why)   a rank of side `dead` died here: a proposal that
//                        makes the other side active, when `dead` is the
//                        active side and no proposal is in flight; a
//                        standby rank's death swaps nothing (the member
//                        re-arms its own standby);
//   Proposed(result)     the compare-and-put's answer: the winner's record
//                        is observed either way.
// Until a first record is observed, nothing is applied and nothing is
// proposed: a member that has not read the key does not know the epoch.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "common/status.h"

namespace wsup::group {

enum class Side { kPrimary, kStandby };
const char* SideName(Side s);
inline Side Other(Side s) { return s == Side::kPrimary ? Side::kStandby : Side::kPrimary; }

// The etcd key of a group's epoch.
std::string EpochKey(const std::string& group);

struct EpochRecord {
  int64_t epoch = 0;
  Side active = Side::kPrimary;
  int by = -1;           // the member that proposed it (-1: none, the first record)
  std::string trigger;   // why, e.g. "crash of member 1 rank 0"
  int64_t mod_revision = 0;  // the key's, as etcd reported it (not stored in the value)
};

std::string EncodeEpoch(const EpochRecord& r);
// The key's value, and its mod_revision from etcd. kCorrupt names what is
// wrong with the value.
Result<EpochRecord> DecodeEpoch(std::string_view value, int64_t mod_revision);

class EpochTracker {
 public:
  explicit EpochTracker(int member) : member_(member) {}

  // The record this member acts on (none before the first Observe).
  const std::optional<EpochRecord>& applied() const { return applied_; }

  // A record read or watched. True when it is newer than the applied one
  // and is now applied: the caller swaps its slots to record.active.
  bool Observe(const EpochRecord& record);

  struct Proposal {
    int64_t expect_mod_revision = 0;  // PutIf's compare
    EpochRecord next;
  };
  // A rank of side `dead` died on this member.
  std::optional<Proposal> Propose(Side dead, const std::string& trigger);

  // The answer to the last proposal: the record now in etcd (this
  // member's when it won, the winner's when it lost). True when it was
  // applied (as Observe).
  bool Proposed(const EpochRecord& current);
  // The proposal got no answer (etcd unreachable): nothing changed; a
  // later death may propose again.
  void ProposalFailed() { proposing_ = false; }

  bool proposing() const { return proposing_; }

 private:
  int member_;
  std::optional<EpochRecord> applied_;
  bool proposing_ = false;
};

}  // namespace wsup::group
