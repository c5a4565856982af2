// Promoter (supervisor/promoter.h) on its own: the engines' roles and the
// front behind its hooks. Each test checks what was promoted, and when and
// how often the front was given its routes.
#include <catch2/catch.hpp>

#include <set>
#include <string>
#include <vector>

#include "supervisor/promoter.h"

namespace wsup {
namespace {

struct PromoterRig {
  bool stopping = false;
  std::string active;
  std::vector<std::string> standbys = {"a", "b"};
  std::set<std::string> unfit;  // refuse the promotion
  std::vector<std::string> did;  // "promote a: cause", "refused a", "routes", "promoted a"
  Promoter promoter{MakeHooks()};

  Promoter::Hooks MakeHooks() {
    Promoter::Hooks h;
    h.stopping = [this] { return stopping; };
    h.has_active = [this] { return !active.empty(); };
    h.standbys = [this] { return standbys; };
    h.promote = [this](const std::string& slot, const std::string& cause, std::string* why, std::string*) {
      if (unfit.count(slot) != 0) {
        if (why) *why = "its probe is old";
        did.push_back("refused " + slot);
        return false;
      }
      did.push_back("promote " + slot + ": " + cause);
      active = slot;
      // The move itself changes the routes: held, the front is told once, after.
      promoter.RoutesChanged();
      promoter.MaybePromote();
      return true;
    };
    h.push_routes = [this] { did.push_back("routes"); };
    h.promoted = [this](const std::string& slot) { did.push_back("promoted " + slot); };
    return h;
  }
};

TEST_CASE("promoter: with no active engine the first standby that may serve is promoted, and the front gets the "
          "routes once",
          "[supervisor][promoter]") {
  PromoterRig r;
  r.unfit = {"a"};
  r.promoter.MaybePromote();
  CHECK(r.did == std::vector<std::string>{"refused a", "promote b: no active engine", "routes", "promoted b"});
  r.did.clear();
  // An active engine: nothing to do.
  r.promoter.MaybePromote();
  CHECK(r.did.empty());
}

TEST_CASE("promoter: nothing is promoted while a hold is open, the node adopts, or it stops", "[supervisor][promoter]") {
  PromoterRig r;
  SECTION("a hold") {
    r.promoter.Hold([&r] {
      r.promoter.MaybePromote();
      r.promoter.RoutesChanged();
      CHECK(r.promoter.held());
    });
    CHECK_FALSE(r.promoter.held());
    CHECK(r.did.empty());
    r.promoter.RoutesChanged();
    CHECK(r.did == std::vector<std::string>{"routes"});
  }
  SECTION("adopting") {
    r.promoter.SetAdopting(true);
    r.promoter.MaybePromote();
    CHECK(r.did.empty());
    r.promoter.SetAdopting(false);
    r.promoter.MaybePromote();
    CHECK(r.did.front() == "promote a: no active engine");
  }
  SECTION("stopping") {
    r.stopping = true;
    r.promoter.MaybePromote();
    CHECK(r.did.empty());
  }
  SECTION("no standby") {
    r.standbys.clear();
    r.promoter.MaybePromote();
    CHECK(r.did.empty());
  }
}

TEST_CASE("promoter: holds nest, and a swap's promotion pushes nothing by itself", "[supervisor][promoter]") {
  PromoterRig r;
  std::string why;
  r.promoter.Hold([&] {
    r.promoter.Hold([&] { r.promoter.RoutesChanged(); });
    CHECK(r.promoter.held());
    CHECK(r.promoter.Promote("b", "failover", &why));
    r.promoter.RoutesChanged();
  });
  CHECK(r.did == std::vector<std::string>{"promote b: failover"});
  r.unfit = {"a"};
  r.active.clear();
  CHECK_FALSE(r.promoter.Promote("a", "failover", &why));
  CHECK(why == "its probe is old");
  CHECK_FALSE(r.promoter.held());
}

}  // namespace
}  // namespace wsup
