#include <spdlog/spdlog.h>

#include <cstdlib>

#include "common/log.h"
#include "supervisor/reload.h"

namespace wsup {

using nlohmann::json;

void Reloader::Reload(const std::shared_ptr<JsonConn>& c, const std::string& why, const std::vector<std::string>& sets) {
  auto reply = [this, c](json j) {
    j["type"] = "reload";
    hooks_.reply(c, j);
  };
  // Every refusal is logged: a SIGHUP's has no one else to be told to.
  auto refuse = [&](const std::string& error, const json& changes) {
    spdlog::warn("reload ({}) refused: {}", why, error);
    json j{{"ok", false}, {"outcome", "refused"}, {"error", error}};
    if (!changes.is_null()) j["changes"] = changes;
    reply(j);
  };
  if (hooks_.stopping()) {
    refuse("the node is stopping", json());
    return;
  }
  // Never two at once: the second is refused, and says how to follow the first.
  if (std::string busy = hooks_.rollout_busy(); !busy.empty()) {
    refuse(busy + "; wait until `wsup status` shows it ended, then reload again", json());
    return;
  }
  // `wsup reload --set`: on top of the overrides the node was started (or
  // last reloaded) with, and kept for the next reload once applied.
  auto next = LoadConfig(cfg_.path, MergeOverrides(cfg_.overrides, sets));
  if (!next.ok()) {
    spdlog::error("reload ({}): {}; the node keeps running as it is", why, next.error().message());
    reply({{"ok", false}, {"outcome", "refused"}, {"error", next.error().message()}});
    return;
  }
  // What the live slots run, not only what the running config says.
  ReloadPlan plan = PlanReload(cfg_, *next, hooks_.running());
  json changes = json::array();
  for (const auto& ch : plan.changes) {
    json cj{{"key", ch.key}, {"effect", ReloadEffectName(ch.effect)}, {"where", ch.where}};
    if (!ch.note.empty()) cj["note"] = ch.note;
    changes.push_back(cj);
  }
  if (!plan.refused.empty()) {
    std::string all;
    for (const auto& e : plan.refused) all += (all.empty() ? "" : "\n") + e.message();
    spdlog::error("reload ({}) refused; the node keeps running as it is:\n{}", why, all);
    RolloutRecord rec;
    rec.started_ms = clock_.WallMs();
    rec.ended_ms = rec.started_ms;
    rec.outcome = "refused";
    rec.reason = all;
    rec.command_before = EngineVersionText(cfg_);
    rec.command_after = EngineVersionText(*next);
    hooks_.record_refused(rec);
    reply({{"ok", false}, {"outcome", "refused"}, {"error", all}, {"changes", changes}});
    return;
  }
  if (plan.changes.empty()) {
    cfg_.overrides = next->overrides;
    reply({{"ok", true}, {"outcome", "unchanged"}, {"changes", changes}});
    return;
  }
  const Pair pair = hooks_.pair();
  if (plan.roll()) {
    // All or nothing: a roll that cannot begin leaves every setting as it was.
    const std::string failing = hooks_.failover_busy();
    std::string refusal = pair.active.empty() ? "no active engine serves"
                          : pair.standby_state != SlotState::kStandby
                              ? "the standby (" + pair.standby + ") is " + SlotStateName(pair.standby_state) +
                                    ", not proven ready"
                              : failing;
    if (!refusal.empty()) {
      refuse(refusal + "; a rollout needs an active engine, a proven standby and no failover in progress: reload "
                       "again once `wsup status` shows both engines and failover.in_progress false",
             changes);
      return;
    }
  }
  ApplyAtOnce(*next, plan);
  cfg_.overrides = next->overrides;
  if (!plan.roll()) {
    spdlog::info("reload ({}): {} change(s) applied at once", why, plan.changes.size());
    reply({{"ok", true}, {"outcome", "applied"}, {"changes", changes}});
    return;
  }
  hooks_.roll(pair.standby, pair.active, VersionOf(*next), why, c);
}


void Reloader::ApplyAtOnce(const Config& next, const ReloadPlan& plan) {
  if (!plan.at_once()) return;
  // Everything but the engine version: that one goes slot by slot.
  Config::Engine engine = cfg_.engine;
  engine.ready_timeout_ms = next.engine.ready_timeout_ms;
  engine.stop_timeout_ms = next.engine.stop_timeout_ms;
  bool probe_changed = false;
  for (const auto& ch : plan.changes) probe_changed |= ch.key.rfind("probe.", 0) == 0;
  cfg_.probe = next.probe;
  cfg_.supervisor = next.supervisor;
  cfg_.front.queue_timeout_ms = next.front.queue_timeout_ms;
  cfg_.front.max_queued = next.front.max_queued;
  cfg_.front.hedge_after_ms = next.front.hedge_after_ms;
  cfg_.front.hedge_percent = next.front.hedge_percent;
  cfg_.front.hedge_burst = next.front.hedge_burst;
  cfg_.engine = engine;
  cfg_.where = next.where;
  if (!std::getenv("WSUP_LOG_LEVEL")) spdlog::set_level(spdlog::level::from_str(cfg_.supervisor.log_level));
  hooks_.applied(probe_changed);
  for (const auto& ch : plan.changes) {
    if (ch.effect == ReloadEffect::kAtOnce) spdlog::info("reload: {} = {} (was {}), at once", ch.key, ch.after, ch.before);
  }
}

}  // namespace wsup
