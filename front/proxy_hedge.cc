// ProxyCall (front/proxy_call.h): its hedge. The proxy's hedge scan
// (front/hedge.h) picks a silent call and Hedge() sends it to the standby as
// well; the first of the two attempts to answer wins (JudgeHedge,
// front/call_policy.h) and the other is cancelled, so its engine stops.
#include "front/proxy_call.h"

#include <spdlog/spdlog.h>

#include "front/call_policy.h"
#include "front/request_head.h"

namespace wsup::front {

HedgeCandidate ProxyCall::HedgeView() const {
  HedgeCandidate c;
  c.backend = attempt_.backend();
  c.reading = !done() && attempt_.conn() && !flow_paused_;
  c.last_byte_ms = last_byte_ms_;
  c.hedge_pending = HedgePending();
  c.can_hedge = c.backend && !c.hedge_pending && CanHedge();
  c.refused = hedge_refused_;
  return c;
}

bool ProxyCall::CanHedge() const {
  return front::CanHedge(HedgePending(), hedges_.size(), kMaxHedges, writer_->started(), Stream());
}

void ProxyCall::Hedge(Backend* b) {
  Guard g(this);
  hedges_.push_back(std::make_unique<HedgeLeg>(static_cast<HedgeLeg::Owner*>(this), b, writer_->started()));
  hedge_ = hedges_.back().get();
  HedgeLeg& h = *hedge_;
  if (h.resume) {
    Continuation(TokensOwed(), &h.resume_body, &h.target);
    h.body = h.resume_body;
  } else {
    h.body = body_;
  }
  // The engine it hedges is alive: nothing to adopt (no X-Wsup-Resume: cut).
  BuildRequestHead(writer_->request(), b->name, h.body, false, &h.head, h.target);
  ++counters().hedged;
  spdlog::info("front: request {}: no byte from {} for {} ms; hedging on {}{}", id(), attempt_.backend()->name,
               now_ms() - last_byte_ms_, b->name,
               h.resume ? " (resuming after " + std::to_string(sse_->delivered().size()) + " tokens)" : "");
  h.attempt.Lend(s_->pool->Acquire(b, /*fresh=*/false));
  h.attempt.conn()->Send(&h, h.head, h.body, writer_->request().method == "HEAD");
}

void ProxyCall::OnHedgeProgress() {
  Guard g(this);
  if (!HedgePending()) return;
  HedgeLeg& h = *hedge_;
  switch (JudgeHedge(h.Facts(sse_ != nullptr))) {
    case HedgeVerdict::kWait:
      return;
    case HedgeVerdict::kFailed:
      ++counters().hedge_failed;
      spdlog::info("front: request {}: the hedge on {} got status {}; waiting for {}", id(),
                   h.attempt.backend()->name, h.status,
                   attempt_ ? attempt_.backend()->name : "the active engine");
      EndHedge(nullptr);
      return;
    case HedgeVerdict::kWins:
      ++counters().hedge_won;
      AdoptHedge();
      return;
  }
}

void ProxyCall::OnHedgeError(const UpstreamError& e) {
  Guard g(this);
  if (!HedgePending()) return;
  HedgeLeg& h = *hedge_;
  if (e.reused && e.stage == UpstreamError::Stage::kAwaitingResponse && !h.stale_retry_used) {
    // A kept-alive connection the standby had closed: once more on a fresh one.
    h.stale_retry_used = true;
    h.attempt.Lend(s_->pool->Acquire(h.attempt.backend(), /*fresh=*/true));
    h.attempt.conn()->Send(&h, h.head, h.body, writer_->request().method == "HEAD");
    return;
  }
  h.state = HedgeLeg::State::kEnded;
  Backend* standby = h.attempt.Complete();
  ++counters().hedge_failed;
  std::string why = standby->name + " " + e.Describe();
  spdlog::info("front: request {}: the hedge failed: {}; waiting for {}", id(), why,
               attempt_ ? attempt_.backend()->name : "the active engine");
  s_->engines->Failed(standby, why);
}

// The standby's attempt becomes the call's: the active engine's attempt, if
// it is still out, is cancelled (so that engine cancels the request when it
// wakes), and what the standby sent so far is handled as if it had come now.
void ProxyCall::AdoptHedge() {
  Guard g(this);
  HedgeLeg& h = *hedge_;
  h.state = HedgeLeg::State::kAdopted;
  if (attempt_) {
    spdlog::info("front: request {}: {} answered first; closing the request on {}", id(),
                 h.attempt.backend()->name, attempt_.backend()->name);
  }
  attempt_.Cancel();
  flow_paused_ = false;
  if (h.resume) {
    sse_->BeginContinuation();
    body_ = h.body;
    target_ = h.target;
    Move(CallEvent::kAdoptResume);
  } else {
    Move(CallEvent::kAdopt);
    ResetAttempt();
  }
  s_->engines->HedgeWon(h.attempt.backend());
  attempt_ = std::move(h.attempt);  // its claim, taken when the hedge was sent, is the call's now
  if (attempt_.conn()) attempt_.conn()->Rebind(this);
  if (h.has_head) OnUpstreamHead(h.status, &h.headers);
  if (done()) return;
  if (!h.got.empty()) {
    std::string got = std::move(h.got);
    OnUpstreamBody(got);
  }
  if (done()) return;
  if (h.done) OnUpstreamDone();
}

void ProxyCall::EndHedge(const char* why) {
  HedgeLeg& h = *hedge_;
  const Backend* standby = h.attempt.backend();
  h.Cancel();  // its engine cancels the request
  if (why) {
    ++counters().hedge_lost;
    spdlog::info("front: request {}: {}; closing the hedge on {}", id(), why, standby->name);
  }
}

}  // namespace wsup::front
