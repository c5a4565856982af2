// One upstream attempt of a call: the request sent to one engine, and the
// claim it holds on that engine's in-flight count (Backend::inflight, which
// status reports and which keeps the Backend from being collected).
//
// The claim is taken when the Attempt is made and given back exactly once:
// when the exchange completes (Complete), when the attempt is abandoned
// (Cancel: its connection is closed, so the engine cancels the request), when
// another attempt is moved over it (a hedge the call adopts replaces the
// attempt it raced), or when it is destroyed. A moved-from Attempt holds
// nothing. So no path of a call can leak the count or give it back twice, and
// nothing else in the front writes Backend::inflight.
//
// Ownership: the connection is the pool's; the attempt only holds it while it
// is lent (UpstreamConn::Send until the listener hears done or error).
// Threads: the loop thread only (a Backend belongs to one loop's pool).
#pragma once

#include <utility>

#include "front/upstream.h"

namespace wsup::front {

class Attempt {
 public:
  Attempt() = default;
  explicit Attempt(Backend* b) : backend_(b) {
    if (backend_) ++backend_->inflight;
  }
  ~Attempt() { Cancel(); }
  Attempt(Attempt&& o) noexcept
      : backend_(std::exchange(o.backend_, nullptr)), conn_(std::exchange(o.conn_, nullptr)) {}
  // The attempt held here before is cancelled first (the loser of a race).
  Attempt& operator=(Attempt&& o) noexcept {
    if (this != &o) {
      Cancel();
      backend_ = std::exchange(o.backend_, nullptr);
      conn_ = std::exchange(o.conn_, nullptr);
    }
    return *this;
  }
  Attempt(const Attempt&) = delete;
  Attempt& operator=(const Attempt&) = delete;

  // The engine it claims (null: none).
  Backend* backend() const { return backend_; }
  explicit operator bool() const { return backend_ != nullptr; }
  // The connection the request is on while the pool lends it (null: none).
  UpstreamConn* conn() const { return conn_; }
  void Lend(UpstreamConn* c) { conn_ = c; }
  // The pool has the connection back (the answer completed, or the
  // connection failed and is closed); the claim stays.
  void ConnReturned() { conn_ = nullptr; }

  // The exchange is over: the connection is the pool's again and the claim
  // is given back. Returns the engine it was on (null: it held none).
  Backend* Complete() {
    conn_ = nullptr;
    Backend* b = std::exchange(backend_, nullptr);
    if (b) --b->inflight;
    return b;
  }
  // Abandons the attempt: its connection, if still lent, is closed (the
  // engine cancels the request) and the claim is given back.
  void Cancel() {
    if (conn_) std::exchange(conn_, nullptr)->Abort();
    Complete();
  }

 private:
  Backend* backend_ = nullptr;
  UpstreamConn* conn_ = nullptr;
};

}  // namespace wsup::front
