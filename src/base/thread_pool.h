// Parallel loops for the element-wise and attention work that oneDNN does not do. They run on
// OpenMP's threads, the team oneDNN's GEMMs run on: a second set of threads would fight OpenMP's
// for the cores, since OpenMP's threads spin for a while after each region before they sleep.
#pragma once

#include <cstdint>
#include <functional>

namespace moe {

class ThreadPool {
 public:
  explicit ThreadPool(int num_threads) : num_threads_(num_threads < 1 ? 1 : num_threads) {}

  int num_threads() const { return num_threads_; }

  // Splits [0, n) into contiguous ranges, one per thread (n * i / threads ..), and runs
  // fn(begin, end) on each; the caller's thread takes the first. Returns when all are done. Called
  // from inside another parallel loop, it runs every range on the calling thread.
  void ParallelFor(int64_t n, const std::function<void(int64_t, int64_t)>& fn) const;

  // Runs fn(i) for every i in [0, n), each thread taking the next index as soon as it is free, in
  // increasing order: for items of uneven cost, or when the cores' speeds vary (a shared machine),
  // where fixed ranges leave threads waiting. Nested, like ParallelFor, it runs on the caller.
  void ParallelForEach(int64_t n, const std::function<void(int64_t)>& fn) const;

  // Runs fn(begin, end) over ranges that cover [0, n), each thread claiming the next range as soon
  // as it is free, each range what is left over twice the threads, at least min_range: long ranges
  // to stream from while much is left, short ones at the end, so that a core that runs slower than
  // the others (a shared machine) leaves them little to wait for. Nested, or on one thread, it runs
  // fn(0, n) on the caller.
  void ParallelForShrinking(int64_t n, int64_t min_range, const std::function<void(int64_t, int64_t)>& fn) const;

 private:
  int num_threads_;
};

// The process-wide pool, sized by MOE_NUM_THREADS or the hardware's thread count.
const ThreadPool& DefaultThreadPool();

inline void ParallelFor(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  DefaultThreadPool().ParallelFor(n, fn);
}

inline void ParallelForEach(int64_t n, const std::function<void(int64_t)>& fn) {
  DefaultThreadPool().ParallelForEach(n, fn);
}

inline void ParallelForShrinking(int64_t n, int64_t min_range, const std::function<void(int64_t, int64_t)>& fn) {
  DefaultThreadPool().ParallelForShrinking(n, min_range, fn);
}

}  // namespace moe
