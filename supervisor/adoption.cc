#include <algorithm>
#include <utility>

#include "common/log.h"
#include "supervisor/adopter.h"
#include "supervisor/messages.h"
#include "supervisor/reconstruct.h"

namespace wsup {

using nlohmann::json;

Adopter::Adopter(const Clock& clock, Hooks hooks) : clock_(clock), hooks_(std::move(hooks)) {}

void Adopter::Adopt(RuntimeState prev) {
  std::stable_sort(prev.engines.begin(), prev.engines.end(),
                   [](const RuntimeState::Engine& x, const RuntimeState::Engine& y) {
                     return (x.role == "active") > (y.role == "active");
                   });
  hooks_.kv_held(prev.kv_pool_owner);
  std::vector<RuntimeState::Engine> dead;
  hooks_.adopting(true);
  for (const auto& pe : prev.engines) {
    switch (hooks_.adopt(pe)) {
      case Fate::kAdopted:
        if (pe.role == "active") hooks_.keep_active(pe.slot);
        hooks_.proven();
        spdlog::info("adopted engine {} pid {} port {} as {}", pe.slot, pe.proc.pid, pe.port, pe.role);
        break;
      case Fate::kReplaced:
        // It ran as recorded, so it served; its slot replaces it like any
        // engine that exits, and nothing is reconstructed for it.
        hooks_.proven();
        break;
      case Fate::kGone:
        dead.push_back(pe);
        break;
    }
  }
  hooks_.adopting(false);
  hooks_.kv_owner(prev);
  hooks_.settle();
  Reconcile(prev, dead);
  // Before the engines not adopted start: one that was being replaced
  // starts with the version it was to run.
  if (prev.rollout) hooks_.resume_rollout(*prev.rollout);
}

void Adopter::Reconcile(const RuntimeState& prev, const std::vector<RuntimeState::Engine>& dead) {
  // Engines that died while no supervisor ran. Their slots restart like any
  // failed slot; until the front answers, they are dated from the
  // predecessor's last save.
  std::vector<LostEngine> lost;
  for (const auto& e : dead) {
    if (!hooks_.has_slot(e.slot)) continue;
    if (e.role != "active" && e.role != "standby" && e.role != "draining") continue;
    lost.push_back({e.slot, e.proc.pid, e.role, hooks_.address(e.port)});
    hooks_.date(e.slot, "crash", prev.saved_ms > 0 ? prev.saved_ms : clock_.WallMs(), std::nullopt);
  }
  if (lost.empty()) return;
  auto record = [this, saved_ms = prev.saved_ms, lost](const FrontLog* front_log) {
    ReconstructFacts facts;
    facts.saved_ms = saved_ms;
    facts.now_ms = clock_.WallMs();
    facts.front_log = front_log;
    facts.slots = hooks_.slots();
    facts.active = hooks_.active();
    const std::vector<Reconstructed> found = ReconstructFailovers(lost, facts);
    for (size_t i = 0; i < found.size(); ++i) {
      const Reconstructed& r = found[i];
      if (!r.failover) {
        spdlog::warn("engine {} (pid {}, {}) died while no supervisor ran; restarting it", r.slot, lost[i].pid,
                     lost[i].role);
        hooks_.date(r.slot, "crash", r.fault_ms, std::nullopt);
        continue;
      }
      const FailoverRecord& rec = *r.failover;
      hooks_.date(r.slot, "crash", r.fault_ms, hooks_.record(rec));
      spdlog::warn("failover {} -> {} while no supervisor ran (reconstructed): {}", rec.from_slot, rec.to_slot,
                   rec.reason);
    }
  };
  hooks_.ask_front([record](const json* reply) {
    if (!reply) {
      record(nullptr);
      return;
    }
    auto log = ParseFrontLog(*reply);
    if (!log.ok()) {
      spdlog::warn("the front's status cannot be read ({}); what happened while no supervisor ran is "
                   "recorded without its log",
                   log.error().message());
    }
    record(log.ok() ? &*log : nullptr);
  });
}

}  // namespace wsup
