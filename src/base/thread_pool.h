// A fixed pool of worker threads for the element-wise and attention work that oneDNN does not do.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace moe {

class ThreadPool {
 public:
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Splits [0, n) into contiguous ranges and runs fn(begin, end) on each; the caller's thread
  // takes a share. Returns when all ranges are done. Not reentrant.
  void ParallelFor(int64_t n, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void WorkerLoop(int index);

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable work_ready_;
  std::condition_variable work_done_;
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t n_ = 0;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
};

// The process-wide pool, sized by MOE_NUM_THREADS or the hardware's thread count.
ThreadPool& DefaultThreadPool();

inline void ParallelFor(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  DefaultThreadPool().ParallelFor(n, fn);
}

}  // namespace moe
