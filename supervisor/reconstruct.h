// ReconstructFailovers: what a restarted supervisor records for the engines
// that died while no supervisor ran. Pure: the dating rules are tested on
// their own (tests/supervisor_core/reconstruct_test.cc); Adopter
// (adopter.h) feeds them and carries out the result (the slots' recovery
// fields, the ledger's rows, the counters).
//
// Each lost engine is dated from the best evidence there is:
//   1. the front's own switch away from it, if it made one after the
//      predecessor's last saved state: fault, detection and swap at that
//      switch;
//   2. else the front's record of the engine's first failure after it:
//      fault and detection there, the swap now;
//   3. else the last time the predecessor saved its state (the latest moment
//      the engine was known to serve), or now when even that is unknown.
// Only an engine that was active gets a failover row (a standby's death
// moved no traffic): to the slot the front switched to, else the slot
// active now, else "none".
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "state/records.h"
#include "supervisor/messages.h"

namespace wsup {

struct LostEngine {
  std::string slot;
  pid_t pid = 0;
  std::string role;     // its role in the predecessor's state: "active", "standby", "draining"
  std::string address;  // HOST:PORT, as the front names it
};

struct ReconstructFacts {
  int64_t saved_ms = 0;  // the predecessor's last state.json; 0: unknown
  int64_t now_ms = 0;
  const FrontLog* front_log = nullptr;  // null: the front did not answer
  // Every slot of this node with its engine's address now.
  std::vector<std::pair<std::string, std::string>> slots;
  std::string active;  // the slot active now, "" when none
};

struct Reconstructed {
  std::string slot;
  int64_t fault_ms = 0;
  // For an engine that was active: its row (reconstructed = true).
  std::optional<FailoverRecord> failover;
};

std::vector<Reconstructed> ReconstructFailovers(const std::vector<LostEngine>& lost, const ReconstructFacts& facts);

}  // namespace wsup
