#include "server/coordinator/mode_switch.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/coordinator.pb.h"

namespace pscluster::coord {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int64_t kNow = 1'700'000'000'000;  // unix ms

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

ReportSwitchRequest Report(int32_t rank, const SwitchModeResponse& scheduled, TrainingMode from,
                           TrainingMode to, double handoff = 0.5) {
  ReportSwitchRequest r;
  r.set_rank(rank);
  r.set_incarnation(1);
  r.set_switch_id(scheduled.switch_id());
  r.set_at_step(scheduled.at_step());
  r.set_from_mode(from);
  r.set_to_mode(to);
  r.set_handoff_seconds(handoff);
  return r;
}

class SwitchScheduleTest : public ::testing::Test {
 protected:
  static SwitchScheduleOptions Options(int num_workers, int num_shards = 1,
                                       TrainingMode initial_mode = PS) {
    SwitchScheduleOptions o;
    o.initial_mode = initial_mode;
    o.num_shards = num_shards;
    o.num_workers = num_workers;
    return o;
  }

  // Schedules and returns the response; fails the test on error.
  static SwitchModeResponse MustSchedule(SwitchSchedule& s, TrainingMode mode, int64_t at_step) {
    absl::StatusOr<SwitchModeResponse> r = s.Schedule(mode, at_step, kNow);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : SwitchModeResponse();
  }

  static PollSwitchResponse MustPoll(SwitchSchedule& s, int64_t step, int rank = 0) {
    absl::StatusOr<PollSwitchResponse> r = s.Poll(rank, step);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : PollSwitchResponse();
  }

  static SwitchSchedule::AckResult MustAck(SwitchSchedule& s, const ReportSwitchRequest& r,
                                           int64_t unix_ms = kNow) {
    absl::StatusOr<SwitchSchedule::AckResult> a = s.Acknowledge(r, unix_ms);
    EXPECT_TRUE(a.ok()) << a.status();
    return a.ok() ? *a : SwitchSchedule::AckResult();
  }

  static ClusterView View(const SwitchSchedule& s) {
    ClusterView v;
    s.FillView(&v);
    return v;
  }
};

// ---------------------------------------------------------------------------------------
// Modes.

TEST(ValidateModeTest, AcceptsTheFourModes) {
  for (TrainingMode mode : {PS, ALLREDUCE, FSDP, PIPELINE, TENSOR}) {
    EXPECT_TRUE(ValidateMode(mode, 1).ok()) << ModeName(mode);
  }
}

TEST(ValidateModeTest, UnknownModeIsInvalidArgumentListingTheModes) {
  absl::Status s = ValidateMode(static_cast<TrainingMode>(9), 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Msg(s),
            "mode 9 is not a training mode; use one of ps, allreduce, fsdp, pipeline or tensor");
  EXPECT_EQ(ValidateMode(TRAINING_MODE_UNSPECIFIED, 1).code(), absl::StatusCode::kInvalidArgument);
}

TEST(ValidateModeTest, PsWithoutShardsIsFailedPrecondition) {
  absl::Status s = ValidateMode(PS, 0);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(Msg(s), HasSubstr("--num_shards=0"));
  EXPECT_TRUE(ValidateMode(ALLREDUCE, 0).ok());
}

// ---------------------------------------------------------------------------------------
// Scheduling.

TEST_F(SwitchScheduleTest, StartsInTheInitialModeWithNothingScheduled) {
  SwitchSchedule s(Options(2, 0, ALLREDUCE));
  ClusterView v = View(s);
  EXPECT_EQ(v.mode(), ALLREDUCE);
  EXPECT_EQ(v.switches_size(), 0);
  EXPECT_EQ(v.pending_switches_size(), 0);
  EXPECT_EQ(s.max_polled(), -1);
  EXPECT_FALSE(MustPoll(s, 0).pending());
}

TEST_F(SwitchScheduleTest, MaxPolledIsTheHighestStepPolled) {
  SwitchSchedule s(Options(2));
  MustPoll(s, 5, /*rank=*/0);
  MustPoll(s, 9, /*rank=*/0);
  MustPoll(s, 7, /*rank=*/1);  // a slower worker
  EXPECT_EQ(s.max_polled(), 9);
}

// Workers that rolled back to a checkpoint (a failure) poll from it again: once every rank
// has, the steps after it can be scheduled again and the next boundary is right after it;
// until then the rank that has not polled since still counts where it was.
TEST_F(SwitchScheduleTest, RanksThatRolledBackOpenTheirStepsAgainOnceAllHave) {
  SwitchSchedule s(Options(2));
  MustPoll(s, 57, 0);
  MustPoll(s, 56, 1);
  MustPoll(s, 30, 0);  // rank 0 rolled back to the checkpoint of step 30
  EXPECT_EQ(s.max_polled(), 56);
  EXPECT_EQ(s.Schedule(FSDP, 40, kNow).status().code(), absl::StatusCode::kFailedPrecondition);
  MustPoll(s, 30, 1);
  EXPECT_EQ(s.max_polled(), 30);
  EXPECT_EQ(MustSchedule(s, FSDP, 40).at_step(), 40);
  EXPECT_EQ(MustSchedule(s, PIPELINE, 0).at_step(), 31);
}

// A restarted coordinator knows only the highest step reached: it holds until every rank
// has polled again.
TEST_F(SwitchScheduleTest, ARestoredScheduleKeepsItsReachedStepUntilEveryRankPolled) {
  SwitchSchedule before(Options(2));
  MustPoll(before, 57, 0);
  MustPoll(before, 57, 1);
  CoordinatorState saved;
  before.Save(&saved);
  SwitchSchedule s(Options(2));
  ASSERT_TRUE(s.Restore(saved).ok());
  EXPECT_EQ(s.max_polled(), 57);
  MustPoll(s, 30, 0);
  EXPECT_EQ(s.max_polled(), 57);
  MustPoll(s, 30, 1);
  EXPECT_EQ(s.max_polled(), 30);
}

TEST_F(SwitchScheduleTest, NegativePolledStepIsInvalidArgument) {
  SwitchSchedule s(Options(1));
  absl::StatusOr<PollSwitchResponse> r = s.Poll(0, -1);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.max_polled(), -1);
}

