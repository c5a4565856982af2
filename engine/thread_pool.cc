#include "engine/thread_pool.h"

#include <algorithm>

#include "common/cpus.h"

namespace wsup::engine {

ThreadPool::ThreadPool(int threads) {
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

int ThreadPool::DefaultThreads(int ranks) {
  return std::max(1, UsableCpus() / std::max(1, ranks));
}

void ThreadPool::ParallelFor(int64_t n, const std::function<void(int64_t)>& fn) {
  if (n <= 0) return;
  if (workers_.empty() || n == 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    fn_ = &fn;
    n_ = n;
    next_ = 0;
    finished_ = 0;
    ++generation_;
  }
  work_cv_.notify_all();
  RunTasks();
  std::unique_lock<std::mutex> lk(mu_);
  done_cv_.wait(lk, [&] { return finished_ == n_; });
  fn_ = nullptr;
}

// Claims tasks one at a time; tasks are coarse (a block of rows), so the
// lock is not where the time goes.
void ThreadPool::RunTasks() {
  for (;;) {
    int64_t i;
    const std::function<void(int64_t)>* fn;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (!fn_ || next_ >= n_) return;
      i = next_++;
      fn = fn_;
    }
    (*fn)(i);
    bool all_done;
    {
      std::lock_guard<std::mutex> lk(mu_);
      all_done = ++finished_ == n_;
    }
    if (all_done) done_cv_.notify_all();
  }
}

void ThreadPool::WorkerLoop() {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lk(mu_);
      work_cv_.wait(lk, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    RunTasks();
  }
}

}  // namespace wsup::engine
