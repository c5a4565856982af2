// Signals (signals.h).
#include "common/signals.h"

#include <memory>
#include <utility>

namespace wsup {

// A watcher and its handler, freed by its close callback. `closed` is shared
// by the watchers of one Close() and runs its `done` after the last.
struct Signals::Watch {
  uv_signal_t handle{};
  Handler handler;
  struct Closing {
    size_t left = 0;
    std::function<void()> done;
  };
  std::shared_ptr<Closing> closing;
};

void Signals::On(int signum, Handler handler) {
  auto* w = new Watch;
  w->handler = std::move(handler);
  uv_signal_init(loop_, &w->handle);
  w->handle.data = w;
  uv_signal_start(&w->handle, [](uv_signal_t* h, int sig) { static_cast<Watch*>(h->data)->handler(sig); }, signum);
  watches_.push_back(w);
}

void Signals::Stop() {
  for (Watch* w : watches_) uv_signal_stop(&w->handle);
}

void Signals::Close(std::function<void()> done) {
  if (watches_.empty()) {
    if (done) done();
    return;
  }
  auto closing = std::make_shared<Watch::Closing>();
  closing->left = watches_.size();
  closing->done = std::move(done);
  for (Watch* w : watches_) {
    w->closing = closing;
    uv_close(reinterpret_cast<uv_handle_t*>(&w->handle), [](uv_handle_t* h) {
      std::unique_ptr<Watch> w(static_cast<Watch*>(h->data));
      std::shared_ptr<Watch::Closing> c = std::move(w->closing);
      if (--c->left == 0 && c->done) c->done();
    });
  }
  watches_.clear();
}

}  // namespace wsup
