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

ReportSwitchRequest Report(int32_t rank, const SwitchModeResponse& scheduled,
                           const std::string& from, const std::string& to, double handoff = 0.5) {
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
                                       std::string initial_mode = "ps") {
    SwitchScheduleOptions o;
    o.initial_mode = std::move(initial_mode);
    o.num_shards = num_shards;
    o.num_workers = num_workers;
    return o;
  }

  // Schedules and returns the response; fails the test on error.
  static SwitchModeResponse MustSchedule(SwitchSchedule& s, const std::string& mode,
                                         int64_t at_step) {
    absl::StatusOr<SwitchModeResponse> r = s.Schedule(mode, at_step, kNow);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : SwitchModeResponse();
  }

  static PollSwitchResponse MustPoll(SwitchSchedule& s, int64_t step) {
    absl::StatusOr<PollSwitchResponse> r = s.Poll(step);
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
  for (absl::string_view mode : kModes) EXPECT_TRUE(ValidateMode(mode, 1).ok()) << mode;
  EXPECT_THAT(kModes, ElementsAre("ps", "allreduce", "fsdp", "pipeline"));
}

TEST(ValidateModeTest, UnknownModeIsInvalidArgumentListingTheModes) {
  absl::Status s = ValidateMode("horovod", 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Msg(s), "mode 'horovod' is unknown; use one of ps, allreduce, fsdp, pipeline");
  EXPECT_EQ(ValidateMode("", 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ValidateMode("PS", 1).code(), absl::StatusCode::kInvalidArgument);
}

TEST(ValidateModeTest, PsWithoutShardsIsFailedPrecondition) {
  absl::Status s = ValidateMode("ps", 0);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(Msg(s), HasSubstr("--num_shards=0"));
  EXPECT_TRUE(ValidateMode("allreduce", 0).ok());
}

// ---------------------------------------------------------------------------------------
// Scheduling.

TEST_F(SwitchScheduleTest, StartsInTheInitialModeWithNothingScheduled) {
  SwitchSchedule s(Options(2, 0, "allreduce"));
  ClusterView v = View(s);
  EXPECT_EQ(v.mode(), "allreduce");
  EXPECT_EQ(v.switches_size(), 0);
  EXPECT_EQ(v.pending_switches_size(), 0);
  EXPECT_EQ(s.max_polled(), -1);
  EXPECT_FALSE(MustPoll(s, 0).pending());
}

TEST_F(SwitchScheduleTest, MaxPolledIsTheHighestStepPolled) {
  SwitchSchedule s(Options(2));
  MustPoll(s, 5);
  MustPoll(s, 9);
  MustPoll(s, 7);  // a slower worker
  EXPECT_EQ(s.max_polled(), 9);
}

TEST_F(SwitchScheduleTest, NegativePolledStepIsInvalidArgument) {
  SwitchSchedule s(Options(1));
  absl::StatusOr<PollSwitchResponse> r = s.Poll(-1);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.max_polled(), -1);
}

TEST_F(SwitchScheduleTest, NextBoundaryBeforeAnyPollIsStepZero) {
  SwitchSchedule s(Options(1));
  SwitchModeResponse r = MustSchedule(s, "fsdp", 0);
  EXPECT_EQ(r.switch_id(), 1);
  EXPECT_EQ(r.at_step(), 0);
  EXPECT_FALSE(r.no_op());
}

TEST_F(SwitchScheduleTest, NextBoundaryIsOnePastTheHighestPolledStep) {
  SwitchSchedule s(Options(2));
  MustPoll(s, 56);
  MustPoll(s, 57);
  SwitchModeResponse r = MustSchedule(s, "allreduce", 0);
  EXPECT_EQ(r.at_step(), 58);
  ClusterView v = View(s);
  ASSERT_EQ(v.pending_switches_size(), 1);
  EXPECT_EQ(v.pending_switches(0).switch_id(), 1);
  EXPECT_EQ(v.pending_switches(0).at_step(), 58);
  EXPECT_EQ(v.pending_switches(0).to_mode(), "allreduce");
  EXPECT_EQ(v.pending_switches(0).from_mode(), "");
  EXPECT_EQ(v.pending_switches(0).unix_ms(), kNow);
  EXPECT_EQ(v.mode(), "ps") << "scheduling does not change the mode";
}

