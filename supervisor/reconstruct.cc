// ReconstructFailovers (reconstruct.h).
#include "supervisor/reconstruct.h"

#include "supervisor/engine_fsm.h"

namespace wsup {

std::vector<Reconstructed> ReconstructFailovers(const std::vector<LostEngine>& lost, const ReconstructFacts& facts) {
  std::vector<Reconstructed> out;
  for (const LostEngine& e : lost) {
    int64_t fault = facts.saved_ms > 0 ? facts.saved_ms : facts.now_ms;
    int64_t detected = facts.now_ms;
    int64_t swapped = detected;
    std::string switched_to, front_reason;
    if (const FrontLog* log = facts.front_log) {
      // The front's own switch away from this engine, the latest if several.
      for (const auto& sw : log->switches) {
        if (sw.from != e.address || sw.at_ms < facts.saved_ms) continue;
        fault = detected = swapped = sw.at_ms;
        switched_to = sw.to;
        front_reason = sw.reason;
      }
      // When it made none, its record of the engine's first failure.
      if (switched_to.empty()) {
        auto failed = log->failed_at_ms.find(e.address);
        if (failed != log->failed_at_ms.end() && failed->second > 0 && failed->second >= facts.saved_ms) {
          fault = detected = failed->second;  // 0 there means never
        }
      }
    }
    Reconstructed r;
    r.slot = e.slot;
    r.fault_ms = fault;
    if (e.role == "active") {
      std::string to = "none";
      for (const auto& [slot, address] : facts.slots) {
        if (slot != e.slot && !switched_to.empty() && address == switched_to) to = slot;
      }
      if (to == "none" && !facts.active.empty() && facts.active != e.slot) to = facts.active;
      FailoverRecord rec;
      rec.trigger = FailoverTriggerName(FailoverTrigger::kCrash);
      rec.reason = "engine " + e.slot + " (pid " + std::to_string(e.pid) + ") died while no supervisor ran" +
                   (switched_to.empty() ? "; the front had not switched by itself"
                                        : "; the front switched to " + switched_to + " by itself" +
                                              (front_reason.empty() ? "" : ": " + front_reason)) +
                   " (reconstructed at restart)";
      rec.from_slot = e.slot;
      rec.to_slot = to;
      rec.fault_ms = fault;
      rec.detected_ms = detected;
      rec.swapped_ms = swapped;
      rec.reconstructed = true;
      r.failover = std::move(rec);
    }
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace wsup