TEST_F(SwitchScheduleTest, NextBoundaryBeforeAnyPollIsStepZero) {
  SwitchSchedule s(Options(1));
  SwitchModeResponse r = MustSchedule(s, FSDP, 0);
  EXPECT_EQ(r.switch_id(), 1);
  EXPECT_EQ(r.at_step(), 0);
  EXPECT_FALSE(r.no_op());
}

TEST_F(SwitchScheduleTest, NextBoundaryIsOnePastTheHighestPolledStep) {
  SwitchSchedule s(Options(2));
  MustPoll(s, 56, 0);
  MustPoll(s, 57, 1);
  SwitchModeResponse r = MustSchedule(s, ALLREDUCE, 0);
  EXPECT_EQ(r.at_step(), 58);
  ClusterView v = View(s);
  ASSERT_EQ(v.pending_switches_size(), 1);
  EXPECT_EQ(v.pending_switches(0).switch_id(), 1);
  EXPECT_EQ(v.pending_switches(0).at_step(), 58);
  EXPECT_EQ(v.pending_switches(0).to_mode(), ALLREDUCE);
  EXPECT_EQ(v.pending_switches(0).from_mode(), TRAINING_MODE_UNSPECIFIED);
  EXPECT_EQ(v.pending_switches(0).unix_ms(), kNow);
  EXPECT_EQ(v.mode(), PS) << "scheduling does not change the mode";
}

