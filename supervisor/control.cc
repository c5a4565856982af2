// What the node's control surfaces (control_surface.h) do: `wsup status`,
// the failover drills and planned swaps, and what `wsup stop` and
// /metrics gather.

#include "common/log.h"
#include "supervisor/messages.h"
#include "supervisor/supervisor_impl.h"

namespace wsup {

using nlohmann::json;

namespace {
constexpr int64_t kDrainBudgetMs = 30'000;
constexpr int64_t kDrainPollMs = 20;
}  // namespace

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
  h.drill = [this](const std::shared_ptr<JsonConn>& c, bool kill) { Drill(c, kill); };
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

std::string Supervisor::Impl::SwapRefusal(Slot* act, Slot* stby) {
  if (!act) return "no active engine to fail over from";
  if (failover_.InProgress()) return failover_.Refusal();
  if (stby->state != SlotState::kStandby) {
    return "the standby (" + stby->name + ") is " + SlotStateName(stby->state) +
           ", not proven ready; wait for `wsup status` to show it semantically ready";
  }
  if (PromotionCheck check = engines_.CheckStandby(*stby); !check.unfit.empty()) {
    return "the standby (" + stby->name + ") is not fit to take the traffic: " + check.unfit;
  } else if (!check.note.empty()) {
    // A planned swap moves traffic off a healthy active: only onto a
    // standby proven just now. (A crash promotes it anyway; see
    // promotion_check.h.)
    return "the standby (" + stby->name + ") is not proven recently: " + check.note.substr(0, check.note.find(" but")) +
           "; try again once its next probe passes";
  }
  return "";
}

void Supervisor::Impl::Drill(const std::shared_ptr<JsonConn>& c, bool kill) {
  Slot* act = engines_.Active();
  Slot* stby = act ? engines_.Other(act) : nullptr;
  std::string refuse = SwapRefusal(act, stby);
  if (refuse.empty() && rollout_.InProgress()) {
    refuse = "a rollout is in progress (step " + rollout_.StepName() +
             "); drill once `wsup status` shows it ended";
  }
  if (!refuse.empty()) {
    failover_.Refuse(c, refuse);
    return;
  }
  if (kill) {
    act->drill_kill = true;
    act->drill_fault_ms = clock_.WallMs();
    failover_.ExpectKill(act->name, act->drill_fault_ms, c);
    // The exit drives the failover exactly as a real crash would.
    Logged(launcher_.Signal(act->pid, SIGKILL), "drill: killing the active engine");
    return;
  }
  PlannedSwap(*act, *stby, "planned drill", c);
}

bool Supervisor::Impl::PlannedSwap(Slot& act, Slot& stby, const std::string& why,
                                   const std::shared_ptr<JsonConn>& c) {
  // The standby takes new traffic at once; the old active drains, then
  // becomes the standby. Both moves are rows of the engine table.
  int64_t fault = clock_.WallMs();
  swapping_ = true;
  engines_.Fire(act, SlotEvent::kDemote, why);
  swapping_ = false;
  std::string unfit;
  const bool promoted = PromoteInSwap(stby, why, &unfit);
  PushRoutes();
  int64_t swapped = clock_.WallMs();
  // Its row, its proof and the answer to c: the failover's (failover.h).
  failover_.OnSwapped(act.name, stby.name, promoted, why, unfit, fault, swapped, c);
  FinishDrain(act, c, clock_.MonotonicMs());
  return promoted;
}

void Supervisor::Impl::FinishDrain(Slot& old, const std::shared_ptr<JsonConn>& c, int64_t started_mono) {
  if (old.state != SlotState::kDraining) return;
  Slot* op = &old;
  std::string addr = HostPortString(cfg_.engine.host, old.port);
  auto decide = [this, op, c, started_mono, addr](int64_t inflight) {
    // Taken back as the active engine (the one that replaced it failed)
    // while the front was asked: the drain is over without its `drained`.
    if (op->state != SlotState::kDraining) return;
    if (inflight == 0 || clock_.MonotonicMs() - started_mono > kDrainBudgetMs) {
      engines_.Fire(*op, SlotEvent::kDrained,
           inflight == 0 ? "no request in flight" : "drain budget of 30 s ran out with requests in flight");
      return;
    }
    After(kDrainPollMs, [this, op, c, started_mono] { FinishDrain(*op, c, started_mono); });
  };
  if (!front_.linked()) {
    decide(0);
    return;
  }
  // Ask the front how many requests it still has on the old engine.
  front_.AskStatus([decide, addr](const json* reply) {
    // A reply that cannot be read counts as nothing in flight, as no reply
    // does: the drain budget is not held up by it.
    if (!reply) {
      decide(0);
      return;
    }
    auto n = FrontInflight(*reply, addr);
    if (!n.ok()) spdlog::warn("front's status: {}; the drain of {} ends", n.error().message(), addr);
    decide(n.ok() ? *n : 0);
  });
}

}  // namespace wsup
