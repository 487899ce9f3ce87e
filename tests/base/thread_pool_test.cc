#include "base/thread_pool.h"

#include <atomic>
#include <vector>

#include <gtest/gtest.h>

namespace moe {
namespace {

TEST(ThreadPoolTest, CoversEveryIndexExactlyOnce) {
  ThreadPool pool(4);
  for (int64_t n : {0, 1, 3, 4, 5, 1000}) {
    std::vector<std::atomic<int>> hits(n);
    pool.ParallelFor(n, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) hits[i]++;
    });
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hits[i].load(), 1) << "n=" << n << " i=" << i;
  }
}

TEST(ThreadPoolTest, ANestedLoopRunsWholeOnItsThread) {
  ThreadPool pool(2);
  std::vector<std::atomic<int>> hits(2 * 100);
  pool.ParallelFor(2, [&](int64_t outer_begin, int64_t outer_end) {
    for (int64_t o = outer_begin; o < outer_end; ++o) {
      pool.ParallelFor(100, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) hits[o * 100 + i]++;
      });
    }
  });
  for (size_t i = 0; i < hits.size(); ++i) EXPECT_EQ(hits[i].load(), 1) << i;
}

TEST(ThreadPoolTest, RunsManyRoundsInARow) {
  ThreadPool pool(3);
  std::atomic<int64_t> sum = 0;
  for (int round = 0; round < 200; ++round) {
    pool.ParallelFor(10, [&](int64_t begin, int64_t end) { sum += end - begin; });
  }
  EXPECT_EQ(sum.load(), 2000);
}

TEST(ThreadPoolTest, ForEachRunsEveryIndexExactlyOnce) {
  ThreadPool pool(3);
  for (int64_t n : {0, 1, 2, 3, 7, 1000}) {
    std::vector<std::atomic<int>> hits(n);
    pool.ParallelForEach(n, [&](int64_t i) { hits[i]++; });
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hits[i].load(), 1) << "n=" << n << " i=" << i;
  }
}

TEST(ThreadPoolTest, ForEachHandsOutWorkToWhicheverThreadIsFree) {
  // Item 0 blocks its thread until every other item has run: fixed halves would leave item 1 to
  // that same thread and never finish; handed out one at a time, the other thread takes them all.
  ThreadPool pool(2);
  constexpr int64_t kItems = 8;
  std::atomic<int64_t> done = 0;
  pool.ParallelForEach(kItems, [&](int64_t i) {
    if (i == 0) {
      while (done.load() < kItems - 1) {
      }
    }
    ++done;
  });
  EXPECT_EQ(done.load(), kItems);
}

TEST(ThreadPoolTest, ANestedForEachRunsWholeOnItsThread) {
  ThreadPool pool(2);
  std::vector<std::atomic<int>> hits(2 * 50);
  pool.ParallelFor(2, [&](int64_t outer_begin, int64_t outer_end) {
    for (int64_t o = outer_begin; o < outer_end; ++o) pool.ParallelForEach(50, [&](int64_t i) { hits[o * 50 + i]++; });
  });
  for (size_t i = 0; i < hits.size(); ++i) EXPECT_EQ(hits[i].load(), 1) << i;
}

TEST(ThreadPoolTest, ShrinkingRangesCoverEveryIndexOnceAndKeepTheirMinimum) {
  ThreadPool pool(3);
  for (int64_t n : {0, 1, 4, 5, 37, 1000}) {
    for (int64_t min_range : {1, 4, 64}) {
      std::vector<std::atomic<int>> hits(n);
      std::atomic<int64_t> short_ranges = 0;
      pool.ParallelForShrinking(n, min_range, [&](int64_t begin, int64_t end) {
        if (end - begin < min_range && end != n) ++short_ranges;  // only the last may be short
        for (int64_t i = begin; i < end; ++i) hits[i]++;
      });
      for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hits[i].load(), 1) << "n=" << n << " i=" << i;
      EXPECT_EQ(short_ranges.load(), 0) << "n=" << n << " min_range=" << min_range;
    }
  }
}

TEST(ThreadPoolTest, ShrinkingRangesGoToWhicheverThreadIsFree) {
  // The first range blocks its thread until the rest of the work has run: the other thread must
  // claim it all.
  ThreadPool pool(2);
  constexpr int64_t kN = 64;
  std::atomic<int64_t> done = 0;
  pool.ParallelForShrinking(kN, 1, [&](int64_t begin, int64_t end) {
    if (begin == 0) {
      while (done.load() < kN - end) {
      }
    }
    done += end - begin;
  });
  EXPECT_EQ(done.load(), kN);
}

TEST(ThreadPoolTest, ANestedShrinkingLoopRunsAsOneRangeOnItsThread) {
  ThreadPool pool(2);
  std::atomic<int> calls = 0;
  pool.ParallelFor(2, [&](int64_t outer_begin, int64_t outer_end) {
    for (int64_t o = outer_begin; o < outer_end; ++o) {
      pool.ParallelForShrinking(50, 4, [&](int64_t begin, int64_t end) {
        EXPECT_EQ(begin, 0);
        EXPECT_EQ(end, 50);
        ++calls;
      });
    }
  });
  EXPECT_EQ(calls.load(), 2);
}

}  // namespace
}  // namespace moe
