// What the node's control surfaces (control_surface.h) do: `wsup status`,
// and what `wsup failover` (failover.h), `wsup stop` and /metrics reach.

#include "common/log.h"
#include "supervisor/messages.h"
#include "supervisor/supervisor_impl.h"

namespace wsup {

using nlohmann::json;

json Supervisor::Impl::StatusJson() {
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

ControlSurface::Hooks Supervisor::Impl::ControlHooks() {
  ControlSurface::Hooks h;
  h.status = [this] { return StatusJson(); };
  h.drill = [this](const std::shared_ptr<JsonConn>& c, bool kill) { failover_.Drill(c, kill); };
  h.reload = [this](const std::shared_ptr<JsonConn>& c, const std::vector<std::string>& sets) {
    reloader_.Reload(c, "wsup reload", sets);
  };
  h.stop = [this](const std::shared_ptr<JsonConn>& c) {
    stop_waiters_.push_back(c);
    BeginStop("wsup stop", 0);
  };
  h.metrics = [this] {
    ledger_.Report(metrics_);
    front_.Report(metrics_);
    return metrics_.Render();
  };
  return h;
}

}  // namespace wsup
