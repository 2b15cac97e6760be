#include "common/executor.h"

#include <atomic>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

namespace pscluster {
namespace {

TEST(ExecutorTest, RunsEveryIndexOnceAndReturnsTheFirstErrorInIndexOrder) {
  Executor pool(3);
  for (int n : {0, 1, 2, 7, 100}) {
    std::vector<std::atomic<int>> runs(n);
    absl::Status s = pool.ParallelFor(n, [&](int i) {
      runs[i]++;
      return i % 5 == 3 ? absl::InternalError(absl::StrCat("item ", i)) : absl::OkStatus();
    });
    for (int i = 0; i < n; ++i) EXPECT_EQ(runs[i], 1) << "n " << n << " item " << i;
    if (n > 3) {
      EXPECT_EQ(s.message(), "item 3");
    } else {
      EXPECT_TRUE(s.ok()) << s;
    }
  }
}

TEST(ExecutorTest, ItemsRunConcurrently) {
  Executor pool(3);
  // Every item waits for all four to have started: only concurrent execution finishes.
  absl::Mutex mu;
  int started = 0;
  EXPECT_TRUE(pool.ParallelFor(4,
                               [&](int) {
                                 absl::MutexLock lock(&mu);
                                 ++started;
                                 mu.Await(absl::Condition(
                                     +[](int* n) { return *n == 4; }, &started));
                                 return absl::OkStatus();
                               })
                  .ok());
}

TEST(ExecutorTest, NestedFanOutOnAFullPoolDoesNotDeadlock) {
  Executor pool(2);
  std::atomic<int> inner{0};
  EXPECT_TRUE(pool.ParallelFor(6,
                               [&](int) {
                                 return pool.ParallelFor(5, [&](int) {
                                   inner++;
                                   return absl::OkStatus();
                                 });
                               })
                  .ok());
  EXPECT_EQ(inner, 30);
}

TEST(ExecutorTest, APoolWithoutThreadsRunsOnTheCaller) {
  Executor pool(0);
  int sum = 0;
  EXPECT_TRUE(pool.ParallelFor(4,
                               [&](int i) {
                                 sum += i;
                                 return absl::OkStatus();
                               })
                  .ok());
  EXPECT_EQ(sum, 6);
}

}  // namespace
}  // namespace pscluster
