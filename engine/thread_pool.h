// ThreadPool: a fixed set of worker threads that run one parallel loop at a
// time, with the calling thread taking part. The CPU kernels split their
// rows over it; each tensor-parallel rank owns one pool (sized so that all
// ranks together use about the CPUs the process may run on).
//
// Ownership: the pool owns its threads; the destructor stops and joins them.
// Threads: ParallelFor() is called by one thread at a time (the rank's
// thread); the task function runs on that thread and on the workers.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace wsup::engine {

class ThreadPool {
 public:
  // `threads` counts the caller: 1 means no workers (everything inline).
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs fn(i) for every i in [0, n), spread over the pool; returns when all
  // have run. fn must not throw.
  void ParallelFor(int64_t n, const std::function<void(int64_t)>& fn);

  // Threads a default pool gets: the CPUs this process may run on (its
  // affinity, common/cpus.h) / ranks, at least 1.
  static int DefaultThreads(int ranks);

 private:
  void WorkerLoop();
  void RunTasks();

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  const std::function<void(int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  int64_t next_ = 0;      // next task index to claim (under mu_)
  int64_t finished_ = 0;  // tasks done (under mu_)
  uint64_t generation_ = 0;
  bool stop_ = false;
};

}  // namespace wsup::engine
