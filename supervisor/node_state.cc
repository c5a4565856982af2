// state.json, the systemd status line, the node's overall state, and the
// handling of ledger writes that fail.
#include "common/log.h"
#include "supervisor/supervisor_impl.h"

namespace wsup {

std::string Supervisor::Impl::NodeState() const {
  if (stopping_) return "stopping";
  if (degraded_) return "degraded";
  if (engines_.HasActive()) return "serving";
  // Served before and has no active engine now: degraded until one is proven.
  return ready_notified_ ? "degraded" : "starting";
}

void Supervisor::Impl::SetDegraded(const std::string& why) {
  degraded_ = true;
  degraded_reason_ = why;
  spdlog::error("{}", why);
  UpdateStatusLine();
}

void Supervisor::Impl::SaveState() {
  // Written on the loop, at once: it is small and not fsynced (see
  // runtime_state.h), and a child must never run unrecorded, or a
  // supervisor that dies right after a spawn leaves a process that neither
  // its successor nor `wsup stop` can find.
  if (stopping_ && !engines_.AnyProcess() && !front_.has_process() && !holders_.AnyProcess()) {
    return;  // MaybeFinishStop() removes the file
  }
  Status st = BuildState().Save(RuntimeState::PathIn(cfg_.node.runtime_dir));
  if (!st.ok()) spdlog::error("{}", st.error().message());
}

RuntimeState Supervisor::Impl::BuildState() {
  RuntimeState st;
  st.config_path = cfg_.path;
  st.node_name = cfg_.node.name;
  st.supervisor = ProcessRef{::getpid(), ProcessStartTime(::getpid()).ok() ? *ProcessStartTime(::getpid()) : 0};
  st.epoch = front_.epoch();
  st.saved_ms = clock_.WallMs();
  st.kv_pool_owner = kv_.owner();
  st.front = front_.Record();
  st.holders = holders_.Records();
  for (Slot* s : engines_.slots()) {
    if (s->pid <= 0) continue;
    std::string role = s->state == SlotState::kActive    ? "active"
                       : s->state == SlotState::kStandby ? "standby"
                                                         : SlotStateName(s->state);
    st.engines.push_back({s->name, ProcessRef{s->pid, s->start_time}, s->port, role, s->spawned_ms, s->cache_result,
                          s->nonce, s->runs, s->control_token});
  }
  // The versions hold engine.env's values: the file is 0600 (runtime_state.h).
  st.engine_version = VersionOf(cfg_);
  st.rollout = rollout_.Record();
  return st;
}

void Supervisor::Impl::UpdateStatusLine() {
  Slot* act = engines_.Active();
  std::string line = NodeState();
  line += act ? ": active " + act->name : ": no active engine";
  for (Slot* s : engines_.slots()) line += ", " + s->name + " " + SlotStateName(s->state);
  if (front_.crash_looping()) line += ", front crash-looping";
  if (degraded_) line += " (" + degraded_reason_ + ")";
  notifier_.Status(line);
  const auto [a, b] = engines_.slots();
  metrics_.SetSlots(a->name, SlotStateName(a->state), a->semantic_ready, b->name, SlotStateName(b->state),
                    b->semantic_ready);
}

void Supervisor::Impl::RecordFence(Slot& s, const std::string& why) {
  FenceRecord rec;
  rec.time_ms = clock_.WallMs();
  rec.slot = s.name;
  rec.pid = s.pid;
  rec.slot_state = SlotStateName(s.state);
  rec.kind = "kv_pool";
  rec.pool_owner = kv_.owner();
  rec.reason = why;
  ledger_.Check(ledger_.ledger().RecordFence(rec), "fence");
}

void Supervisor::Impl::Logged(const Status& st, const char* what) {
  if (!st.ok()) spdlog::warn("{}: {}", what, st.error().message());
}

}  // namespace wsup
