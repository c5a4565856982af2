#include "supervisor/metrics.h"

#include <algorithm>
#include <initializer_list>
#include <sstream>
#include <utility>

#include "supervisor/engine_fsm.h"

namespace wsup {
namespace {

// A label value in the text format: backslash, double quote and newline escaped.
std::string LabelValue(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\' || c == '"') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

Metrics::Metrics() {
  recovery_.bounds = {0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600};
  recovery_.counts.assign(recovery_.bounds.size() + 1, 0);
  kv_back_.bounds = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
  kv_back_.counts.assign(kv_back_.bounds.size() + 1, 0);
  // Every phase from the first scrape (a dashboard's query has data before
  // the first failover); from a millisecond to recovery's scale.
  for (const char* phase : {"detect", "swap", "first_answer", "kv_full"}) {
    Histogram& h = phases_[phase];
    h.bounds = {0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
    h.counts.assign(h.bounds.size() + 1, 0);
  }
}

void Metrics::ObservePhase(const std::string& phase, double seconds) {
  if (phase == "kv_full") kv_back_.Observe(seconds);
  auto it = phases_.find(phase);
  if (it == phases_.end()) return;  // not a phase the page lists
  it->second.Observe(seconds);
}

void Metrics::Histogram::Observe(double v) {
  size_t i = 0;
  while (i < bounds.size() && v > bounds[i]) ++i;
  counts[i]++;
  sum += v;
  count++;
}

void Metrics::ObserveRecovery(double seconds) { recovery_.Observe(seconds); }

void Metrics::ObserveProbe(const std::string& slot, bool ok, int64_t latency_ms) {
  auto& h = probe_latency_[slot];
  if (h.bounds.empty()) {
    h.bounds = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5};
    h.counts.assign(h.bounds.size() + 1, 0);
  }
  h.Observe(static_cast<double>(latency_ms) / 1000.0);
  if (!ok) probe_failures_[slot]++;
}

void Metrics::SetSlots(const std::string& a, const std::string& a_state, bool a_ready, const std::string& b,
                       const std::string& b_state, bool b_ready) {
  slots_[a] = {a_state, a_ready};
  slots_[b] = {b_state, b_ready};
}

void Metrics::ObserveTransition(const std::string& slot, const std::string& from, const std::string& to) {
  slots_[slot].state = to;
  ++transitions_[{slot, from, to}];
}

std::string Metrics::Render() const {
  std::ostringstream o;
  // What this node serves, as labels to join on (Prometheus's `_info`
  // convention): the series below carry only `slot`, and a query that
  // wants the node, model or revision takes them from here with
  // `* on (instance) group_left(model) wsup_node_info`.
  o << "# HELP wsup_node_info The node's name, the model it serves and its revision (model.revision); always 1.\n"
       "# TYPE wsup_node_info gauge\n"
    << "wsup_node_info{node=\"" << LabelValue(node_name) << "\",model=\"" << LabelValue(model) << "\",revision=\""
    << LabelValue(revision) << "\"} 1\n";
  o << "# HELP wsup_rollouts_total Rolling upgrades of the engines (wsup reload), by outcome.\n"
       "# TYPE wsup_rollouts_total counter\n";
  for (const char* t : {"done", "rolled_back", "failed", "interrupted"}) {
    auto it = rollouts.find(t);
    o << "wsup_rollouts_total{outcome=\"" << t << "\"} " << (it == rollouts.end() ? 0 : it->second) << "\n";
  }
  o << "# HELP wsup_failovers_total Traffic switches from one engine to another, by trigger.\n"
       "# TYPE wsup_failovers_total counter\n";
  for (const char* t : {"crash", "probe", "hang", "drill", "rollout"}) {
    auto it = failovers.find(t);
    o << "wsup_failovers_total{trigger=\"" << t << "\"} " << (it == failovers.end() ? 0 : it->second) << "\n";
  }
  o << "# HELP wsup_cache_lookups_total Weight-cache lookups by engines, by result.\n"
       "# TYPE wsup_cache_lookups_total counter\n";
  for (const char* r : {"hit", "miss"}) {
    auto it = cache_lookups.find(r);
    o << "wsup_cache_lookups_total{result=\"" << r << "\"} " << (it == cache_lookups.end() ? 0 : it->second)
      << "\n";
  }
  auto hist = [&o](const std::string& name, const std::string& labels, const Histogram& h) {
    uint64_t cum = 0;
    std::string sep = labels.empty() ? "" : ",";
    for (size_t i = 0; i < h.bounds.size(); ++i) {
      cum += h.counts[i];
      o << name << "_bucket{" << labels << sep << "le=\"" << MetricNumber(h.bounds[i]) << "\"} " << cum << "\n";
    }
    cum += h.counts.back();
    o << name << "_bucket{" << labels << sep << "le=\"+Inf\"} " << cum << "\n";
    std::string l = labels.empty() ? "" : "{" + labels + "}";
    o << name << "_sum" << l << " " << MetricNumber(h.sum) << "\n" << name << "_count" << l << " " << h.count << "\n";
  };
  o << "# HELP wsup_recovery_seconds From a fault to a semantically ready engine again.\n"
       "# TYPE wsup_recovery_seconds histogram\n";
  hist("wsup_recovery_seconds", "", recovery_);
  o << "# HELP wsup_kv_full_seconds From a failover's fault to the promoted engine mapping the node's KV pool.\n"
       "# TYPE wsup_kv_full_seconds histogram\n";
  hist("wsup_kv_full_seconds", "", kv_back_);
  o << "# HELP wsup_failover_phase_seconds Each failover's phases: detect (fault to detection), swap (detection to "
       "the front's new routes), first_answer (fault to the first correct answer through the front), kv_full (fault "
       "to the promoted engine's full KV).\n"
       "# TYPE wsup_failover_phase_seconds histogram\n";
  for (const auto& [phase, h] : phases_) hist("wsup_failover_phase_seconds", "phase=\"" + phase + "\"", h);
  o << "# HELP wsup_kv_pool_events_total The KV pool's handover events (supervisor/kv_handover.h), by event; trespass: an engine fenced for mapping the pool unasked.\n"
       "# TYPE wsup_kv_pool_events_total counter\n";
  for (const auto& [e, n] : kv_pool_events) o << "wsup_kv_pool_events_total{event=\"" << e << "\"} " << n << "\n";
  o << "# HELP wsup_kv_pool_owner 1 for the engine slot that maps the node's KV pool.\n"
       "# TYPE wsup_kv_pool_owner gauge\n";
  for (const char* slot : {"a", "b"}) {
    o << "wsup_kv_pool_owner{slot=\"" << slot << "\"} " << (kv_pool_owner == slot ? 1 : 0) << "\n";
  }
  o << "# HELP wsup_engine_memory_bytes What each engine says it holds: weights mapped, KV (pool, scratch or "
       "private), other (its own memory beyond them; CPU engines).\n"
       "# TYPE wsup_engine_memory_bytes gauge\n";
  for (const auto& [slot, parts] : engine_memory) {
    for (const auto& [part, bytes] : parts) {
      o << "wsup_engine_memory_bytes{slot=\"" << slot << "\",part=\"" << part << "\"} " << bytes << "\n";
    }
  }
  o << "# HELP wsup_engine_resumed_streams_total Streams resumed on the engine after its predecessor's crash, by "
       "whether it adopted the dead engine's KV or computed it again (docs/kv_journal.md).\n"
       "# TYPE wsup_engine_resumed_streams_total counter\n";
  for (const auto& entry : engine_resume) {
    const std::string& slot = entry.first;
    const std::map<std::string, uint64_t>& r = entry.second;
    auto get = [&r](const char* k) {
      auto it = r.find(k);
      return it == r.end() ? uint64_t{0} : it->second;
    };
    o << "wsup_engine_resumed_streams_total{slot=\"" << slot << "\",kv=\"adopted\"} " << get("adopted_sequences")
      << "\n";
    o << "wsup_engine_resumed_streams_total{slot=\"" << slot << "\",kv=\"recomputed\"} "
      << get("recomputed_sequences") << "\n";
  }
  o << "# HELP wsup_engine_adopted_tokens_total Positions whose KV the engine adopted from a dead engine instead of "
       "computing them again.\n"
       "# TYPE wsup_engine_adopted_tokens_total counter\n";
  for (const auto& [slot, r] : engine_resume) {
    auto it = r.find("adopted_tokens");
    o << "wsup_engine_adopted_tokens_total{slot=\"" << slot << "\"} " << (it == r.end() ? 0 : it->second) << "\n";
  }
  o << "# HELP wsup_engine_up 1 when the slot's engine is live, by slot and role.\n"
       "# TYPE wsup_engine_up gauge\n";
  for (const auto& [slot, v] : slots_) {
    bool up = v.state == "active" || v.state == "standby" || v.state == "warming" || v.state == "starting" ||
              v.state == "draining";
    o << "wsup_engine_up{slot=\"" << slot << "\",role=\"" << v.state << "\"} " << (up ? 1 : 0) << "\n";
  }
  o << "# HELP wsup_engine_semantic_ready 1 when the slot's engine passes its semantic probe.\n"
       "# TYPE wsup_engine_semantic_ready gauge\n";
  for (const auto& [slot, v] : slots_) {
    o << "wsup_engine_semantic_ready{slot=\"" << slot << "\"} " << (v.ready ? 1 : 0) << "\n";
  }
  // One series per state whatever the slot's state, so that a state's
  // series never vanishes and sum by (slot) is 1 at every scrape.
  o << "# HELP wsup_engine_state 1 for the state each engine slot is in, 0 for the others (one-hot).\n"
       "# TYPE wsup_engine_state gauge\n";
  for (const auto& [slot, v] : slots_) {
    for (int i = 0; i <= static_cast<int>(SlotState::kStopped); ++i) {
      const std::string state = SlotStateName(static_cast<SlotState>(i));
      o << "wsup_engine_state{slot=\"" << slot << "\",state=\"" << state << "\"} " << (v.state == state ? 1 : 0)
        << "\n";
    }
  }
  o << "# HELP wsup_engine_transitions_total Moves of each engine slot in its state table, by from and to state.\n"
       "# TYPE wsup_engine_transitions_total counter\n";
  for (const auto& [move, n] : transitions_) {
    const auto& [slot, from, to] = move;
    o << "wsup_engine_transitions_total{slot=\"" << slot << "\",from_state=\"" << from << "\",to_state=\"" << to
      << "\"} " << n << "\n";
  }
  o << "# HELP wsup_probe_latency_seconds Latency of semantic probes, by slot.\n"
       "# TYPE wsup_probe_latency_seconds histogram\n";
  for (const auto& [slot, h] : probe_latency_) hist("wsup_probe_latency_seconds", "slot=\"" + slot + "\"", h);
  o << "# HELP wsup_probe_failures_total Failed probes, by slot.\n# TYPE wsup_probe_failures_total counter\n";
  // Every probed slot, failed or not: a counter that appears only at its
  // first failure has no rate() before it.
  for (const auto& [slot, h] : probe_latency_) {
    auto it = probe_failures_.find(slot);
    o << "wsup_probe_failures_total{slot=\"" << slot << "\"} " << (it == probe_failures_.end() ? 0 : it->second)
      << "\n";
  }
  o << "# HELP wsup_holder_restarts_total Holders restarted.\n# TYPE wsup_holder_restarts_total counter\n"
    << "wsup_holder_restarts_total " << holder_restarts << "\n";
  o << "# HELP wsup_front_restarts_total Fronts restarted.\n# TYPE wsup_front_restarts_total counter\n"
    << "wsup_front_restarts_total " << front_restarts << "\n";
  o << "# HELP wsup_front_self_switches_total Switches the front made on its own (refused or reset).\n"
       "# TYPE wsup_front_self_switches_total counter\n"
    << "wsup_front_self_switches_total " << front_self_switches << "\n";
  o << "# HELP wsup_front_silent_reports_total The front's reports that the active engine sent nothing while "
       "requests waited, by what the supervisor did (tripped: failed over at once).\n"
       "# TYPE wsup_front_silent_reports_total counter\n";
  for (const char* outcome : {"tripped", "dismissed", "ignored"}) {
    auto it = front_silent.find(outcome);
    o << "wsup_front_silent_reports_total{outcome=\"" << outcome << "\"} " << (it == front_silent.end() ? 0 : it->second)
      << "\n";
  }
  // The front's counters, by the names docs/front.md gives them.
  auto front = [this](const char* k) {
    auto it = front_counters.find(k);
    return it == front_counters.end() ? uint64_t{0} : it->second;
  };
  o << "# HELP wsup_front_requests_total Requests the front handed to its proxy.\n"
       "# TYPE wsup_front_requests_total counter\n"
    << "wsup_front_requests_total " << front("requests") << "\n";
  o << "# HELP wsup_front_retries_total Requests the front sent again after an engine failed them.\n"
       "# TYPE wsup_front_retries_total counter\n"
    << "wsup_front_retries_total " << front("retried") << "\n";
  o << "# HELP wsup_front_resumed_streams_total Streams cut by an engine's failure and continued on the other "
       "engine, by API.\n"
       "# TYPE wsup_front_resumed_streams_total counter\n";
  const uint64_t resumed = front("resumed"), resumed_chat = std::min(front("resumed_chat"), resumed);
  o << "wsup_front_resumed_streams_total{api=\"completions\"} " << resumed - resumed_chat << "\n"
    << "wsup_front_resumed_streams_total{api=\"chat\"} " << resumed_chat << "\n";
  o << "# HELP wsup_front_cut_streams_total Cut streams the front ended with an error instead (their engine never "
       "reported the prompt's token ids).\n"
       "# TYPE wsup_front_cut_streams_total counter\n"
    << "wsup_front_cut_streams_total " << front("resume_refused") << "\n";
  o << "# HELP wsup_front_hedges_total Requests silent past front.hedge_after_ms, by what became of the hedge: "
       "started, won (the standby answered first), lost, failed, refused (the budget was spent).\n"
       "# TYPE wsup_front_hedges_total counter\n";
  for (const auto& [outcome, key] : std::initializer_list<std::pair<const char*, const char*>>{
           {"started", "hedged"},
           {"won", "hedge_won"},
           {"lost", "hedge_lost"},
           {"failed", "hedge_failed"},
           {"refused", "hedge_refused"}}) {
    o << "wsup_front_hedges_total{outcome=\"" << outcome << "\"} " << front(key) << "\n";
  }
  o << "# HELP wsup_front_crash_looping 1 while the front restarts more than supervisor.max_restarts times in the "
       "window.\n# TYPE wsup_front_crash_looping gauge\n"
    << "wsup_front_crash_looping " << (front_crash_looping ? 1 : 0) << "\n";
  RenderFrontServing(o, front_counters, front_queued, front_inflight);
  RenderEngineServing(o, engine_load, engine_tokens);
  o << "# HELP wsup_ledger_write_errors_total Ledger rows that were not recorded (refused or not committed).\n"
       "# TYPE wsup_ledger_write_errors_total counter\n"
    << "wsup_ledger_write_errors_total " << ledger_write_errors << "\n";
  o << "# HELP wsup_ledger_lost_rows Ledger rows not recorded since the ledger was created, earlier runs included "
       "(<state_dir>/wsup.db-lost).\n"
       "# TYPE wsup_ledger_lost_rows gauge\n"
    << "wsup_ledger_lost_rows " << ledger_lost_rows << "\n";
  o << "# HELP wsup_reconstructed_failovers_total Failovers that happened while no supervisor ran, recorded at "
       "its restart.\n# TYPE wsup_reconstructed_failovers_total counter\n"
    << "wsup_reconstructed_failovers_total " << reconstructed_failovers << "\n";
  o << "# HELP wsup_bad_messages_total Messages refused or dropped because a field could not be read, by sender.\n"
       "# TYPE wsup_bad_messages_total counter\n";
  for (const char* from : {"control", "front", "engine"}) {
    auto it = bad_messages.find(from);
    o << "wsup_bad_messages_total{from=\"" << from << "\"} " << (it == bad_messages.end() ? 0 : it->second) << "\n";
  }
  return o.str();
}

}  // namespace wsup
