#include "common/process_stats.h"

#include <fcntl.h>
#include <unistd.h>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace pscluster {
namespace {

TEST(ProcessStatsTest, ReadsThisProcess) {
  absl::StatusOr<ProcessStats> before = ReadProcessStats();
  ASSERT_TRUE(before.ok()) << before.status();
  const int fd = open("/dev/null", O_RDONLY);
  ASSERT_GE(fd, 0);
  volatile double sink = 0;
  for (int i = 0; i < 20'000'000; ++i) sink = sink + i;  // some CPU time to count
  absl::StatusOr<ProcessStats> after = ReadProcessStats();
  close(fd);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->open_fds, before->open_fds + 1);
  EXPECT_GE(after->max_fds, after->open_fds);
  EXPECT_GE(after->cpu_seconds, before->cpu_seconds);
  EXPECT_GT(after->resident_bytes, 0u);
  EXPECT_GE(after->virtual_bytes, after->resident_bytes);
  const double now = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  EXPECT_LE(after->start_time_seconds, now + 1);  // a clock tick's rounding
  EXPECT_GT(after->start_time_seconds, now - 3600);
}

TEST(ProcessStatsTest, ACommandWithSpacesAndParenthesesIsSkippedWhole) {
  EXPECT_EQ(StatFieldsAfterCommand("42 (a) (b c)) S 1 42 42"), "S 1 42 42");
  EXPECT_EQ(StatFieldsAfterCommand("42 (ps_worker) R 1"), "R 1");
  EXPECT_EQ(StatFieldsAfterCommand("no command"), "");
  EXPECT_EQ(StatFieldsAfterCommand("42 (x)"), "");
}

}  // namespace
}  // namespace pscluster
