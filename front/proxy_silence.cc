// Proxy (front/proxy.h): hedging and silence. The proxy is its Hedger's
// Site (front/hedge.h): it hands the scan its calls and routes, shares this
// loop's counts of silent requests with the front's other loops
// (front/shared.h), reports the active engine silent, and spends the hedge
// budget they share. HedgeWon and Spoke are what calls tell it.
#include "front/proxy.h"

#include <spdlog/spdlog.h>

#include "front/proxy_call.h"

namespace wsup::front {

Status HedgeLimits::Check() const {
  if (after_ms < 0 || after_ms > 3'600'000) {
    return InvalidArgument("hedge_after_ms " + std::to_string(after_ms) +
                           " is out of range; give 0 (no hedging) or the silence in ms, up to 3600000");
  }
  if (percent < 0 || percent > 100) {
    return InvalidArgument("hedge_percent " + std::to_string(percent) +
                           " is out of range; give 0..100, the hedges earned per 100 requests (10 by default)");
  }
  if (burst < 1 || burst > 1'000'000) {
    return InvalidArgument("hedge_burst " + std::to_string(burst) +
                           " is out of range; give 1..1000000, the hedges that can be saved up (16 by default)");
  }
  return Status::Ok();
}

void Proxy::SetHedging(const HedgeLimits& h) {
  bool was_on = options_.hedge_after_ms > 0;
  options_.hedge_after_ms = h.after_ms;
  options_.hedge_percent = h.percent;
  options_.hedge_burst = h.burst;
  // Every loop does the same (the bucket is shared): both are idempotent.
  if (!was_on && h.after_ms > 0) shared_->FillHedges(h.burst);
  shared_->CapHedges(h.burst);
  if (h.after_ms <= 0) ShareSilence(nullptr, 0, 0);
  if (!close_.closing()) hedger_->SetAfter(h.after_ms);
}

bool Proxy::TakeToken() { return shared_->TakeHedge(); }

void Proxy::ShareSilence(SharedBackend* b, int waiting, int silent) {
  if (b != shared_for_) {
    if (shared_for_) {  // this loop's counts move off the engine it counted before
      shared_for_->waiting.fetch_sub(shared_waiting_, std::memory_order_relaxed);
      shared_for_->silent.fetch_sub(shared_silent_, std::memory_order_relaxed);
    }
    shared_for_ = b;
    shared_waiting_ = shared_silent_ = 0;
  }
  if (!b) return;
  b->waiting.fetch_add(waiting - shared_waiting_, std::memory_order_relaxed);
  b->silent.fetch_add(silent - shared_silent_, std::memory_order_relaxed);
  shared_waiting_ = waiting;
  shared_silent_ = silent;
}

void Proxy::HedgeWon(Backend* b) {
  // The first win since the active engine last spoke: where a failover to
  // this engine began serving clients, if the supervisor then routes it.
  const int64_t since = active_ ? active_->shared->last_byte_ms.load() : 0;
  int64_t won = b->shared->hedge_win_ms.load();
  // The first loop to win since then sets it.
  while (won <= since && !b->shared->hedge_win_ms.compare_exchange_weak(won, clock_->WallMs())) {
  }
}

void Proxy::Spoke(Backend* b) { b->shared->Spoke(clock_->WallMs(), now_ms()); }

void Proxy::Candidates(std::vector<HedgeCandidate>* out) {
  scanned_.assign(calls_.begin(), calls_.end());
  out->reserve(scanned_.size());
  for (const ProxyCall* c : scanned_) out->push_back(c->HedgeView());
}

Backend* Proxy::HedgeTarget(int64_t now) const {
  // The standby takes hedges only while the supervisor routes it (it does
  // so once its probes pass) and the front has not seen it fail.
  return standby_ && standby_->down_until_ms <= now ? standby_ : nullptr;
}

void Proxy::Idle() { ShareSilence(nullptr, 0, 0); }

bool Proxy::JudgeSilence(const HedgeScan& counts, int64_t now) {
  const int64_t after = hedger_->after_ms();
  // This loop's share of the counts, summed over the loops in the record.
  ShareSilence(active_ && counts.on_active > 0 ? active_->shared : nullptr, counts.on_active,
               counts.silent_on_active);
  // The active engine sent nothing at all, on any request of any loop, for
  // the whole wait, while at least two requests waited that long for it:
  // more likely the engine than the requests. (Requests younger than the
  // wait do not count against it: under steady traffic they always exist.)
  // Said once until it speaks again: the loop that flips the flag says it.
  SharedBackend* sa = active_ ? active_->shared : nullptr;
  if (!sa) return false;
  const int silent_all = sa->silent.load(std::memory_order_relaxed);
  bool expected = false;
  if (counts.silent_on_active > 0 && silent_all >= 2 && now - sa->last_byte_loop_ms.load() >= after &&
      sa->silent_reported.compare_exchange_strong(expected, true)) {
    const int waiting_all = sa->waiting.load(std::memory_order_relaxed);
    ++counters_.silent_reports;
    if (uint64_t held = 0; silent_log_.Allow(now, &held)) {
      spdlog::warn("front: {} of {} requests on the active engine {} have had no byte for {} ms{}", silent_all,
                   waiting_all, active_->name, after,
                   held > 0 ? " (" + std::to_string(held) + " more such reports in the last second)" : "");
    }
    Emit({{"type", "event"},
          {"kind", "silent"},
          {"backend", active_->name},
          {"silent", silent_all},
          {"inflight", waiting_all},
          {"after_ms", after},
          {"last_byte_ms", sa->last_byte_ms.load()},
          {"epoch", epoch_},
          {"at_ms", clock_->WallMs()}});
  }
  // On an engine reported silent (now or before), a request is not given
  // the whole wait again: it is hedged at once.
  return sa->silent_reported.load(std::memory_order_relaxed);
}

void Proxy::Hedge(size_t index, Backend* target) { scanned_[index]->Hedge(target); }

void Proxy::BudgetSpent(const std::vector<size_t>& indexes, size_t fresh, int64_t now) {
  for (size_t i : indexes) scanned_[i]->MarkHedgeRefused();  // counted once per request
  if (fresh == 0) return;
  counters_.hedge_refused += fresh;
  refused_since_log_ += fresh;
  // Checked every tick (every few ms at a small hedge_after_ms): said at
  // most once a second, with what it held back.
  if (uint64_t held = 0; refused_log_.Allow(now, &held)) {
    spdlog::warn("front: {} silent requests not hedged{}: the hedge budget is spent (hedge_percent {}, "
                 "hedge_burst {})",
                 refused_since_log_, held > 0 ? " since the last such warning" : "", options_.hedge_percent,
                 options_.hedge_burst);
    refused_since_log_ = 0;
  }
}

}  // namespace wsup::front
