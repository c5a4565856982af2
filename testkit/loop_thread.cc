#include "testkit/loop_thread.h"

#include <future>

namespace wsup::test {

LoopThread::LoopThread() {
  uv_loop_init(&loop_);
  uv_async_init(&loop_, &async_, [](uv_async_t* a) { static_cast<LoopThread*>(a->data)->Drain(); });
  async_.data = this;
  thread_ = std::thread([this] { uv_run(&loop_, UV_RUN_DEFAULT); });
}

LoopThread::~LoopThread() {
  Do([this] { uv_close(reinterpret_cast<uv_handle_t*>(&async_), nullptr); });
  thread_.join();
  uv_loop_close(&loop_);
}

void LoopThread::Do(std::function<void()> fn) {
  std::promise<void> done;
  {
    std::lock_guard<std::mutex> lk(mu_);
    tasks_.push_back([&] {
      fn();
      done.set_value();
    });
  }
  uv_async_send(&async_);
  done.get_future().wait();
}

void LoopThread::Drain() {
  std::deque<std::function<void()>> tasks;
  {
    std::lock_guard<std::mutex> lk(mu_);
    tasks.swap(tasks_);
  }
  for (auto& t : tasks) t();
}

}  // namespace wsup::test
