#include "worker/modes/recent_rate.h"

#include "gtest/gtest.h"

namespace pscluster::modes {
namespace {

const absl::Time kStart = absl::FromUnixSeconds(1000);

TEST(RecentRateTest, NothingBeforeTwoPoints) {
  RecentRate rate;
  EXPECT_EQ(rate.PerSecond(), 0);
  rate.Add(kStart, 0);
  EXPECT_EQ(rate.PerSecond(), 0);
}

TEST(RecentRateTest, ASteadyRunReportsItsRate) {
  RecentRate rate(absl::Seconds(30));
  rate.Add(kStart, 0);
  for (int s = 1; s <= 60; ++s) rate.Add(kStart + absl::Seconds(s), 3600);
  EXPECT_DOUBLE_EQ(rate.PerSecond(), 3600);
}

// An outage weighs on the rate while it is in the window, then not at all (an average since
// the start still said 2,400 samples/s a minute after it).
TEST(RecentRateTest, AStallIsForgottenOnceItLeavesTheWindow) {
  RecentRate rate(absl::Seconds(30));
  rate.Add(kStart, 0);
  for (int s = 1; s <= 60; ++s) rate.Add(kStart + absl::Seconds(s), 3600);
  rate.Add(kStart + absl::Seconds(120), 0);  // a minute without a step
  for (int s = 121; s <= 130; ++s) rate.Add(kStart + absl::Seconds(s), 3600);
  EXPECT_LT(rate.PerSecond(), 3600.0 * 10 / 30);  // 10 s of training in a window of 70
  for (int s = 131; s <= 160; ++s) rate.Add(kStart + absl::Seconds(s), 3600);
  EXPECT_DOUBLE_EQ(rate.PerSecond(), 3600);
}

TEST(RecentRateTest, PausedTimeIsNotTrainingTime) {
  RecentRate rate(absl::Seconds(30));
  rate.Add(kStart, 0);
  rate.Add(kStart + absl::Seconds(10), 1000, absl::Seconds(5));  // 5 s of it evaluating
  EXPECT_DOUBLE_EQ(rate.PerSecond(), 200);
}

}  // namespace
}  // namespace pscluster::modes
