#include "supervisor/node_stop.h"

#include <utility>

#include "common/log.h"

namespace wsup {

NodeStop::NodeStop(TimerSource& timers, Hooks hooks) : hooks_(std::move(hooks)), later_(timers) {}

void NodeStop::Begin(const std::string& why, int exit_code) {
  if (stopping_) return;
  stopping_ = true;
  exit_code_ = exit_code;
  spdlog::info("stopping: {}", why);
  hooks_.stop_children(why);
  MaybeFinish();
}

void NodeStop::ChildExited() { MaybeFinish(); }

void NodeStop::OnStopped(std::function<void()> answer) {
  if (finishing_) {
    answer();
    return;
  }
  waiters_.push_back(std::move(answer));
}

void NodeStop::MaybeFinish() {
  if (!stopping_ || finishing_ || hooks_.any_process()) return;
  finishing_ = true;
  hooks_.remove_state();
  // Moved out first: an answer may add another.
  std::vector<std::function<void()>> waiters;
  waiters.swap(waiters_);
  for (auto& w : waiters) w();
  later_.After(kFlushMs, [this] {
    hooks_.close();
    finished_ = true;
  });
}

}  // namespace wsup
