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
  j["state"] = NodeState();
  if (degraded_) j["degraded_reason"] = degraded_reason_;
  Slot* act = engines_.Active();
  j["active"] = act ? json(act->name) : json(nullptr);
  j["engines"] = engines_.StatusJson(kv_.Enabled());
  j["holders"] = holders_.StatusJson();
  j["front"] = front_.StatusJson();
  if (kv_.Enabled()) j["kv_pool"] = kv_.StatusJson();
  j["failover"] = failover_.StatusJson();
  j["rollout"] = rollout_.StatusJson();
  j["state_dir"] = cfg_.node.state_dir;
  j["ledger"] = ledger_->path();
  Ledger::Stats ls = ledger_->stats();
  // write_errors: rows lost by this supervisor; lost_rows: by every run
  // since the ledger was created (its side file, so a restart keeps them).
  json lj{{"write_errors", ls.failed + ls.dropped + ls.refused},
          {"committed", ls.committed},
          {"waiting", ls.waiting},
          {"retrying", ls.retrying},
          {"lost_rows", ls.losses.rows}};
  if (ls.losses.rows > 0) {
    lj["lost_by_table"] = ls.losses.by_table;
    lj["lost_first_ms"] = ls.losses.first_ms;
    lj["lost_last_ms"] = ls.losses.last_ms;
    lj["lost_last_error"] = ls.losses.last_error;
  }
  if (!ledger_last_error_.empty()) lj["last_error"] = ledger_last_error_;
  if (!ls.last_error.empty()) lj["last_write_error"] = ls.last_error;
  if (ls.retrying) lj["retry_error"] = ls.retry_error;
  if (!ls.loss_file_error.empty()) lj["lost_file_error"] = ls.loss_file_error;
  if (ls.reopens > 0) lj["reopened"] = ls.reopened;
  j["ledger_writes"] = lj;
  j["admin"] = HostPortString(cfg_.admin.listen.host, surface_.admin_port());
  return j;
}

ControlSurface::Hooks Supervisor::Impl::ControlHooks() {
  ControlSurface::Hooks h;
  h.status = [this] { return StatusJson(); };
  h.drill = [this](const std::shared_ptr<JsonConn>& c, bool kill) { failover_.Drill(c, kill); };
  h.reload = [this](const std::shared_ptr<JsonConn>& c, const std::vector<std::string>& sets) {
    Reload(c, "wsup reload", sets);
  };
  h.stop = [this](const std::shared_ptr<JsonConn>& c) {
    stop_waiters_.push_back(c);
    BeginStop("wsup stop", 0);
  };
  h.metrics = [this] {
    Ledger::Stats ls = ledger_->stats();
    metrics_.ledger_write_errors = ls.failed + ls.dropped + ls.refused;
    metrics_.ledger_lost_rows = static_cast<uint64_t>(ls.losses.rows);
    front_.Report(metrics_);
    return metrics_.Render();
  };
  return h;
}

}  // namespace wsup
