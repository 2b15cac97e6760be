#include "common/backoff.h"

#include <vector>

#include "gtest/gtest.h"

namespace pscluster {
namespace {

TEST(BackoffTest, EachDelayLiesInTheUpperHalfOfADoublingCappedCeiling) {
  Backoff b(absl::Milliseconds(100), absl::Seconds(1), /*seed=*/7);
  absl::Duration ceiling = absl::Milliseconds(100);
  for (int i = 0; i < 12; ++i) {
    ASSERT_EQ(b.ceiling(), ceiling) << "try " << i;
    const absl::Duration d = b.Next();
    EXPECT_GE(d, ceiling / 2) << "try " << i;
    EXPECT_LE(d, ceiling) << "try " << i;
    ceiling = std::min(ceiling * 2, absl::Seconds(1));
  }
}

// What jitter is for: members that lost the same server at the same instant do not retry in
// lockstep (before, every member slept 100, 200, 400 ms ... exactly).
TEST(BackoffTest, TwoMembersDoNotRetryInLockstep) {
  Backoff a(absl::Milliseconds(100), absl::Seconds(1), /*seed=*/1);
  Backoff b(absl::Milliseconds(100), absl::Seconds(1), /*seed=*/2);
  int same = 0;
  for (int i = 0; i < 8; ++i) same += a.Next() == b.Next();
  EXPECT_EQ(same, 0);
}

TEST(BackoffTest, TheSameSeedGivesTheSameDelays) {
  Backoff a(absl::Milliseconds(1), absl::Milliseconds(50), 3),
      b(absl::Milliseconds(1), absl::Milliseconds(50), 3);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(a.Next(), b.Next());
}

}  // namespace
}  // namespace pscluster
