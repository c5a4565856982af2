#include "front/hedge.h"

#include <algorithm>

#include "front/request_head.h"

namespace wsup::front {

void HedgeLeg::OnUpstreamHead(int s, std::vector<http::Header>* h) {
  status = s;
  has_head = true;
  const std::string* content_type = FindHeader(*h, "Content-Type");
  event_stream = content_type && StartsWithNoCase(*content_type, "text/event-stream");
  headers = std::move(*h);
  owner_->OnHedgeProgress();
}

void HedgeLeg::OnUpstreamBody(std::string_view data) {
  got.append(data);
  owner_->OnHedgeProgress();
}

void HedgeLeg::OnUpstreamDone() {
  attempt.ConnReturned();  // back in the pool; the claim lasts until the call decides
  done = true;
  owner_->OnHedgeProgress();
}

void HedgeLeg::OnUpstreamError(const UpstreamError& e) {
  attempt.ConnReturned();  // closed
  owner_->OnHedgeError(e);
}

HedgeFacts HedgeLeg::Facts(bool call_relays_stream) const {
  HedgeFacts f;
  f.has_head = has_head;
  f.status = status;
  f.event_stream = event_stream;
  f.resume = resume;
  f.call_relays_stream = call_relays_stream;
  f.got_body = !got.empty();
  f.done = done;
  return f;
}

HedgeScan ScanForHedges(const std::vector<HedgeCandidate>& calls, int64_t now_ms, int64_t after_ms,
                        const Backend* active, const Backend* target, bool active_silent) {
  HedgeScan scan;
  auto silent_for = [&](const HedgeCandidate& c, int64_t wait) {
    return c.backend && c.reading && now_ms - c.last_byte_ms >= wait;
  };
  for (const HedgeCandidate& c : calls) {
    if (!c.backend || c.backend != active) continue;
    ++scan.on_active;
    if (silent_for(c, after_ms)) ++scan.silent_on_active;
  }
  if (!target) return scan;
  for (size_t i = 0; i < calls.size(); ++i) {
    const HedgeCandidate& c = calls[i];
    if (!c.backend || c.backend == target || c.hedge_pending || !c.can_hedge) continue;
    // On an engine reported silent, a request is not given the whole wait again.
    const int64_t wait = c.backend == active && active_silent ? 0 : after_ms;
    if (silent_for(c, wait)) scan.to_hedge.push_back(i);
  }
  return scan;
}

Hedger::Hedger(TimerSource* timers, Clock* clock, Site* site) : clock_(clock), site_(site), timer_(timers->Make()) {}

int64_t Hedger::TickMs(int64_t after_ms) { return std::clamp<int64_t>(after_ms / 40, 2, 50); }

void Hedger::SetAfter(int64_t after_ms) {
  after_ms_ = after_ms;
  Arm();
}

void Hedger::Arm() {
  if (!timer_) return;
  if (after_ms_ <= 0) {
    timer_->Stop();
    return;
  }
  // Every late ms is a ms of every stuck request's wait; the timer runs only
  // while calls are in flight (Tick stops it on an idle loop, Wake restarts it).
  const int64_t tick = TickMs(after_ms_);
  timer_->Start(tick, [this] { Tick(); }, tick);
}

void Hedger::Wake() {
  // An idle proxy lets its scan sleep (a front of many loops would otherwise
  // wake each of them up to 500 times a second for nothing).
  if (timer_ && after_ms_ > 0 && !timer_->active()) Arm();
}

void Hedger::Close() { timer_.reset(); }

void Hedger::Tick() {
  if (after_ms_ <= 0) return;
  calls_.clear();
  site_->Candidates(&calls_);
  if (calls_.empty()) {
    site_->Idle();
    if (timer_) timer_->Stop();  // until the next call (Wake)
    return;
  }
  const int64_t now = clock_->MonotonicMs();
  const Backend* active = site_->Active();
  // The counts first: they decide whether the active is silent, and a
  // silent active's calls are hedged at once.
  HedgeScan counts = ScanForHedges(calls_, now, after_ms_, active, nullptr, false);
  const bool active_silent = site_->JudgeSilence(counts, now);
  Backend* target = site_->HedgeTarget(now);
  if (!target) return;
  HedgeScan scan = ScanForHedges(calls_, now, after_ms_, active, target, active_silent);
  std::vector<size_t> refused;
  size_t fresh = 0;
  for (size_t i : scan.to_hedge) {
    if (site_->TakeToken()) {
      site_->Hedge(i, target);
    } else {
      refused.push_back(i);
      if (!calls_[i].refused) ++fresh;
    }
  }
  if (!refused.empty()) site_->BudgetSpent(refused, fresh, now);
}

}  // namespace wsup::front
