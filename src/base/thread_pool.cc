#include "base/thread_pool.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <thread>

#include "base/check.h"
#include "base/int_math.h"

namespace moe {

void ThreadPool::ParallelFor(int64_t n, const std::function<void(int64_t, int64_t)>& fn) const {
  if (n <= 0) return;
  const int shares = static_cast<int>(std::min<int64_t>(num_threads_, n));
  if (shares == 1 || omp_in_parallel()) {
    fn(0, n);
    return;
  }
#pragma omp parallel num_threads(shares)
  {
    // A team may come smaller than asked for; every range is still run.
    const int team = omp_get_num_threads();
    for (int share = omp_get_thread_num(); share < shares; share += team) {
      const int64_t begin = n * share / shares, end = n * (share + 1) / shares;
      if (begin < end) fn(begin, end);
    }
  }
}

void ThreadPool::ParallelForEach(int64_t n, const std::function<void(int64_t)>& fn) const {
  std::atomic<int64_t> next = 0;
  ParallelFor(std::min<int64_t>(num_threads_, n), [&](int64_t, int64_t) {
    for (int64_t i = next++; i < n; i = next++) fn(i);
  });
}

void ThreadPool::ParallelForShrinking(int64_t n, int64_t min_range,
                                      const std::function<void(int64_t, int64_t)>& fn) const {
  MOE_CHECK(min_range > 0, "ParallelForShrinking: min_range %lld", static_cast<long long>(min_range));
  if (n <= 0) return;
  if (num_threads_ == 1 || omp_in_parallel()) {
    fn(0, n);
    return;
  }
  std::atomic<int64_t> next = 0;
  ParallelFor(std::min<int64_t>(num_threads_, CeilDiv(n, min_range)), [&](int64_t, int64_t) {
    for (int64_t begin = next.load(std::memory_order_relaxed); begin < n;) {
      const int64_t size = std::min(n - begin, std::max(min_range, (n - begin) / (2 * num_threads_)));
      if (next.compare_exchange_weak(begin, begin + size, std::memory_order_relaxed)) {
        fn(begin, begin + size);
        begin = next.load(std::memory_order_relaxed);
      }
    }
  });
}

const ThreadPool& DefaultThreadPool() {
  static const ThreadPool pool([] {
    if (const char* env = std::getenv("MOE_NUM_THREADS")) {
      const int n = std::atoi(env);
      if (n > 0) return n;
    }
    return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  }());
  return pool;
}

}  // namespace moe
