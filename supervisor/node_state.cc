// state.json, the hooks of NodeHealth (node_health.h), the fences' rows.
#include "common/log.h"
#include "supervisor/supervisor_impl.h"

namespace wsup {

NodeHealth::Hooks Supervisor::Impl::HealthHooks() {
  NodeHealth::Hooks h;
  h.facts = [this] {
    NodeHealth::Facts f;
    f.stopping = stopping_;
    if (Slot* act = engines_.Active()) f.active = act->name;
    for (Slot* s : engines_.slots()) f.slots.emplace_back(s->name, SlotStateName(s->state));
    f.front_crash_looping = front_.crash_looping();
    return f;
  };
  h.status = [this](const std::string& line) {
    notifier_.Status(line);
    const auto [a, b] = engines_.slots();
    metrics_.SetSlots(a->name, SlotStateName(a->state), a->semantic_ready, b->name, SlotStateName(b->state),
                      b->semantic_ready);
  };
  h.ready = [this](const std::string& line) { notifier_.Ready(line); };
  return h;
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
