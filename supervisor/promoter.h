// Promoter: when the front is told the routes, and who is made active when
// no engine is.
//
// A move of two slots (a swap, a failover's demotion and promotion, an
// adopted engine taking back its role) runs inside Hold(): a route change
// inside it pushes nothing, and the front gets the routes once, after the
// last move, never an in-between pair. While a hold is open, or the node
// adopts its engines, no engine is promoted by MaybePromote(): the moves in
// progress decide the roles.
//
// MaybePromote() covers what no failover does: the first proven engine at
// start, and the standby re-armed after a failover that had none. It tries
// each standby slot in order until one is promoted, pushes the routes, and
// tells Hooks::promoted.
//
// The engines and the front are reached through Hooks, so every rule is
// tested on fakes (tests/supervisor_core/promoter_test.cc).
//
// Threads: the loop thread only.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace wsup {

class Promoter {
 public:
  struct Hooks {
    std::function<bool()> stopping;
    std::function<bool()> has_active;
    // The slots in the standby state, in the node's order.
    std::function<std::vector<std::string>()> standbys;
    // Promotes `slot` (false, with `unfit` said, when it may not take the
    // traffic; `note` says what its pool grant did).
    std::function<bool(const std::string& slot, const std::string& cause, std::string* unfit, std::string* note)>
        promote;
    // Gives the front the routes the engines' roles call for.
    std::function<void()> push_routes;
    // `slot` was made active by MaybePromote().
    std::function<void(const std::string& slot)> promoted;
  };

  explicit Promoter(Hooks hooks);

  // Runs `moves` with the routes held. Holds nest; the caller pushes the
  // routes after the outermost one when they changed (PushRoutes()).
  void Hold(const std::function<void()>& moves);
  bool held() const { return holds_ > 0; }
  // Promote `slot` inside a hold.
  bool Promote(const std::string& slot, const std::string& cause, std::string* unfit, std::string* note = nullptr);
  // Adopted engines are taking their roles: nothing is promoted meanwhile.
  void SetAdopting(bool adopting) { adopting_ = adopting; }

  // The roles changed: the front is told now, unless a hold is open.
  void RoutesChanged();
  void PushRoutes() { hooks_.push_routes(); }
  // With no active engine, promotes the first standby that may serve.
  void MaybePromote();

 private:
  Hooks hooks_;
  int holds_ = 0;
  bool adopting_ = false;
};

}  // namespace wsup