TEST_F(SwitchScheduleTest, PollHorizonCountsItsStepsAsReachedAndCoversThem) {
  SwitchSchedule s(Options(2));
  MustSchedule(s, FSDP, 14);  // inside the window the next poll covers
  absl::StatusOr<PollSwitchResponse> p = s.Poll(0, 10, 8);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(s.max_polled(), 17);
  EXPECT_TRUE(p->pending());
  EXPECT_EQ(p->at_step(), 14);
  // Nothing can be scheduled inside [10, 18) any more: the worker will not ask again.
  EXPECT_EQ(s.Schedule(PIPELINE, 15, kNow).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(MustSchedule(s, PIPELINE, 0).at_step(), 18);
  EXPECT_EQ(s.Poll(0, 18, -1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(SwitchScheduleTest, ExplicitStepAfterEveryPolledStepIsScheduledThere) {
  SwitchSchedule s(Options(2));
  MustPoll(s, 57);
  EXPECT_EQ(MustSchedule(s, FSDP, 58).at_step(), 58);
  EXPECT_EQ(MustSchedule(s, PIPELINE, 120).at_step(), 120);
}

// After a restore to step 30 the workers resume there: steps from 30 on can be scheduled
// again (they were refused as passed), earlier ones still cannot.
TEST_F(SwitchScheduleTest, ARewindLetsTheStepsFromTheRestoredOneBeScheduledAgain) {
  SwitchSchedule s(Options(2));
  MustPoll(s, 57);
  EXPECT_EQ(s.Schedule(FSDP, 40, kNow).status().code(), absl::StatusCode::kFailedPrecondition);
  s.Rewind(30);
  EXPECT_EQ(s.max_polled(), 29);
  EXPECT_EQ(s.Schedule(FSDP, 29, kNow).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(MustSchedule(s, FSDP, 40).at_step(), 40);
}

TEST_F(SwitchScheduleTest, StepAlreadyPassedIsFailedPreconditionNamingBothSteps) {
  SwitchSchedule s(Options(2));
  MustPoll(s, 57);
  absl::StatusOr<SwitchModeResponse> r = s.Schedule(FSDP, 40, kNow);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Msg(r.status()),
            "step 40 already passed: workers are at step 57; use a later step or 0 for the next "
            "boundary");
  // The polled step itself: a worker already decided how to run it.
  EXPECT_EQ(s.Schedule(FSDP, 57, kNow).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(View(s).pending_switches_size(), 0);
}

TEST_F(SwitchScheduleTest, NegativeAtStepIsInvalidArgument) {
  SwitchSchedule s(Options(1));
  absl::StatusOr<SwitchModeResponse> r = s.Schedule(FSDP, -3, kNow);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(r.status()), HasSubstr("at_step -3 is negative"));
}

TEST_F(SwitchScheduleTest, UnknownModeIsInvalidArgumentAndPsWithoutShardsIsFailedPrecondition) {
  SwitchSchedule s(Options(1, /*num_shards=*/0, ALLREDUCE));
  absl::StatusOr<SwitchModeResponse> r = s.Schedule(static_cast<TrainingMode>(17), 10, kNow);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(r.status()), HasSubstr("ps, allreduce, fsdp, pipeline or tensor"));
  r = s.Schedule(PS, 10, kNow);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(View(s).pending_switches_size(), 0);
}

TEST_F(SwitchScheduleTest, SameStepTwiceIsAlreadyExistsNamingTheScheduledSwitch) {
  SwitchSchedule s(Options(1));
  MustSchedule(s, FSDP, 100);
  absl::StatusOr<SwitchModeResponse> r = s.Schedule(PIPELINE, 100, kNow);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(Msg(r.status()), HasSubstr("switch 1 to fsdp is already scheduled at step 100"));
  // The next boundary can collide too: nobody has polled past it yet.
  MustPoll(s, 99);
  EXPECT_EQ(s.Schedule(ALLREDUCE, 0, kNow).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(View(s).pending_switches_size(), 1);
}

TEST_F(SwitchScheduleTest, ModeAlreadyInEffectAtTheStepIsANoOpNamingTheSwitchThatSetsIt) {
  SwitchSchedule s(Options(1));
  SwitchModeResponse r = MustSchedule(s, PS, 10);  // the starting mode
  EXPECT_TRUE(r.no_op());
  EXPECT_EQ(r.switch_id(), 0);
  EXPECT_EQ(r.at_step(), 0);

  MustSchedule(s, FSDP, 10);
  r = MustSchedule(s, FSDP, 20);  // fsdp from step 10 on
  EXPECT_TRUE(r.no_op());
  EXPECT_EQ(r.switch_id(), 1);
  EXPECT_EQ(r.at_step(), 10);
  r = MustSchedule(s, FSDP, 10);  // the same request again
  EXPECT_TRUE(r.no_op());
  EXPECT_EQ(r.switch_id(), 1);
  r = MustSchedule(s, PS, 5);  // still ps before step 10
  EXPECT_TRUE(r.no_op());
  EXPECT_EQ(r.switch_id(), 0);
  EXPECT_EQ(View(s).pending_switches_size(), 1) << "no-ops schedule nothing";

  r = MustSchedule(s, PS, 20);  // back to ps after fsdp: a real switch
  EXPECT_FALSE(r.no_op());
  EXPECT_EQ(r.switch_id(), 2);
}

TEST_F(SwitchScheduleTest, IdsFollowSchedulingOrderAndPendingSwitchesAreSortedByStep) {
  SwitchSchedule s(Options(1));
  EXPECT_EQ(MustSchedule(s, FSDP, 30).switch_id(), 1);
  EXPECT_EQ(MustSchedule(s, ALLREDUCE, 10).switch_id(), 2);
  EXPECT_EQ(MustSchedule(s, PIPELINE, 20).switch_id(), 3);
  ClusterView v = View(s);
  ASSERT_EQ(v.pending_switches_size(), 3);
  EXPECT_EQ(v.pending_switches(0).at_step(), 10);
  EXPECT_EQ(v.pending_switches(0).switch_id(), 2);
  EXPECT_EQ(v.pending_switches(1).at_step(), 20);
  EXPECT_EQ(v.pending_switches(1).switch_id(), 3);
  EXPECT_EQ(v.pending_switches(2).at_step(), 30);
  EXPECT_EQ(v.pending_switches(2).switch_id(), 1);
}

// ---------------------------------------------------------------------------------------
// Polling.

TEST_F(SwitchScheduleTest, PollAnswersTheEarliestPendingSwitchAtOrAfterTheStep) {
  SwitchSchedule s(Options(1));
  MustSchedule(s, FSDP, 10);
  MustSchedule(s, PIPELINE, 20);
  PollSwitchResponse p = MustPoll(s, 5);
  EXPECT_TRUE(p.pending());
  EXPECT_EQ(p.switch_id(), 1);
  EXPECT_EQ(p.at_step(), 10);
  EXPECT_EQ(p.mode(), FSDP);
  p = MustPoll(s, 10);  // the worker switches now
  EXPECT_EQ(p.at_step(), 10);
  p = MustPoll(s, 11);
  EXPECT_EQ(p.switch_id(), 2);
  EXPECT_EQ(p.at_step(), 20);
  EXPECT_EQ(p.mode(), PIPELINE);
  EXPECT_FALSE(MustPoll(s, 21).pending());
}

TEST_F(SwitchScheduleTest, ASwitchWaitingForASlowWorkerDoesNotHideTheNextOne) {
  SwitchSchedule s(Options(2));
  SwitchModeResponse first = MustSchedule(s, FSDP, 10);
  EXPECT_EQ(MustPoll(s, 10, 0).switch_id(), 1);  // rank 0 switches, reports, moves on
  MustAck(s, Report(0, first, PS, FSDP));
  SwitchModeResponse second = MustSchedule(s, ALLREDUCE, 11);  // > max_polled: allowed
  PollSwitchResponse p = MustPoll(s, 11, 0);  // rank 1 has not reported switch 1 yet
  EXPECT_TRUE(p.pending());
  EXPECT_EQ(p.switch_id(), second.switch_id());
  EXPECT_EQ(p.at_step(), 11);
}

// After a switch is done, a poll past it answers nothing; a poll before it (a worker that
// rolled back to an earlier checkpoint) answers it again, and the repeated report is fine.
TEST_F(SwitchScheduleTest, DoneSwitchIsAnsweredOnlyToAWorkerReplayingItsStep) {
  SwitchSchedule s(Options(1));
  SwitchModeResponse r = MustSchedule(s, FSDP, 10);
  MustPoll(s, 10);
  MustAck(s, Report(0, r, PS, FSDP));
  EXPECT_FALSE(MustPoll(s, 11).pending());
  PollSwitchResponse replay = MustPoll(s, 4);
  EXPECT_TRUE(replay.pending());
  EXPECT_EQ(replay.at_step(), 10);
  EXPECT_EQ(replay.mode(), FSDP);
  MustAck(s, Report(0, r, PS, FSDP));
  EXPECT_EQ(View(s).switches_size(), 1) << "a replayed switch is recorded once";
}

// ---------------------------------------------------------------------------------------
// Reports.

TEST_F(SwitchScheduleTest, SwitchIsDoneOnlyWhenEveryWorkerReported) {
  SwitchSchedule s(Options(3));
  SwitchModeResponse r = MustSchedule(s, FSDP, 10);
  SwitchSchedule::AckResult a = MustAck(s, Report(2, r, PS, FSDP, 0.25), kNow + 1);
  EXPECT_TRUE(a.changed);
  EXPECT_FALSE(a.done);
  a = MustAck(s, Report(0, r, PS, FSDP, 0.75), kNow + 2);
  EXPECT_FALSE(a.done);
  ClusterView v = View(s);
  EXPECT_EQ(v.mode(), PS);
  EXPECT_EQ(v.switches_size(), 0);
  ASSERT_EQ(v.pending_switches_size(), 1);
  EXPECT_THAT(v.pending_switches(0).acked_ranks(), ElementsAre(0, 2));
  EXPECT_EQ(v.pending_switches(0).from_mode(), PS);
  EXPECT_DOUBLE_EQ(v.pending_switches(0).handoff_seconds(), 0.75);

  a = MustAck(s, Report(1, r, PS, FSDP, 0.5), kNow + 3);
  EXPECT_TRUE(a.changed);
  EXPECT_TRUE(a.done);
  v = View(s);
  EXPECT_EQ(v.mode(), FSDP);
  EXPECT_EQ(v.pending_switches_size(), 0);
  ASSERT_EQ(v.switches_size(), 1);
  const SwitchRecord& done = v.switches(0);
  EXPECT_EQ(done.switch_id(), 1);
  EXPECT_EQ(done.at_step(), 10);
  EXPECT_EQ(done.from_mode(), PS);
  EXPECT_EQ(done.to_mode(), FSDP);
  EXPECT_DOUBLE_EQ(done.handoff_seconds(), 0.75) << "the longest hand-over";
  EXPECT_EQ(done.unix_ms(), kNow + 3) << "when the last worker reported";
  EXPECT_EQ(done.acked_ranks_size(), 0);
}

TEST_F(SwitchScheduleTest, RepeatedReportChangesNothing) {
  SwitchSchedule s(Options(2));
  SwitchModeResponse r = MustSchedule(s, FSDP, 10);
  EXPECT_TRUE(MustAck(s, Report(0, r, PS, FSDP)).changed);
  SwitchSchedule::AckResult again = MustAck(s, Report(0, r, PS, FSDP, 9.0));
  EXPECT_FALSE(again.changed);
  EXPECT_FALSE(again.done);
  EXPECT_DOUBLE_EQ(View(s).pending_switches(0).handoff_seconds(), 0.5);
  EXPECT_TRUE(MustAck(s, Report(1, r, PS, FSDP)).done);
  again = MustAck(s, Report(1, r, PS, FSDP));  // a retry after a lost answer
  EXPECT_FALSE(again.changed);
  EXPECT_TRUE(again.done);
  EXPECT_EQ(View(s).switches_size(), 1);
}

TEST_F(SwitchScheduleTest, UnknownSwitchIdIsNotFound) {
  SwitchSchedule s(Options(1));
  SwitchModeResponse r = MustSchedule(s, FSDP, 10);
  r.set_switch_id(7);
  absl::StatusOr<SwitchSchedule::AckResult> a = s.Acknowledge(Report(0, r, PS, FSDP), kNow);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Msg(a.status()), HasSubstr("switch 7 is unknown"));
}

TEST_F(SwitchScheduleTest, ReportNotMatchingTheScheduleIsInvalidArgument) {
  SwitchSchedule s(Options(2));
  SwitchModeResponse r = MustSchedule(s, FSDP, 10);
  SwitchModeResponse wrong_step = r;
  wrong_step.set_at_step(11);
  auto code = [&](const ReportSwitchRequest& req) { return s.Acknowledge(req, kNow).status(); };
  absl::Status st = code(Report(0, wrong_step, PS, FSDP));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(st), HasSubstr("scheduled to fsdp at step 10"));
  EXPECT_EQ(code(Report(0, r, PS, PIPELINE)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(Report(0, r, TRAINING_MODE_UNSPECIFIED, FSDP)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(Report(0, r, PS, FSDP, -1.0)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(Report(0, r, PS, FSDP, std::numeric_limits<double>::quiet_NaN())).code(),
            absl::StatusCode::kInvalidArgument);
  MustAck(s, Report(0, r, PS, FSDP));
  st = code(Report(1, r, ALLREDUCE, FSDP));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(st), HasSubstr("earlier report said from ps"));
  EXPECT_THAT(View(s).pending_switches(0).acked_ranks(), ElementsAre(0));
}

TEST_F(SwitchScheduleTest, SwitchesDoneOutOfOrderLeaveTheModeOfTheLatestStep) {
  SwitchSchedule s(Options(1));
  SwitchModeResponse first = MustSchedule(s, FSDP, 10);
  SwitchModeResponse second = MustSchedule(s, PIPELINE, 20);
  EXPECT_TRUE(MustAck(s, Report(0, second, FSDP, PIPELINE)).done);
  EXPECT_EQ(s.mode(), PIPELINE);
  EXPECT_TRUE(MustAck(s, Report(0, first, PS, FSDP)).done);
  EXPECT_EQ(s.mode(), PIPELINE);
  ClusterView v = View(s);
  ASSERT_EQ(v.switches_size(), 2);
  EXPECT_EQ(v.switches(0).switch_id(), 2) << "in the order they completed";
  EXPECT_EQ(v.switches(1).switch_id(), 1);
}

}  // namespace
}  // namespace pscluster::coord