TEST_F(SwitchScheduleTest, PollHorizonCountsItsStepsAsReachedAndCoversThem) {
  SwitchSchedule s(Options(2));
  MustSchedule(s, "fsdp", 14);  // inside the window the next poll covers
  absl::StatusOr<PollSwitchResponse> p = s.Poll(10, 8);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(s.max_polled(), 17);
  EXPECT_TRUE(p->pending());
  EXPECT_EQ(p->at_step(), 14);
  // Nothing can be scheduled inside [10, 18) any more: the worker will not ask again.
  EXPECT_EQ(s.Schedule("pipeline", 15, kNow).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(MustSchedule(s, "pipeline", 0).at_step(), 18);
  EXPECT_EQ(s.Poll(18, -1).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(SwitchScheduleTest, ExplicitStepAfterEveryPolledStepIsScheduledThere) {
  SwitchSchedule s(Options(2));
  MustPoll(s, 57);
  EXPECT_EQ(MustSchedule(s, "fsdp", 58).at_step(), 58);
  EXPECT_EQ(MustSchedule(s, "pipeline", 120).at_step(), 120);
}

TEST_F(SwitchScheduleTest, StepAlreadyPassedIsFailedPreconditionNamingBothSteps) {
  SwitchSchedule s(Options(2));
  MustPoll(s, 57);
  absl::StatusOr<SwitchModeResponse> r = s.Schedule("fsdp", 40, kNow);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(Msg(r.status()),
            "step 40 already passed: workers are at step 57; use a later step or 0 for the next "
            "boundary");
  // The polled step itself: a worker already decided how to run it.
  EXPECT_EQ(s.Schedule("fsdp", 57, kNow).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(View(s).pending_switches_size(), 0);
}

TEST_F(SwitchScheduleTest, NegativeAtStepIsInvalidArgument) {
  SwitchSchedule s(Options(1));
  absl::StatusOr<SwitchModeResponse> r = s.Schedule("fsdp", -3, kNow);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(r.status()), HasSubstr("at_step -3 is negative"));
}

TEST_F(SwitchScheduleTest, UnknownModeIsInvalidArgumentAndPsWithoutShardsIsFailedPrecondition) {
  SwitchSchedule s(Options(1, /*num_shards=*/0, "allreduce"));
  absl::StatusOr<SwitchModeResponse> r = s.Schedule("zero3", 10, kNow);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(r.status()), HasSubstr("ps, allreduce, fsdp, pipeline"));
  r = s.Schedule("ps", 10, kNow);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(View(s).pending_switches_size(), 0);
}

TEST_F(SwitchScheduleTest, SameStepTwiceIsAlreadyExistsNamingTheScheduledSwitch) {
  SwitchSchedule s(Options(1));
  MustSchedule(s, "fsdp", 100);
  absl::StatusOr<SwitchModeResponse> r = s.Schedule("pipeline", 100, kNow);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(Msg(r.status()), HasSubstr("switch 1 to fsdp is already scheduled at step 100"));
  // The next boundary can collide too: nobody has polled past it yet.
  MustPoll(s, 99);
  EXPECT_EQ(s.Schedule("allreduce", 0, kNow).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(View(s).pending_switches_size(), 1);
}

TEST_F(SwitchScheduleTest, ModeAlreadyInEffectAtTheStepIsANoOpNamingTheSwitchThatSetsIt) {
  SwitchSchedule s(Options(1));
  SwitchModeResponse r = MustSchedule(s, "ps", 10);  // the starting mode
  EXPECT_TRUE(r.no_op());
  EXPECT_EQ(r.switch_id(), 0);
  EXPECT_EQ(r.at_step(), 0);

  MustSchedule(s, "fsdp", 10);
  r = MustSchedule(s, "fsdp", 20);  // fsdp from step 10 on
  EXPECT_TRUE(r.no_op());
  EXPECT_EQ(r.switch_id(), 1);
  EXPECT_EQ(r.at_step(), 10);
  r = MustSchedule(s, "fsdp", 10);  // the same request again
  EXPECT_TRUE(r.no_op());
  EXPECT_EQ(r.switch_id(), 1);
  r = MustSchedule(s, "ps", 5);  // still ps before step 10
  EXPECT_TRUE(r.no_op());
  EXPECT_EQ(r.switch_id(), 0);
  EXPECT_EQ(View(s).pending_switches_size(), 1) << "no-ops schedule nothing";

  r = MustSchedule(s, "ps", 20);  // back to ps after fsdp: a real switch
  EXPECT_FALSE(r.no_op());
  EXPECT_EQ(r.switch_id(), 2);
}

TEST_F(SwitchScheduleTest, IdsFollowSchedulingOrderAndPendingSwitchesAreSortedByStep) {
  SwitchSchedule s(Options(1));
  EXPECT_EQ(MustSchedule(s, "fsdp", 30).switch_id(), 1);
  EXPECT_EQ(MustSchedule(s, "allreduce", 10).switch_id(), 2);
  EXPECT_EQ(MustSchedule(s, "pipeline", 20).switch_id(), 3);
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
  MustSchedule(s, "fsdp", 10);
  MustSchedule(s, "pipeline", 20);
  PollSwitchResponse p = MustPoll(s, 5);
  EXPECT_TRUE(p.pending());
  EXPECT_EQ(p.switch_id(), 1);
  EXPECT_EQ(p.at_step(), 10);
  EXPECT_EQ(p.mode(), "fsdp");
  p = MustPoll(s, 10);  // the worker switches now
  EXPECT_EQ(p.at_step(), 10);
  p = MustPoll(s, 11);
  EXPECT_EQ(p.switch_id(), 2);
  EXPECT_EQ(p.at_step(), 20);
  EXPECT_EQ(p.mode(), "pipeline");
  EXPECT_FALSE(MustPoll(s, 21).pending());
}

TEST_F(SwitchScheduleTest, ASwitchWaitingForASlowWorkerDoesNotHideTheNextOne) {
  SwitchSchedule s(Options(2));
  SwitchModeResponse first = MustSchedule(s, "fsdp", 10);
  EXPECT_EQ(MustPoll(s, 10).switch_id(), 1);  // rank 0 switches, reports, moves on
  MustAck(s, Report(0, first, "ps", "fsdp"));
  SwitchModeResponse second = MustSchedule(s, "allreduce", 11);  // > max_polled: allowed
  PollSwitchResponse p = MustPoll(s, 11);  // rank 1 has not reported switch 1 yet
  EXPECT_TRUE(p.pending());
  EXPECT_EQ(p.switch_id(), second.switch_id());
  EXPECT_EQ(p.at_step(), 11);
}

// After a switch is done, a poll past it answers nothing; a poll before it (a worker that
// rolled back to an earlier checkpoint) answers it again, and the repeated report is fine.
TEST_F(SwitchScheduleTest, DoneSwitchIsAnsweredOnlyToAWorkerReplayingItsStep) {
  SwitchSchedule s(Options(1));
  SwitchModeResponse r = MustSchedule(s, "fsdp", 10);
  MustPoll(s, 10);
  MustAck(s, Report(0, r, "ps", "fsdp"));
  EXPECT_FALSE(MustPoll(s, 11).pending());
  PollSwitchResponse replay = MustPoll(s, 4);
  EXPECT_TRUE(replay.pending());
  EXPECT_EQ(replay.at_step(), 10);
  EXPECT_EQ(replay.mode(), "fsdp");
  MustAck(s, Report(0, r, "ps", "fsdp"));
  EXPECT_EQ(View(s).switches_size(), 1) << "a replayed switch is recorded once";
}

// ---------------------------------------------------------------------------------------
// Reports.

TEST_F(SwitchScheduleTest, SwitchIsDoneOnlyWhenEveryWorkerReported) {
  SwitchSchedule s(Options(3));
  SwitchModeResponse r = MustSchedule(s, "fsdp", 10);
  SwitchSchedule::AckResult a = MustAck(s, Report(2, r, "ps", "fsdp", 0.25), kNow + 1);
  EXPECT_TRUE(a.changed);
  EXPECT_FALSE(a.done);
  a = MustAck(s, Report(0, r, "ps", "fsdp", 0.75), kNow + 2);
  EXPECT_FALSE(a.done);
  ClusterView v = View(s);
  EXPECT_EQ(v.mode(), "ps");
  EXPECT_EQ(v.switches_size(), 0);
  ASSERT_EQ(v.pending_switches_size(), 1);
  EXPECT_THAT(v.pending_switches(0).acked_ranks(), ElementsAre(0, 2));
  EXPECT_EQ(v.pending_switches(0).from_mode(), "ps");
  EXPECT_DOUBLE_EQ(v.pending_switches(0).handoff_seconds(), 0.75);

  a = MustAck(s, Report(1, r, "ps", "fsdp", 0.5), kNow + 3);
  EXPECT_TRUE(a.changed);
  EXPECT_TRUE(a.done);
  v = View(s);
  EXPECT_EQ(v.mode(), "fsdp");
  EXPECT_EQ(v.pending_switches_size(), 0);
  ASSERT_EQ(v.switches_size(), 1);
  const SwitchRecord& done = v.switches(0);
  EXPECT_EQ(done.switch_id(), 1);
  EXPECT_EQ(done.at_step(), 10);
  EXPECT_EQ(done.from_mode(), "ps");
  EXPECT_EQ(done.to_mode(), "fsdp");
  EXPECT_DOUBLE_EQ(done.handoff_seconds(), 0.75) << "the longest hand-over";
  EXPECT_EQ(done.unix_ms(), kNow + 3) << "when the last worker reported";
  EXPECT_EQ(done.acked_ranks_size(), 0);
}

TEST_F(SwitchScheduleTest, RepeatedReportChangesNothing) {
  SwitchSchedule s(Options(2));
  SwitchModeResponse r = MustSchedule(s, "fsdp", 10);
  EXPECT_TRUE(MustAck(s, Report(0, r, "ps", "fsdp")).changed);
  SwitchSchedule::AckResult again = MustAck(s, Report(0, r, "ps", "fsdp", 9.0));
  EXPECT_FALSE(again.changed);
  EXPECT_FALSE(again.done);
  EXPECT_DOUBLE_EQ(View(s).pending_switches(0).handoff_seconds(), 0.5);
  EXPECT_TRUE(MustAck(s, Report(1, r, "ps", "fsdp")).done);
  again = MustAck(s, Report(1, r, "ps", "fsdp"));  // a retry after a lost answer
  EXPECT_FALSE(again.changed);
  EXPECT_TRUE(again.done);
  EXPECT_EQ(View(s).switches_size(), 1);
}

TEST_F(SwitchScheduleTest, UnknownSwitchIdIsNotFound) {
  SwitchSchedule s(Options(1));
  SwitchModeResponse r = MustSchedule(s, "fsdp", 10);
  r.set_switch_id(7);
  absl::StatusOr<SwitchSchedule::AckResult> a = s.Acknowledge(Report(0, r, "ps", "fsdp"), kNow);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Msg(a.status()), HasSubstr("switch 7 is unknown"));
}

TEST_F(SwitchScheduleTest, ReportNotMatchingTheScheduleIsInvalidArgument) {
  SwitchSchedule s(Options(2));
  SwitchModeResponse r = MustSchedule(s, "fsdp", 10);
  SwitchModeResponse wrong_step = r;
  wrong_step.set_at_step(11);
  auto code = [&](const ReportSwitchRequest& req) { return s.Acknowledge(req, kNow).status(); };
  absl::Status st = code(Report(0, wrong_step, "ps", "fsdp"));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(st), HasSubstr("scheduled to fsdp at step 10"));
  EXPECT_EQ(code(Report(0, r, "ps", "pipeline")).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(Report(0, r, "mpi", "fsdp")).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(Report(0, r, "ps", "fsdp", -1.0)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(Report(0, r, "ps", "fsdp", std::numeric_limits<double>::quiet_NaN())).code(),
            absl::StatusCode::kInvalidArgument);
  MustAck(s, Report(0, r, "ps", "fsdp"));
  st = code(Report(1, r, "allreduce", "fsdp"));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(st), HasSubstr("earlier report said from ps"));
  EXPECT_THAT(View(s).pending_switches(0).acked_ranks(), ElementsAre(0));
}

TEST_F(SwitchScheduleTest, SwitchesDoneOutOfOrderLeaveTheModeOfTheLatestStep) {
  SwitchSchedule s(Options(1));
  SwitchModeResponse first = MustSchedule(s, "fsdp", 10);
  SwitchModeResponse second = MustSchedule(s, "pipeline", 20);
  EXPECT_TRUE(MustAck(s, Report(0, second, "fsdp", "pipeline")).done);
  EXPECT_EQ(s.mode(), "pipeline");
  EXPECT_TRUE(MustAck(s, Report(0, first, "ps", "fsdp")).done);
  EXPECT_EQ(s.mode(), "pipeline");
  ClusterView v = View(s);
  ASSERT_EQ(v.switches_size(), 2);
  EXPECT_EQ(v.switches(0).switch_id(), 2) << "in the order they completed";
  EXPECT_EQ(v.switches(1).switch_id(), 1);
}

}  // namespace
}  // namespace pscluster::coord
