#include "common/parking.h"

#include <memory>

#include "common/parking_testing.h"
#include "gtest/gtest.h"

namespace pscluster {
namespace {

using testing::CountingWaiter;

TEST(WaitersTest, WakesOnlyTheReadyOnesAndForgetsThem) {
  Waiters<int> waiters;
  auto early = std::make_shared<CountingWaiter>();
  auto late = std::make_shared<CountingWaiter>();
  waiters.Park(1, early);
  waiters.Park(5, late);
  waiters.WakeReady([](int step) { return step <= 3; });
  EXPECT_EQ(early->wakes, 1);
  EXPECT_EQ(late->wakes, 0);
  EXPECT_EQ(waiters.size(), 1u);
  waiters.WakeReady([](int step) { return step <= 3; });
  EXPECT_EQ(early->wakes, 1) << "a woken waiter was woken again";
  waiters.WakeAll(absl::UnavailableError("shut down"));
  EXPECT_EQ(late->wakes, 1);
  EXPECT_EQ(late->last.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(waiters.size(), 0u);
}

// A call that answered (its deadline came) or ended (its waiter is gone) no longer counts,
// even before the next wake-up forgets it: the count is what callers still wait on.
TEST(WaitersTest, CountsNeitherAnsweredNorEndedCalls) {
  Waiters<int> waiters;
  auto answered = std::make_shared<CountingWaiter>();
  auto waiting = std::make_shared<CountingWaiter>();
  auto ended = std::make_shared<CountingWaiter>();
  waiters.Park(1, answered);
  waiters.Park(1, waiting);
  waiters.Park(1, ended);
  EXPECT_EQ(waiters.size(), 3u);
  answered->answered = true;
  ended.reset();
  EXPECT_EQ(waiters.size(), 1u);
  waiters.WakeAll(absl::OkStatus());
  EXPECT_EQ(waiting->wakes, 1);
}

}  // namespace
}  // namespace pscluster
