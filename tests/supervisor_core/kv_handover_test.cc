// The KV pool's handover table (supervisor/kv_handover.h): the pool goes to
// the active engine only once the engine that had it let it go or is gone.
#include <catch2/catch.hpp>

#include <set>
#include <utility>

#include "supervisor/kv_handover.h"
#include "tests/transition_table_check.h"

namespace wsup {
namespace {

using E = PoolEvent;
using S = PoolState;
using A = PoolAction;

// A step's action, and the slot it is for.
void CheckStep(const KvHandover::Step& s, A action, const std::string& slot) {
  CHECK(s.action == action);
  CHECK(s.slot == slot);
}

TEST_CASE("kv handover: each (state, event) pair appears at most once", "[kv_handover]") {
  size_t n = 0;
  const PoolTransition* t = PoolTable(&n);
  REQUIRE(n >= 10);
  test::CheckPairsOnce(t, n, PoolStateName, PoolEventName);
}

TEST_CASE("kv handover: no row ever grants the pool while an owner may still write it", "[kv_handover]") {
  size_t n = 0;
  const PoolTransition* t = PoolTable(&n);
  for (size_t i = 0; i < n; ++i) {
    INFO(PoolStateName(t[i].from) << " x " << PoolEventName(t[i].event));
    if (t[i].action == A::kGrant) CHECK(t[i].from == S::kFree);
    if (t[i].action == A::kGrantIfWanted) {
      // Only an answer that it let go, or the exit, frees it.
      CHECK((t[i].event == E::kReleased || t[i].event == E::kGone));
    }
  }
  // A failed owner is fenced from every owning state, and only its exit frees it.
  for (S s : {S::kGranting, S::kHeld, S::kReleasing}) {
    auto f = NextPoolTransition(s, E::kFailed);
    REQUIRE(f);
    CHECK(f->to == S::kFenced);
  }
  for (E e : {E::kGranted, E::kReleased, E::kDrained, E::kWant, E::kFailed, E::kGrantFailed}) {
    CHECK_FALSE(NextPoolTransition(S::kFenced, e).has_value());
  }
}

TEST_CASE("kv handover: a crash - the promoted engine waits for the dead one's exit", "[kv_handover]") {
  KvHandover h;
  auto s = h.Fire(E::kWant, "a");
  CheckStep(s, A::kGrant, "a");
  CHECK(h.state() == S::kGranting);
  h.Fire(E::kGranted, "a");
  CHECK(h.state() == S::kHeld);
  CHECK(h.owner() == "a");

  // a's lifeline closes: failed; b is promoted at once.
  h.Fire(E::kUnwant, "a");
  s = h.Fire(E::kFailed, "a");
  CHECK(h.state() == S::kFenced);
  s = h.Fire(E::kWant, "b");
  CHECK_FALSE(s.applied);
  CHECK(s.action == A::kNone);  // b serves from its scratch
  CHECK(h.wanted() == "b");
  // Late answers from a, or a second promotion request, change nothing.
  CHECK_FALSE(h.Fire(E::kReleased, "a").applied);
  CHECK_FALSE(h.Fire(E::kGranted, "b").applied);
  CHECK(h.state() == S::kFenced);
  // a's process is reaped: b gets the pool.
  s = h.Fire(E::kGone, "a");
  CheckStep(s, A::kGrant, "b");
  CHECK(h.state() == S::kGranting);
  CHECK(h.owner() == "b");
  h.Fire(E::kGranted, "b");
  CHECK(h.state() == S::kHeld);
}

TEST_CASE("kv handover: a planned drill - released after the drain, then granted", "[kv_handover]") {
  KvHandover h;
  h.Fire(E::kWant, "a");
  h.Fire(E::kGranted, "a");
  h.Fire(E::kUnwant, "a");
  CHECK_FALSE(h.Fire(E::kWant, "b").applied);  // a still drains on the pool
  auto s = h.Fire(E::kDrained, "a");
  CheckStep(s, A::kRelease, "a");
  CHECK(h.state() == S::kReleasing);
  s = h.Fire(E::kReleased, "a");
  CheckStep(s, A::kGrant, "b");
  h.Fire(E::kGranted, "b");
  CHECK(h.owner() == "b");
}

TEST_CASE("kv handover: a release that fails kills the owner - only its exit frees the pool", "[kv_handover]") {
  KvHandover h;
  h.Fire(E::kWant, "a");
  h.Fire(E::kGranted, "a");
  h.Fire(E::kUnwant, "a");
  h.Fire(E::kWant, "b");
  h.Fire(E::kDrained, "a");
  auto s = h.Fire(E::kReleaseFailed, "a");
  CheckStep(s, A::kKillOwner, "a");
  CHECK(h.state() == S::kFenced);
  s = h.Fire(E::kGone, "a");
  CheckStep(s, A::kGrant, "b");
}

TEST_CASE("kv handover: a grant that fails frees the pool and asks for a retry - nobody wanted, nobody granted",
          "[kv_handover]") {
  KvHandover h;
  h.Fire(E::kWant, "a");
  auto s = h.Fire(E::kGrantFailed, "a");
  CheckStep(s, A::kRetryLater, "a");
  CHECK(h.state() == S::kFree);
  CHECK(h.owner().empty());
  // The retry is a new want.
  s = h.Fire(E::kWant, "a");
  CHECK(s.action == A::kGrant);
  h.Fire(E::kGranted, "a");
  // The active fails and nobody is promoted: after its exit nobody holds it.
  h.Fire(E::kUnwant, "a");
  h.Fire(E::kFailed, "a");
  s = h.Fire(E::kGone, "a");
  CHECK(s.action == A::kNone);
  CHECK(h.state() == S::kFree);
  CHECK(h.owner().empty());
}

TEST_CASE("kv handover: a drain that ends before the grant's answer releases after it", "[kv_handover]") {
  KvHandover h;
  h.Fire(E::kWant, "a");
  auto s = h.Fire(E::kDrained, "a");
  CHECK(s.action == A::kRelease);
  // The grant's answer arrives after: still releasing.
  CHECK_FALSE(h.Fire(E::kGranted, "a").applied);
  CHECK(h.state() == S::kReleasing);
}

TEST_CASE("kv handover: a restarted supervisor adopts the owner it finds", "[kv_handover]") {
  KvHandover h;
  h.AdoptHeld("b");
  CHECK(h.state() == S::kHeld);
  CHECK_FALSE(h.Fire(E::kWant, "a").applied);
  // b turns out to be the standby: it has no traffic of its own.
  auto s = h.Fire(E::kDrained, "b");
  CHECK(s.action == A::kRelease);
  s = h.Fire(E::kReleased, "b");
  CheckStep(s, A::kGrant, "a");
}

}  // namespace
}  // namespace wsup
