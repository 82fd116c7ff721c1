// The loader's worker pool: every index runs once, the error of the lowest failing index is the
// one rethrown, and the pool is reusable after an error.
#include "trainer/data/worker_pool.h"

#include <atomic>
#include <stdexcept>
#include <string>

#include <gtest/gtest.h>

namespace ferry {
namespace {

TEST(WorkerPool, RunsEveryIndexOnceWithAnyNumberOfWorkers) {
  for (int workers : {1, 2, 4}) {
    WorkerPool pool(workers);
    EXPECT_EQ(pool.workers(), workers);
    for (int64_t n : {0, 1, 3, 1000}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      pool.run(n, [&](int64_t i) { hits[static_cast<size_t>(i)].fetch_add(1); });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << i;
    }
  }
}

TEST(WorkerPool, RethrowsTheLowestFailingIndexAndStaysUsable) {
  WorkerPool pool(3);
  for (int trial = 0; trial < 20; ++trial) {
    try {
      pool.run(200, [](int64_t i) {
        if (i == 150 || i == 37 || i == 90) throw std::runtime_error(std::to_string(i));
      });
      FAIL() << "no error";
    } catch (const std::runtime_error& e) {
      EXPECT_STREQ(e.what(), "37");
    }
    std::atomic<int64_t> sum{0};
    pool.run(100, [&](int64_t i) { sum += i; });
    EXPECT_EQ(sum.load(), 4950);
  }
}

}  // namespace
}  // namespace ferry
