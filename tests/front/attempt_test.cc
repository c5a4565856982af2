// An attempt's claim on an engine's in-flight count (front/attempt.h): taken
// once, given back once, whatever way the attempt ends. No connection is
// involved: the count is what status reports and what keeps a Backend alive.
#include <catch2/catch.hpp>

#include <utility>
#include <vector>

#include "front/attempt.h"

using wsup::front::Attempt;
using wsup::front::Backend;

TEST_CASE("front attempt: the claim is taken when made and given back when the answer completes", "[front][attempt]") {
  Backend b;
  Attempt a(&b);
  CHECK(b.inflight == 1);
  CHECK(a.backend() == &b);
  CHECK(a.Complete() == &b);
  CHECK(b.inflight == 0);
  CHECK_FALSE(a);
  CHECK(a.Complete() == nullptr);  // a second end gives nothing back
  a.Cancel();
  CHECK(b.inflight == 0);
}

TEST_CASE("front attempt: a failed attempt gives its claim back once, the destructor adds nothing", "[front][attempt]") {
  Backend b;
  {
    Attempt a(&b);
    Attempt other(&b);
    CHECK(b.inflight == 2);
    Backend* failed = a.Complete();  // the engine failed: the call judges `failed` after
    CHECK(failed == &b);
    CHECK(b.inflight == 1);
  }
  CHECK(b.inflight == 0);
}

TEST_CASE("front attempt: a destroyed attempt gives its claim back", "[front][attempt]") {
  Backend b;
  { Attempt a(&b); }
  CHECK(b.inflight == 0);
  Attempt none;
  CHECK_FALSE(none);
  none.Cancel();
  CHECK(b.inflight == 0);
}

TEST_CASE("front attempt: the hedge that wins replaces the attempt it raced, the loser is cancelled", "[front][attempt][hedge]") {
  Backend active, standby;
  Attempt call(&active);
  Attempt hedge(&standby);
  CHECK(active.inflight == 1);
  CHECK(standby.inflight == 1);
  SECTION("the standby wins: the active's claim ends, the standby's moves to the call") {
    call = std::move(hedge);
    CHECK(active.inflight == 0);
    CHECK(standby.inflight == 1);
    CHECK(call.backend() == &standby);
    CHECK_FALSE(hedge);  // NOLINT(bugprone-use-after-move): a moved-from attempt is empty by contract
    hedge.Cancel();      // NOLINT(bugprone-use-after-move)
    CHECK(standby.inflight == 1);
    call.Complete();
    CHECK(standby.inflight == 0);
  }
  SECTION("the active wins: the hedge is cancelled") {
    hedge.Cancel();
    CHECK(standby.inflight == 0);
    CHECK(active.inflight == 1);
    call.Complete();
    CHECK(active.inflight == 0);
  }
}

TEST_CASE("front attempt: moves carry the claim without counting it again", "[front][attempt]") {
  Backend b;
  Attempt a(&b);
  Attempt moved(std::move(a));
  CHECK(b.inflight == 1);
  CHECK_FALSE(a);  // NOLINT(bugprone-use-after-move): a moved-from attempt is empty by contract
  Attempt& alias = moved;
  moved = std::move(alias);  // onto itself: nothing changes
  CHECK(b.inflight == 1);
  CHECK(moved.backend() == &b);
  std::vector<Attempt> many;
  for (int i = 0; i < 20; ++i) many.emplace_back(&b);  // reallocations move them
  CHECK(b.inflight == 21);
  many.erase(many.begin(), many.begin() + 5);
  CHECK(b.inflight == 16);
  many.clear();
  CHECK(b.inflight == 1);
  moved = Attempt();
  CHECK(b.inflight == 0);
}
