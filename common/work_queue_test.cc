#include "common/work_queue.h"

#include <atomic>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace pscluster {
namespace {

TEST(WorkQueueTest, RunsEveryPostedItemOnAPoolThread) {
  std::atomic<int> ran{0};
  absl::Notification all;
  const std::thread::id poster = std::this_thread::get_id();
  std::atomic<bool> on_poster{false};
  {
    WorkQueue queue(2);
    for (int i = 0; i < 100; ++i) {
      queue.Post([&] {
        if (std::this_thread::get_id() == poster) on_poster = true;
        if (++ran == 100) all.Notify();
      });
    }
    ASSERT_TRUE(all.WaitForNotificationWithTimeout(absl::Seconds(30)));
  }
  EXPECT_EQ(ran, 100);
  EXPECT_FALSE(on_poster);
}

TEST(WorkQueueTest, PostNeverWaitsForTheWork) {
  // One thread, blocked in the first item: later posts still return at once.
  absl::Notification release, second_ran;
  WorkQueue queue(1);
  queue.Post([&] { release.WaitForNotification(); });
  queue.Post([&] { second_ran.Notify(); });
  EXPECT_FALSE(second_ran.HasBeenNotified());
  release.Notify();
  EXPECT_TRUE(second_ran.WaitForNotificationWithTimeout(absl::Seconds(30)));
}

TEST(WorkQueueTest, DestructorRunsWhatIsStillQueued) {
  std::atomic<int> ran{0};
  {
    WorkQueue queue(1);
    for (int i = 0; i < 50; ++i) queue.Post([&] { ++ran; });
  }
  EXPECT_EQ(ran, 50);
}

}  // namespace
}  // namespace pscluster
