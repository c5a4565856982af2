#include "http/mailbox.h"

#include <spdlog/spdlog.h>

namespace wsup::http {

Mailbox::Mailbox(uv_loop_t* loop) {
  uv_async_init(loop, &async_, [](uv_async_t* a) { static_cast<Mailbox*>(a->data)->Drain(); });
  async_.data = this;
}

Mailbox::~Mailbox() {
  if (!handle_closed_)
    spdlog::error("mailbox destroyed while open; Close() it and run its loop first");
}

bool Mailbox::Post(std::function<void()> fn) {
  // The wake-up is sent under the lock: Close() takes it before closing
  // the handle, so no send ever reaches a closed one.
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return false;
  inbox_.push_back(std::move(fn));
  uv_async_send(&async_);
  return true;
}

void Mailbox::Drain() {
  std::vector<std::function<void()>> work;
  {
    std::lock_guard<std::mutex> lock(mu_);
    work.swap(inbox_);
  }
  for (auto& fn : work) fn();
}

void Mailbox::Close(std::function<void()> done) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    closed_ = true;
  }
  done_ = std::move(done);
  // What was posted before the close still runs: uv_close drops a pending wake-up.
  Drain();
  uv_close(reinterpret_cast<uv_handle_t*>(&async_), [](uv_handle_t* h) {
    auto* self = static_cast<Mailbox*>(h->data);
    self->handle_closed_ = true;
    if (self->done_) {
      auto done = std::move(self->done_);
      self->done_ = nullptr;
      done();
    }
  });
}

}  // namespace wsup::http
