#include "server/coordinator/recovery_schedule.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/coordinator.pb.h"

namespace pscluster::coord {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

RecordRunRequest Record(std::vector<std::string> flags, bool started, int32_t rank = 0) {
  RecordRunRequest r;
  r.set_rank(rank);
  for (std::string& f : flags) r.add_flags(std::move(f));
  r.set_started(started);
  return r;
}

ClusterView View(const RecoverySchedule& s) {
  ClusterView v;
  s.FillView(&v);
  return v;
}

TEST(RecoveryScheduleTest, RankZeroRecordsTheFlagsThenTheStart) {
  RecoverySchedule s(2);
  EXPECT_EQ(*s.RecordRun(Record({"--seed=1"}, false)), true);
  EXPECT_EQ(*s.RecordRun(Record({"--seed=1"}, false)), false);  // a repeat changes nothing
  // A rank 0 restarted before the start records again.
  EXPECT_EQ(*s.RecordRun(Record({"--seed=2"}, false)), true);
  EXPECT_EQ(*s.RecordRun(Record({"--seed=2"}, true)), true);
  EXPECT_THAT(View(s).run().flags(), ElementsAre("--seed=2"));
  EXPECT_TRUE(View(s).run().started());
  EXPECT_EQ(*s.RecordRun(Record({"--seed=2"}, true)), false);
}

TEST(RecoveryScheduleTest, AStartedRunKeepsItsFlags) {
  RecoverySchedule s(2);
  ASSERT_TRUE(s.RecordRun(Record({"--seed=1", "--lr=0.1"}, true)).ok());
  absl::StatusOr<bool> other = s.RecordRun(Record({"--seed=2"}, true));
  EXPECT_EQ(other.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(Msg(other.status()), HasSubstr("started with --seed=1 --lr=0.1"));
  EXPECT_EQ(s.RecordRun(Record({"--seed=1", "--lr=0.1"}, false)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(View(s).run().flags(), ElementsAre("--seed=1", "--lr=0.1"));
  EXPECT_TRUE(View(s).run().started());
}

TEST(RecoveryScheduleTest, BadRecordsAreRefusedAndChangeNothing) {
  RecoverySchedule s(2);
  ASSERT_TRUE(s.RecordRun(Record({"--seed=1"}, false)).ok());
  EXPECT_EQ(s.RecordRun(Record({"--seed=9"}, false, /*rank=*/1)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.RecordRun(Record({}, false)).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.RecordRun(Record({""}, false)).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.RecordRun(Record({std::string(kMaxRunFlagBytes + 1, 'x')}, false)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.RecordRun(Record(std::vector<std::string>(kMaxRunFlags + 1, "--a=1"), false))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(View(s).run().flags(), ElementsAre("--seed=1"));
  EXPECT_FALSE(View(s).run().started());
}

TEST(RecoveryScheduleTest, RankZeroDecidesOnceEveryRankStopped) {
  RecoverySchedule s(3);
  EXPECT_EQ(*s.Stopped("g1", 2), true);
  EXPECT_EQ(*s.Stopped("g1", 0), true);
  EXPECT_EQ(*s.Stopped("g1", 0), false);  // a repeated report (a retried call)
  absl::StatusOr<bool> early = s.Decide("g1", 0, 40);
  EXPECT_EQ(early.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(Msg(early.status()), HasSubstr("worker ranks 1 have not stopped"));
  EXPECT_FALSE(s.rollback().decided());
  ASSERT_TRUE(s.Stopped("g1", 1).ok());
  EXPECT_THAT(s.rollback().stopped_ranks(), ElementsAre(0, 1, 2));
  EXPECT_EQ(s.Decide("g1", 1, 40).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.Decide("g1", 0, -1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*s.Decide("g1", 0, 40), true);
  EXPECT_EQ(*s.Decide("g1", 0, 40), false);
  EXPECT_EQ(View(s).run().rollbacks(), 1);  // a repeated decision is not another rollback
  EXPECT_EQ(s.Decide("g1", 0, 20).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(View(s).rollback().decided());
  EXPECT_EQ(View(s).rollback().step(), 40);
}

TEST(RecoveryScheduleTest, ANewGenerationStartsItsRollbackAfresh) {
  RecoverySchedule s(2);
  ASSERT_TRUE(s.Stopped("g1", 0).ok());
  ASSERT_TRUE(s.Stopped("g1", 1).ok());
  ASSERT_TRUE(s.Decide("g1", 0, 10).ok());
  // A member failed again: the workers stop in the next generation.
  EXPECT_EQ(*s.Stopped("g2", 1), true);
  EXPECT_EQ(s.rollback().generation(), "g2");
  EXPECT_THAT(s.rollback().stopped_ranks(), ElementsAre(1));
  EXPECT_FALSE(s.rollback().decided());
  // The old generation's decision is gone with it.
  EXPECT_EQ(s.Decide("g1", 0, 10).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.Stopped("", 0).status().code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(s.Stopped("g2", 0).ok());
  ASSERT_TRUE(s.Decide("g2", 0, 10).ok());
  EXPECT_EQ(View(s).run().rollbacks(), 2);
}

TEST(RecoveryScheduleTest, ARestartedCoordinatorContinuesTheRecord) {
  RecoverySchedule s(2);
  ASSERT_TRUE(s.RecordRun(Record({"--seed=1"}, true)).ok());
  ASSERT_TRUE(s.Stopped("g1", 0).ok());
  CoordinatorState saved;
  s.Save(&saved);
  RecoverySchedule restored(2);
  restored.Restore(saved);
  EXPECT_TRUE(View(restored).run().started());
  EXPECT_THAT(restored.rollback().stopped_ranks(), ElementsAre(0));
  ASSERT_TRUE(restored.Stopped("g1", 1).ok());
  EXPECT_TRUE(restored.Decide("g1", 0, 5).ok());
  // Restarted with fewer workers: a rollback naming a rank outside them is dropped.
  RecoverySchedule fewer(1);
  CoordinatorState two;
  restored.Save(&two);
  fewer.Restore(two);
  EXPECT_TRUE(fewer.rollback().generation().empty());
  EXPECT_TRUE(View(fewer).run().started());
}

TEST(RecoveryScheduleTest, ADamagedSavedRecordIsDropped) {
  CoordinatorState saved;
  saved.mutable_run()->add_flags(std::string(kMaxRunFlagBytes + 1, 'x'));
  saved.mutable_run()->set_started(true);
  RecoverySchedule s(2);
  s.Restore(saved);
  EXPECT_TRUE(View(s).run().flags().empty());
  EXPECT_FALSE(View(s).run().started());
}

}  // namespace
}  // namespace pscluster::coord
