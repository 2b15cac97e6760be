#include "server/ps/replication/write_log.h"

#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pscluster::ps {
namespace {

using ::testing::HasSubstr;

class WriteLogTest : public ::testing::TestWithParam<bool> {
 protected:
  absl::Mutex mu_;
  WriteLog log_{"shard 3", &mu_, /*max_request_ids=*/2, /*ordered=*/GetParam()};
  int applied_ = 0;
  absl::StatusOr<WriteLog::Entry> Push(const std::string& id) {
    return log_.Append(id, absl::Now() + absl::Seconds(30), [&] {
      ++applied_;
      return absl::OkStatus();
    });
  }
};

TEST_P(WriteLogTest, ARepeatedRequestIsAppliedOnceAndAnswersItsFirstEntry) {
  auto first = Push("a");
  ASSERT_TRUE(first.ok());
  EXPECT_FALSE(first->repeat);
  auto again = Push("a");
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->repeat);
  EXPECT_EQ(again->seq, first->seq);
  EXPECT_EQ(applied_, 1);
  ASSERT_TRUE(Push("").ok());  // no id: no repeat to know of
  ASSERT_TRUE(Push("").ok());
  EXPECT_EQ(applied_, 3);
  ASSERT_TRUE(Push("b").ok());
  ASSERT_TRUE(Push("c").ok());  // past max_request_ids: "a" is forgotten
  EXPECT_FALSE(Push("a")->repeat);
  EXPECT_EQ(applied_, 6);
}

TEST_P(WriteLogTest, AFailedWriteTakesNoNumberAndItsRetryApplies) {
  absl::StatusOr<WriteLog::Entry> refused = log_.Append(
      "a", absl::Now() + absl::Seconds(30), [] { return absl::InvalidArgumentError("bad push"); });
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  {
    absl::MutexLock lock(&mu_);
    EXPECT_EQ(log_.applied(), 0u);
  }
  auto retried = Push("a");
  ASSERT_TRUE(retried.ok());
  EXPECT_FALSE(retried->repeat);
  EXPECT_EQ(retried->seq, 1u);
  EXPECT_EQ(applied_, 1);
}

// A repeat that comes while its first attempt applies is not applied beside it: it waits
// for the first (unordered), or for its turn (ordered), and answers the first's entry.
TEST_P(WriteLogTest, ARepeatDuringItsFirstAttemptWaitsForIt) {
  absl::Notification applying, release;
  std::thread first([&] {
    auto e = log_.Append("a", absl::Now() + absl::Seconds(30), [&] {
      applying.Notify();
      release.WaitForNotificationWithTimeout(absl::Seconds(30));
      ++applied_;
      return absl::OkStatus();
    });
    EXPECT_TRUE(e.ok() && !e->repeat);
  });
  applying.WaitForNotification();
  absl::StatusOr<WriteLog::Entry> repeat;
  std::thread second([&] { repeat = Push("a"); });
  release.Notify();
  first.join();
  second.join();
  ASSERT_TRUE(repeat.ok()) << repeat.status();
  EXPECT_TRUE(repeat->repeat);
  EXPECT_EQ(applied_, 1);
}

TEST_P(WriteLogTest, NumbersAreDoneInAnyOrderAndAwaitedUpToADeadline) {
  ASSERT_TRUE(Push("a").ok());
  ASSERT_TRUE(Push("b").ok());
  log_.Done(2);
  {
    absl::MutexLock lock(&mu_);
    EXPECT_FALSE(log_.IsDone(1));
    EXPECT_TRUE(log_.IsDone(2));
  }
  EXPECT_FALSE(log_.AwaitDone(1, absl::Now()));
  log_.Done(1);
  EXPECT_TRUE(log_.AwaitDone(1, absl::Now()));
}

INSTANTIATE_TEST_SUITE_P(OrderedOrNot, WriteLogTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? "Ordered" : "Unordered";
                         });

TEST(WriteLogUnorderedTest, ARepeatWaitsForItsFirstAttemptOnlyUntilItsDeadline) {
  absl::Mutex mu;
  WriteLog log("shard 3", &mu, 16, /*ordered=*/false);
  absl::Notification applying, release;
  std::thread first([&] {
    EXPECT_TRUE(log.Append("a", absl::InfiniteFuture(),
                           [&] {
                             applying.Notify();
                             release.WaitForNotificationWithTimeout(absl::Seconds(30));
                             return absl::OkStatus();
                           })
                    .ok());
  });
  applying.WaitForNotification();
  bool applied_again = false;
  absl::StatusOr<WriteLog::Entry> late = log.Append("a", absl::Now(), [&] {
    applied_again = true;
    return absl::OkStatus();
  });
  release.Notify();
  first.join();
  EXPECT_EQ(late.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(late.status().message(), HasSubstr("shard 3: an earlier attempt of request a"));
  EXPECT_FALSE(applied_again);
}

TEST(WriteLogOrderedTest, AReplicaAppliesTheHeadsEntriesOnlyInTurn) {
  absl::Mutex mu;
  WriteLog log("shard 3 replica 1", &mu, 16, /*ordered=*/true);
  int applied = 0;
  auto apply = [&] {
    ++applied;
    return absl::OkStatus();
  };
  auto admit = [] { return absl::OkStatus(); };
  absl::Status early = log.AppendAt(2, "b", admit, apply);
  EXPECT_EQ(early.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(early.message(), HasSubstr("shard 3 replica 1: update 2 is out of turn (0 applied)"));
  absl::Status refused = log.AppendAt(
      1, "a", [] { return absl::FailedPreconditionError("old epoch"); }, apply);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(applied, 0);
  ASSERT_TRUE(log.AppendAt(1, "a", admit, apply).ok());
  ASSERT_TRUE(log.AppendAt(2, "b", admit, apply).ok());
  EXPECT_EQ(applied, 2);
  // A new head (this replica, after a failover) answers a client's repeat from the log.
  auto repeat = log.Append("b", absl::Now() + absl::Seconds(30), apply);
  ASSERT_TRUE(repeat.ok());
  EXPECT_TRUE(repeat->repeat);
  EXPECT_EQ(repeat->seq, 2u);
  std::vector<std::pair<std::string, uint64_t>> ids;
  {
    absl::MutexLock lock(&mu);
    log.ForEachId([&](const std::string& id, uint64_t seq) { ids.emplace_back(id, seq); });
    log.Reset(7, [](RecentIds<uint64_t>* kept) { kept->Set("z", 7); });
    EXPECT_EQ(log.applied(), 7u);
    EXPECT_TRUE(log.IsDone(7));
  }
  EXPECT_EQ(ids, (std::vector<std::pair<std::string, uint64_t>>{{"a", 1}, {"b", 2}}));
  EXPECT_TRUE(log.Append("z", absl::Now(), apply)->repeat);
  EXPECT_EQ(applied, 2);
}

}  // namespace
}  // namespace pscluster::ps
