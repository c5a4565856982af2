// A supervisor that starts where a predecessor left off: it adopts the front,
// the holders and the engines that still run (their pids, start times and
// listening sockets say they are the ones recorded), starts what is missing,
// and records what it can prove happened while no supervisor ran.
//
// Adoption never judges an engine by how fast it answers: a busy or slow
// engine is adopted, and its probes then decide with their own thresholds,
// as for any engine.
#include <unistd.h>

#include <algorithm>

#include "common/fs.h"
#include "common/log.h"
#include "supervisor/reconstruct.h"
#include "supervisor/supervisor_impl.h"

namespace wsup {

using nlohmann::json;

Status Supervisor::Impl::AdoptOrStart(std::optional<RuntimeState> prev) {
  if (prev && !prev->dropped.empty()) {
    spdlog::warn("{}: dropped as malformed: {}; the engines it names are adopted without it",
                 RuntimeState::PathIn(cfg_.node.runtime_dir), prev->dropped);
  }
  const bool engines_run =
      prev && std::any_of(prev->engines.begin(), prev->engines.end(),
                          [this](const RuntimeState::Engine& e) { return engines_.StillRuns(e.proc); });
  if (engines_run && prev->engine_version && !(*prev->engine_version == VersionOf(cfg_))) {
    // The engines go on with the version the node ran (a restart is not a
    // reload): a slot restarted now starts it too, never a third one, and
    // `wsup reload` rolls to the file's. (With none left running, the node
    // starts as from cold, with the file's; a roll that was running rolls
    // back to its old version: Rollout::Resume.)
    spdlog::warn("engine.command or engine.env in {} differs from what the node ran before this restart; the node "
                 "keeps its version until `wsup reload` rolls it to the file's",
                 cfg_.path);
    cfg_.engine.command = prev->engine_version->command;
    cfg_.engine.env = prev->engine_version->env;
  }
  // Front: adopt when it still runs; otherwise start one on the socket bound
  // in Preflight().
  if (prev && prev->front && prev->front->proc.StillRunning()) {
    front_.Adopt(*prev->front, prev->epoch);
  } else {
    front_.Start();
  }
  if (stopping_) return Status::Ok();

  // Holders: adopted when they still run, else spawned.
  if (cfg_.weight_cache.mode == CacheMode::kDaemon) {
    holders_.Start(prev ? prev->holders : std::vector<RuntimeState::Holder>{});
    if (stopping_) return Status::Ok();
  }

  // Engines: adopt those that still run as the processes recorded; the one
  // the front routed to as active stays active.
  std::vector<RuntimeState::Engine> dead;
  if (prev) {
    std::stable_sort(prev->engines.begin(), prev->engines.end(),
                     [](const RuntimeState::Engine& x, const RuntimeState::Engine& y) {
                       return (x.role == "active") > (y.role == "active");
                     });
    // The pool's owner is known before any engine takes a role, so the
    // active one is never granted a pool another engine may still write.
    kv_.AdoptHeld(prev->kv_pool_owner);
    adopting_ = true;
    for (const auto& pe : prev->engines) {
      if (AdoptEngine(pe)) {
        engines_.MarkProven();  // it served before this start (expectation_check.h)
      } else {
        dead.push_back(pe);
      }
    }
    adopting_ = false;
    kv_.AdoptOwner(*prev);
    MaybePromote();
    if (engines_.Active()) health_.Serving("serving (re-adopted)");
    ReconcileWithFront(*prev, dead);
    // A rollout the predecessor ran: ended, and the slots left on one
    // version (before the engines not adopted start: one that was being
    // replaced starts with the version it was to run).
    if (prev->rollout) rollout_.Resume(*prev->rollout);
  }
  if (holders_.AllReady()) engines_.Start();
  SaveState();
  return Status::Ok();
}

bool Supervisor::Impl::AdoptEngine(const RuntimeState::Engine& pe) {
  const EngineSet::Adoption a = engines_.Adopt(pe, pe.version ? VersionText(*pe.version) : "");
  if (a != EngineSet::Adoption::kAdopted) return a == EngineSet::Adoption::kReplaced;
  Slot* s = engines_.ByName(pe.slot);
  if (pe.role == "active") {
    // Not a promotion: the front already sends it the traffic. It keeps the
    // role however slowly it answers now; its probes judge it from here on.
    swapping_ = true;
    engines_.Fire(*s, SlotEvent::kPromote, "was active before the supervisor restart");
    swapping_ = false;
    PushRoutes();
  }
  spdlog::info("adopted engine {} pid {} port {} as {}", s->name, s->pid, s->port, pe.role);
  return true;
}

void Supervisor::Impl::ReconcileWithFront(const RuntimeState& prev, const std::vector<RuntimeState::Engine>& dead) {
  // Engines that died while no supervisor ran. Their slots restart like any
  // failed slot; what the ledger gets is dated from what is known, by the
  // rules of reconstruct.h, once the front has answered with its log.
  std::vector<RuntimeState::Engine> lost;
  for (const auto& e : dead) {
    if (engines_.ByName(e.slot) && (e.role == "active" || e.role == "standby" || e.role == "draining")) lost.push_back(e);
  }
  if (lost.empty()) return;
  for (const auto& e : lost) {
    Slot* s = engines_.ByName(e.slot);
    s->recovery_cause = "crash";
    s->recovery_fault_ms = prev.saved_ms > 0 ? prev.saved_ms : clock_.WallMs();
  }
  auto record = [this, saved_ms = prev.saved_ms, lost](const FrontLog* front_log) {
    std::vector<LostEngine> gone;
    gone.reserve(lost.size());
    for (const auto& e : lost) {
      gone.push_back({e.slot, e.proc.pid, e.role, HostPortString(cfg_.engine.host, e.port)});
    }
    ReconstructFacts facts;
    facts.saved_ms = saved_ms;
    facts.now_ms = clock_.WallMs();
    facts.front_log = front_log;
    for (Slot* o : engines_.slots()) facts.slots.emplace_back(o->name, HostPortString(cfg_.engine.host, o->port));
    if (Slot* act = engines_.Active()) facts.active = act->name;
    const std::vector<Reconstructed> found = ReconstructFailovers(gone, facts);
    for (size_t i = 0; i < found.size(); ++i) {
      const Reconstructed& r = found[i];
      Slot* s = engines_.ByName(r.slot);
      if (!s) continue;
      s->recovery_fault_ms = r.fault_ms;
      if (!r.failover) {
        spdlog::warn("engine {} (pid {}, {}) died while no supervisor ran; restarting it", r.slot, gone[i].pid,
                     gone[i].role);
        continue;
      }
      const FailoverRecord& rec = *r.failover;
      auto id = ledger_.Check(ledger_.ledger().RecordFailover(rec), "reconstructed failover");
      metrics_.failovers[rec.trigger]++;
      metrics_.reconstructed_failovers++;
      if (id) s->recovery_failover_id = *id;
      spdlog::warn("failover {} -> {} while no supervisor ran (reconstructed): {}", rec.from_slot, rec.to_slot,
                   rec.reason);
    }
  };
  // Ask the front for its log; record without it if it does not answer.
  front_.AskStatus([record](const json* reply) {
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
