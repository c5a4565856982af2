// What the node shows, assembled from its owners' parts: state.json (what
// a restarted supervisor adopts) and `wsup status`.
#include <unistd.h>

#include "common/log.h"
#include "supervisor/node.h"

namespace wsup {

using nlohmann::json;

void Node::SaveState() {
  // Written on the loop, at once: it is small and not fsynced (see
  // runtime_state.h), and a child must never run unrecorded, or a
  // supervisor that dies right after a spawn leaves a process that neither
  // its successor nor `wsup stop` can find.
  if (stop_.finishing()) return;  // the stop removes the file
  Status st = BuildState().Save(RuntimeState::PathIn(cfg_.node.runtime_dir));
  if (!st.ok()) spdlog::error("{}", st.error().message());
}

RuntimeState Node::BuildState() {
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

json Node::StatusJson() {
  json j;
  j["type"] = "status";
  j["node"] = cfg_.node.name;
  j["state"] = health_.State();
  if (health_.degraded()) j["degraded_reason"] = health_.degraded_reason();
  Slot* act = engines_.Active();
  j["active"] = act ? json(act->name) : json(nullptr);
  j["engines"] = engines_.StatusJson(kv_.Enabled());
  j["holders"] = holders_.StatusJson();
  j["front"] = front_.StatusJson();
  if (kv_.Enabled()) j["kv_pool"] = kv_.StatusJson();
  j["failover"] = failover_.StatusJson();
  j["rollout"] = rollout_.StatusJson();
  j["state_dir"] = cfg_.node.state_dir;
  j["ledger"] = ledger_.ledger().path();
  j["ledger_writes"] = ledger_.StatusJson();
  j["admin"] = HostPortString(cfg_.admin.listen.host, surface_.admin_port());
  return j;
}

}  // namespace wsup
