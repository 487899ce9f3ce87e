#include "base/thread_pool.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <thread>

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
