// Hedging on silence (docs/front.md): a request that has had no byte from
// its engine for hedge_after_ms is sent to the routed standby as well; the
// first of the two to answer wins and the other attempt is cancelled.
//
// HedgeLeg: the second attempt of a hedged call. What the standby sends is
// held here until the call decides (front/call_policy.h: JudgeHedge says
// whether it wins, fails or must wait); it owns its Attempt (front/attempt.h),
// so its engine's in-flight count, until the call adopts it or ends it.
//
// Hedger: when to hedge. It owns the scan's timer (made by a TimerSource, so
// tests drive it with a fake clock), sleeps while no call is in flight, and
// on each tick asks its Site (the proxy) for the calls and the routes, picks
// the silent calls, spends the hedge budget and reports the active engine's
// silence. ScanForHedges is its choice as a pure function.
// Threads: the loop thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/clock.h"
#include "common/timer.h"
#include "front/attempt.h"
#include "front/call_policy.h"
#include "front/upstream.h"
#include "http/request.h"

namespace wsup::front {

class HedgeLeg final : public UpstreamListener {
 public:
  // What the call hears of its hedge.
  class Owner {
   public:
    virtual ~Owner() = default;
    virtual void OnHedgeProgress() = 0;
    virtual void OnHedgeError(const UpstreamError& e) = 0;
  };

  // `resume`: it continues a stream after the tokens the client already has.
  HedgeLeg(Owner* owner, Backend* standby, bool resumes) : attempt(standby), resume(resumes), owner_(owner) {}

  void OnUpstreamHead(int s, std::vector<http::Header>* h) override;
  void OnUpstreamBody(std::string_view data) override;
  void OnUpstreamDone() override;
  void OnUpstreamError(const UpstreamError& e) override;

  // What the standby sent so far, for JudgeHedge. `call_relays_stream`: the
  // call relays (and tracks) an event stream.
  HedgeFacts Facts(bool call_relays_stream) const;
  bool pending() const { return state == State::kPending; }
  // The call won the race itself: the hedge's connection is closed (its
  // engine cancels the request) and its count given back.
  void Cancel() {
    state = State::kEnded;
    attempt.Cancel();
  }

  enum class State { kPending, kAdopted, kEnded };
  State state = State::kPending;
  Attempt attempt;          // on the standby, until the call adopts it or ends it
  const bool resume;
  bool stale_retry_used = false;
  std::string head;         // what it sends: the request's head ...
  std::string resume_body;
  std::string target;  // the continuation's target when not the client's (a chat's)  // ... and body (this one for a resume, else the call's)
  std::string_view body;
  bool has_head = false;
  bool event_stream = false;
  bool done = false;
  int status = 0;
  std::vector<http::Header> headers;
  std::string got;  // the response body so far

 private:
  Owner* owner_;
};

// One call as the hedge scan sees it.
struct HedgeCandidate {
  const Backend* backend = nullptr;  // the engine its attempt is on (null: queued, or between attempts)
  bool reading = false;       // an attempt is out and read from (not paused for a slow client)
  int64_t last_byte_ms = 0;   // loop time of its engine's latest byte, or of the attempt's start
  bool hedge_pending = false;
  bool can_hedge = false;     // front/call_policy.h: CanHedge
  bool refused = false;       // the budget was spent when it was silent before (counted once)
};

struct HedgeScan {
  int on_active = 0;             // calls with an attempt on the active engine
  int silent_on_active = 0;      // ... of those, silent for the whole wait
  std::vector<size_t> to_hedge;  // indexes of the calls to hedge now, in order
};

// Counts the calls on `active` and picks those to hedge on `target` (null:
// none is picked). `active_silent`: the active was reported silent, so its
// calls are hedged without waiting `after_ms` again.
HedgeScan ScanForHedges(const std::vector<HedgeCandidate>& calls, int64_t now_ms, int64_t after_ms,
                        const Backend* active, const Backend* target, bool active_silent);

class Hedger {
 public:
  // What the scan needs of the proxy.
  class Site {
   public:
    virtual ~Site() = default;
    // The calls in flight (`out` is empty when called).
    virtual void Candidates(std::vector<HedgeCandidate>* out) = 0;
    virtual const Backend* Active() const = 0;
    // The engine that may take hedges now (the routed standby, not down), or null.
    virtual Backend* HedgeTarget(int64_t now_ms) const = 0;
    // This tick's counts on the active engine; returns whether the active
    // is reported silent (now or before) and not heard from since.
    virtual bool JudgeSilence(const HedgeScan& counts, int64_t now_ms) = 0;
    virtual bool TakeToken() = 0;
    virtual void Hedge(size_t index, Backend* target) = 0;
    // Calls `indexes` were silent but the budget was spent; `fresh` of them
    // for the first time (counted once per call).
    virtual void BudgetSpent(const std::vector<size_t>& indexes, size_t fresh, int64_t now_ms) = 0;
    // No call is in flight: the scan sleeps until Wake().
    virtual void Idle() = 0;
  };

  Hedger(TimerSource* timers, Clock* clock, Site* site);
  Hedger(const Hedger&) = delete;
  Hedger& operator=(const Hedger&) = delete;

  // 0: hedging off (the timer stops). Otherwise the scan runs every tick.
  void SetAfter(int64_t after_ms);
  int64_t after_ms() const { return after_ms_; }
  // A call came: a sleeping scan runs again.
  void Wake();
  // The proxy is closing: the timer is gone, nothing runs again.
  void Close();
  // One scan now (what the timer runs).
  void Tick();

  // How often the scan runs: a fortieth of the silence, within 2..50 ms (5
  // ms at 200): a hedge, and the silence report, go out at most that late.
  static int64_t TickMs(int64_t after_ms);

 private:
  void Arm();

  Clock* clock_;
  Site* site_;
  std::unique_ptr<Timer> timer_;
  int64_t after_ms_ = 0;
  std::vector<HedgeCandidate> calls_;  // reused between ticks
};

}  // namespace wsup::front
