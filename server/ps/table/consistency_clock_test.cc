#include "server/ps/table/consistency_clock.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace pscluster::ps {
namespace {

ConsistencyConfig Mode(ConsistencyConfig::Mode mode, int staleness = 0) {
  ConsistencyConfig c;
  c.set_mode(mode);
  c.set_staleness(staleness);
  return c;
}

TEST(ConsistencyClockTest, SspAndAspAppliedStepsAreTheSlowestClockAndNeverGoBack) {
  for (auto mode : {ConsistencyConfig::SSP, ConsistencyConfig::ASP}) {
    ConsistencyClock clock(7, Mode(mode, 2));
    clock.AddWorker(0);
    clock.AddWorker(1);
    for (int64_t s = 0; s < 5; ++s) clock.RecordPush(0, s);
    EXPECT_EQ(clock.applied_steps(), 0) << "worker 1 has pushed nothing";
    clock.RecordPush(1, 0);
    clock.RecordPush(1, 1);
    EXPECT_EQ(clock.applied_steps(), 2);
    clock.RemoveWorker(1);
    EXPECT_EQ(clock.applied_steps(), 5) << "worker 0 alone";
    clock.RemoveWorker(0);
    EXPECT_EQ(clock.applied_steps(), 5) << "kept when every worker has left";
    clock.AddWorker(2);  // a late joiner starts there, not at 0
    EXPECT_EQ(clock.clocks().at(2), 5);
    EXPECT_EQ(clock.applied_steps(), 5);
  }
}

TEST(ConsistencyClockTest, BspStepIsReadyOnlyWhenEveryWorkerPushedItAndNoHoldStopsIt) {
  ConsistencyClock clock(7, Mode(ConsistencyConfig::BSP));
  clock.AddWorker(0);
  clock.AddWorker(1);
  EXPECT_FALSE(clock.Pullable(1));
  clock.RecordPush(0, 0);
  EXPECT_FALSE(clock.NextStepReady());
  ASSERT_TRUE(clock.Hold(0).ok());
  clock.RecordPush(1, 0);
  EXPECT_FALSE(clock.NextStepReady()) << "a snapshot holds step 0";
  EXPECT_TRUE(clock.Release(0));
  EXPECT_FALSE(clock.Release(0)) << "one hold, released once";
  ASSERT_TRUE(clock.NextStepReady());
  clock.StepApplied();
  EXPECT_EQ(clock.applied_steps(), 1);
  EXPECT_TRUE(clock.Pullable(1));
  EXPECT_FALSE(clock.Pullable(2));
  EXPECT_EQ(clock.Hold(0).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(ConsistencyClockTest, BspRefusesStaleDuplicateAndFarAheadPushes) {
  ConsistencyClock clock(7, Mode(ConsistencyConfig::BSP));
  clock.AddWorker(0);
  EXPECT_EQ(clock.CheckPush(0, -1).code(), absl::StatusCode::kInvalidArgument);
  clock.RecordPush(0, 0);
  EXPECT_EQ(clock.CheckPush(0, 0).code(), absl::StatusCode::kFailedPrecondition);
  const absl::Status far = clock.CheckPush(0, kMaxBspStepsAhead);
  EXPECT_EQ(far.code(), absl::StatusCode::kAborted);
  // The limit as the check applies it (the message said "more than 4" of a step 4 ahead).
  EXPECT_NE(far.message().find(absl::StrCat("is ", kMaxBspStepsAhead,
                                            " steps ahead of the "
                                            "oldest unapplied BSP step 0; at most ",
                                            kMaxBspStepsAhead - 1, " may be")),
            absl::string_view::npos)
      << far;
  EXPECT_TRUE(clock.CheckPush(0, kMaxBspStepsAhead - 1).ok());
  clock.StepApplied();
  absl::Status stale = clock.CheckPush(0, 0);
  EXPECT_EQ(stale.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(stale.message().find("table 7"), absl::string_view::npos) << stale;
}

// Pushes may run ahead, behind or skip steps under SSP/ASP, but not leap: a step far
// beyond the worker's clock (a hostile 2^62) is refused, so no clock (and no checkpoint
// labelled by one) jumps there.
TEST(ConsistencyClockTest, SspAndAspRefuseAStepFarBeyondTheWorkersClock) {
  for (auto mode : {ConsistencyConfig::SSP, ConsistencyConfig::ASP}) {
    ConsistencyClock clock(7, Mode(mode, 2));
    clock.AddWorker(0);
    for (int64_t s = 0; s < 3; ++s) clock.RecordPush(0, s);
    EXPECT_TRUE(clock.CheckPush(0, 1).ok()) << "behind";
    EXPECT_TRUE(clock.CheckPush(0, 3 + kMaxAsyncStepsAhead).ok());
    absl::Status far = clock.CheckPush(0, 4 + kMaxAsyncStepsAhead);
    EXPECT_EQ(far.code(), absl::StatusCode::kFailedPrecondition) << far;
    EXPECT_NE(far.message().find("worker 0's clock 3"), absl::string_view::npos) << far;
    EXPECT_EQ(clock.CheckPush(0, int64_t{1} << 62).code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(clock.CheckPush(0, std::numeric_limits<int64_t>::max()).code(),
              absl::StatusCode::kFailedPrecondition);
  }
}

TEST(ConsistencyClockTest, SspLetsAReaderRunAtMostStalenessStepsAheadOfTheSlowest) {
  ConsistencyClock clock(1, Mode(ConsistencyConfig::SSP, 2));
  clock.AddWorker(0);
  clock.AddWorker(1);
  for (int64_t s = 0; s < 5; ++s) clock.RecordPush(0, s);  // worker 0 at clock 5, worker 1 at 0
  EXPECT_TRUE(clock.Pullable(2));
  EXPECT_FALSE(clock.Pullable(3));
  EXPECT_NE(clock.DescribeLaggards(3).find("worker 1 (clock 0)"), std::string::npos);
  clock.AddWorker(2);  // a late joiner starts at the slowest clock
  EXPECT_EQ(clock.clocks().at(2), 0);
  clock.Shutdown();
  EXPECT_TRUE(clock.Pullable(100)) << "waits end on shutdown";
}

// What a BSP pull waits for: the workers whose pushes of the unapplied steps are missing,
// and, when one pushed a later step but not an earlier one (a shard restarted from an older
// snapshot, with the workers gone on), what to do.
TEST(ConsistencyClockTest, BspLaggardsNameTheMissingStepsAndASkip) {
  ConsistencyClock clock(1, Mode(ConsistencyConfig::BSP));
  clock.AddWorker(0);
  clock.AddWorker(1);
  for (int64_t s = 0; s < 3; ++s) {
    clock.RecordPush(0, s);
    clock.RecordPush(1, s);
    ASSERT_TRUE(clock.NextStepReady());
    clock.StepApplied();
  }
  clock.RecordPush(0, 3);
  EXPECT_EQ(clock.DescribeLaggards(4), "worker 1 (clock 3); BSP applied_steps=3");
  clock.RecordPush(1, 5);  // steps 3 and 4 of worker 1 never came here
  const std::string laggards = clock.DescribeLaggards(1LL << 62);  // a hostile step: short scan
  EXPECT_NE(laggards.find("worker 0 (clock 4)"), std::string::npos) << laggards;
  EXPECT_NE(laggards.find("worker 1 (clock 6, no push of step 3-4 here but of a later one)"),
            std::string::npos)
      << laggards;
  EXPECT_NE(laggards.find("restarted from an older snapshot?"), std::string::npos) << laggards;
}

TEST(ConsistencyClockTest, ResetAndRestoreSetClocksAndAppliedSteps) {
  ConsistencyClock clock(1, Mode(ConsistencyConfig::BSP));
  clock.AddWorker(0);
  clock.AddWorker(3);
  clock.RecordPush(0, 0);
  clock.Reset(9);
  EXPECT_EQ(clock.applied_steps(), 9);
  EXPECT_EQ(clock.clocks().at(0), 9);
  EXPECT_EQ(clock.clocks().at(3), 9);
  EXPECT_TRUE(clock.CheckPush(0, 9).ok()) << "the step pushed before the reset is forgotten";
  TableSnapshotHeader h;
  clock.Fill(&h);
  ConsistencyClock restored(1, Mode(ConsistencyConfig::BSP));
  restored.Restore(h);
  EXPECT_EQ(restored.applied_steps(), 9);
  EXPECT_EQ(restored.clocks(), clock.clocks());
}

}  // namespace
}  // namespace pscluster::ps
