// Metrics: the supervisor's counters and histograms, rendered as Prometheus
// text on admin.listen /metrics. For dashboards; the ledger is the source of
// reports (it keeps individual rows, not aggregates).
//
// Thread-safety: loop thread only.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "supervisor/serving_metrics.h"

namespace wsup {

class Metrics {
 public:
  Metrics();
  std::map<std::string, uint64_t> failovers;       // by trigger
  std::map<std::string, uint64_t> rollouts;        // by outcome (done, rolled_back, failed, interrupted)
  std::map<std::string, uint64_t> cache_lookups;   // by result
  uint64_t holder_restarts = 0;
  uint64_t front_restarts = 0;
  uint64_t front_self_switches = 0;
  std::map<std::string, uint64_t> front_silent;  // the front's `silent` reports: tripped, dismissed, ignored
  bool front_crash_looping = false;
  // The front's own counters (its `status`, docs/front.md), summed over
  // every front process this supervisor has seen (FrontLink::Report).
  std::map<std::string, uint64_t> front_counters;
  // The node's name, the model it serves (its folder's name) and
  // model.revision: wsup_node_info's labels.
  std::string node_name, model, revision;
  uint64_t front_queued = 0;    // requests waiting in the front for a route, as last told
  uint64_t front_inflight = 0;  // requests the front has sent to an engine and not finished
  uint64_t ledger_write_errors = 0;   // rows refused or not committed
  uint64_t ledger_lost_rows = 0;      // since the ledger was created, earlier runs included
  uint64_t reconstructed_failovers = 0;
  // The node's KV pool: the handover table's events, the engine that holds
  // it ("" when none), and each engine's memory by part (weights, kv, other).
  std::map<std::string, uint64_t> kv_pool_events;
  std::string kv_pool_owner;
  std::map<std::string, std::map<std::string, uint64_t>> engine_memory;
  // Each slot's streams resumed after a crash (its engines' /wsup/status
  // "resume", docs/kv_journal.md): adopted_sequences, adopted_tokens,
  // recomputed_sequences, summed over every engine process the slot has run
  // under this supervisor (an engine's own counts die with it, and most
  // resumes happen on engines that are later killed by the next drill).
  std::map<std::string, std::map<std::string, uint64_t>> engine_resume;
  // Each slot's engine's load as its latest /wsup/status told it (cleared
  // when the engine goes), and its prompt and generated tokens, summed over
  // the slot's engine processes as engine_resume is.
  std::map<std::string, EngineLoad> engine_load;
  std::map<std::string, std::map<std::string, uint64_t>> engine_tokens;
  // Messages refused or dropped because a field could not be read
  // (supervisor/messages.h), by who sent them: control (a `wsup.sock`
  // client), front, engine.
  std::map<std::string, uint64_t> bad_messages;
  // A failover's phase (Failover::Hooks::phase); "kv_full" also feeds
  // wsup_kv_full_seconds.
  void ObservePhase(const std::string& phase, double seconds);

  void ObserveRecovery(double seconds);
  void ObserveProbe(const std::string& slot, bool ok, int64_t latency_ms);
  void SetSlots(const std::string& a, const std::string& a_state, bool a_ready, const std::string& b,
                const std::string& b_state, bool b_ready);
  // A slot's move in its state table (EngineSet::Fire): the one-hot state
  // (wsup_engine_state) follows it at once, and the move is counted by
  // from/to (wsup_engine_transitions_total).
  void ObserveTransition(const std::string& slot, const std::string& from, const std::string& to);
  std::string Render() const;

 private:
  struct Histogram {
    std::vector<double> bounds;
    std::vector<uint64_t> counts;  // one per bound, plus +Inf
    double sum = 0;
    uint64_t count = 0;
    void Observe(double v);
  };
  Histogram recovery_;
  Histogram kv_back_;
  std::map<std::string, Histogram> phases_;  // by phase, seconds
  std::map<std::string, Histogram> probe_latency_;  // by slot, seconds
  std::map<std::string, uint64_t> probe_failures_;  // by slot
  struct SlotView {
    std::string state;
    bool ready = false;
  };
  std::map<std::string, SlotView> slots_;
  // (slot, from state, to state) -> moves.
  std::map<std::tuple<std::string, std::string, std::string>, uint64_t> transitions_;
};

}  // namespace wsup
