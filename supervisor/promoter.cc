#include "supervisor/promoter.h"

#include <utility>

namespace wsup {

Promoter::Promoter(Hooks hooks) : hooks_(std::move(hooks)) {}

void Promoter::Hold(const std::function<void()>& moves) {
  ++holds_;
  moves();
  --holds_;
}

bool Promoter::Promote(const std::string& slot, const std::string& cause, std::string* unfit, std::string* note) {
  bool promoted = false;
  Hold([&] { promoted = hooks_.promote(slot, cause, unfit, note); });
  return promoted;
}

void Promoter::RoutesChanged() {
  if (!held()) hooks_.push_routes();
}

void Promoter::MaybePromote() {
  if (hooks_.stopping() || adopting_ || held() || hooks_.has_active()) return;
  for (const std::string& slot : hooks_.standbys()) {
    if (!Promote(slot, "no active engine", nullptr)) continue;
    hooks_.push_routes();
    hooks_.promoted(slot);
    return;
  }
}

}  // namespace wsup
