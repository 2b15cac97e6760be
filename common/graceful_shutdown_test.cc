#include "common/graceful_shutdown.h"

#include <thread>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace pscluster {
namespace {

TEST(InFlightCounterTest, IdleCounterReturnsAtOnce) {
  InFlightCounter c;
  EXPECT_TRUE(c.WaitIdle(absl::Now()));
}

TEST(InFlightCounterTest, WaitTimesOutWhileAHandlerRuns) {
  InFlightCounter c;
  InFlightCounter::Scope scope(&c);
  EXPECT_EQ(c.count(), 1);
  EXPECT_FALSE(c.WaitIdle(absl::Now() + absl::Milliseconds(10)));
}

TEST(InFlightCounterTest, WaitReturnsWhenTheLastHandlerEnds) {
  InFlightCounter c;
  absl::Notification entered, release;
  std::thread handler([&] {
    InFlightCounter::Scope scope(&c);
    entered.Notify();
    release.WaitForNotification();
  });
  entered.WaitForNotification();
  release.Notify();
  EXPECT_TRUE(c.WaitIdle(absl::Now() + absl::Seconds(30)));
  handler.join();
  EXPECT_EQ(c.count(), 0);
}

}  // namespace
}  // namespace pscluster
