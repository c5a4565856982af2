#include "front/worker.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

namespace wsup::front {

Worker::Worker(int index, const http::ServerOptions& server, const ProxyOptions& proxy, FrontShared* shared,
               Proxy::EventSink events)
    : index_(index) {
  uv_loop_init(&loop_);
  mailbox_ = std::make_unique<http::Mailbox>(&loop_);
  proxy_ = std::make_unique<Proxy>(&loop_, proxy, std::move(events), shared);
  server_ = std::make_unique<http::HttpServer>(
      &loop_, server, [this](std::shared_ptr<http::ResponseWriter> w) { proxy_->Handle(std::move(w)); });
  uv_timer_init(&loop_, &drain_timer_);
  drain_timer_.data = this;
}

Worker::~Worker() {
  if (thread_.joinable()) {
    spdlog::error("front: loop {} destroyed while running; Stop() and Exit() it first", index_);
    thread_.join();
  }
}

void Worker::Start() {
  thread_ = std::thread([this] {
    uv_run(&loop_, UV_RUN_DEFAULT);
    if (int rc = uv_loop_close(&loop_); rc != 0) {
      spdlog::error("front: loop {} ended with handles open ({})", index_, uv_strerror(rc));
    }
  });
}

bool Worker::Post(std::function<void(Worker&)> fn) {
  return mailbox_->Post([this, fn = std::move(fn)] { fn(*this); });
}

void Worker::TakeConnection(int fd) {
  if (!Post([fd](Worker& w) { w.server().AdoptConnection(fd); })) ::close(fd);
}

void Worker::Stop(int64_t drain_ms, PostToMain post_main, std::function<void()> stopped) {
  if (stopping_) return;
  stopping_ = true;
  post_main_ = std::move(post_main);
  stopped_ = std::move(stopped);
  if (proxy_->call_count() == 0 || drain_ms <= 0) {
    CloseParts();
    return;
  }
  drain_deadline_ms_ = static_cast<int64_t>(uv_now(&loop_)) + drain_ms;
  uv_timer_start(
      &drain_timer_,
      [](uv_timer_t* t) {
        auto* self = static_cast<Worker*>(t->data);
        if (self->proxy_->call_count() == 0 ||
            static_cast<int64_t>(uv_now(&self->loop_)) >= self->drain_deadline_ms_) {
          uv_timer_stop(t);
          self->CloseParts();
        }
      },
      20, 20);
}

void Worker::CloseParts() {
  open_parts_ = 3;
  // Clients first (their calls end), then the engines' side.
  server_->Close([this] { PartClosed(); });
  proxy_->Close([this] { PartClosed(); });
  uv_close(reinterpret_cast<uv_handle_t*>(&drain_timer_),
           [](uv_handle_t* h) { static_cast<Worker*>(h->data)->PartClosed(); });
}

void Worker::PartClosed() {
  if (--open_parts_ != 0) return;
  if (!post_main_ || !post_main_(std::move(stopped_)))
    spdlog::error("front: loop {} stopped unheard", index_);
}

void Worker::Exit() {
  Post([](Worker& w) { w.mailbox_->Close(); });
  if (thread_.joinable()) thread_.join();
}

}  // namespace wsup::front
