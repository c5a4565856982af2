// What a proxied call (front/proxy_call.h) uses of its proxy, and nothing
// more: a router that finds it an engine (or a place in the queue), the
// engines' books it reports to, the connection pool, the counters, the
// settings and the clock. The Proxy implements the two interfaces; a call
// never sees the proxy's routes, queue or other calls.
// Threads: the loop thread only.
#pragma once

#include <string>

#include "common/clock.h"
#include "front/proxy_options.h"
#include "front/upstream.h"

namespace wsup::front {

class ProxyCall;

class CallRouter {
 public:
  virtual ~CallRouter() = default;
  // Finds the call an engine now (ProxyCall::Send), a place in the wait
  // queue (ProxyCall::Queued), or answers it 503 (ProxyCall::Reject503).
  virtual void Route(ProxyCall* call) = 0;
  // The call is over: out of the queue and the proxy's books.
  virtual void Forget(ProxyCall* call) = 0;
  // The client reads slower than the engine writes: the call is asked
  // (ProxyCall::ResumeIfDrained) until its client drained.
  virtual void WatchFlow(ProxyCall* call) = 0;
};

// What calls learn about the engines: the proxy judges them from it
// (backoff, its own switch to the standby, first_ok and silence).
class EngineBook {
 public:
  virtual ~EngineBook() = default;
  // An attempt on `b` failed (`why` names the engine and what happened).
  virtual void Failed(Backend* b, const std::string& why) = 0;
  // `b` gave a good answer (a 2xx with its first body byte, or whole).
  virtual void Answered(Backend* b) = 0;
  // A byte from `b`: it is not silent.
  virtual void Spoke(Backend* b) = 0;
  // A hedge on `b` won its race.
  virtual void HedgeWon(Backend* b) = 0;
};

struct CallServices {
  CallRouter* router = nullptr;
  EngineBook* engines = nullptr;
  UpstreamPool* pool = nullptr;
  ProxyCounters* counters = nullptr;
  const ProxyOptions* options = nullptr;
  const Clock* clock = nullptr;
};

}  // namespace wsup::front
