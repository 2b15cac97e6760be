// Live mode switches through ClusterState: who may poll and report, the view's version and
// mode, blocking readers, and workers as threads agreeing on one step. The schedule's own
// rules are tested in mode_switch_test.cc.
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/coordinator.pb.h"
#include "server/coordinator/cluster_state.h"

namespace pscluster::coord {
namespace {

using ::testing::ElementsAre;

const absl::Time kStart = absl::FromUnixSeconds(1'700'000'000);

SwitchModeRequest Switch(TrainingMode mode, int64_t at_step) {
  SwitchModeRequest r;
  r.set_mode(mode);
  r.set_at_step(at_step);
  return r;
}

PollSwitchRequest Poll(int32_t rank, int64_t incarnation, int64_t step) {
  PollSwitchRequest r;
  r.set_rank(rank);
  r.set_incarnation(incarnation);
  r.set_step(step);
  return r;
}

ReportSwitchRequest Report(int32_t rank, int64_t incarnation, const SwitchModeResponse& s,
                           TrainingMode from, TrainingMode to, double handoff = 0.5) {
  ReportSwitchRequest r;
  r.set_rank(rank);
  r.set_incarnation(incarnation);
  r.set_switch_id(s.switch_id());
  r.set_at_step(s.at_step());
  r.set_from_mode(from);
  r.set_to_mode(to);
  r.set_handoff_seconds(handoff);
  return r;
}

class ClusterStateSwitchTest : public ::testing::Test {
 protected:
  // A coordinator with `workers` registered workers (incarnation 1 each).
  void Start(int workers, int shards = 1, TrainingMode mode = PS) {
    ClusterStateOptions o;
    o.num_shards = shards;
    o.num_workers = workers;
    o.mode = mode;
    cluster_ = std::make_unique<ClusterState>(o, [] { return kStart; });
    for (int w = 0; w < workers; ++w) {
      RegisterRequest r;
      r.set_role(WORKER);
      r.set_id(w);
      r.set_address("w" + std::to_string(w));
      ASSERT_TRUE(cluster_->Register(r).ok());
    }
  }

  SwitchModeResponse MustSwitch(TrainingMode mode, int64_t at_step) {
    absl::StatusOr<SwitchModeResponse> r = cluster_->SwitchMode(Switch(mode, at_step));
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : SwitchModeResponse();
  }

  std::unique_ptr<ClusterState> cluster_;
};

TEST_F(ClusterStateSwitchTest, ASwitchAtOrPastTheRunsEndIsRefused) {
  Start(2);
  MustSwitch(FSDP, 5000);  // no worker has said where its run ends: not checked
  MustSwitch(ALLREDUCE, 1000);
  ASSERT_EQ(cluster_->View().pending_switches_size(), 2);
  for (int w = 0; w < 2; ++w) {
    ReportProgressRequest p;
    p.set_rank(w);
    p.set_incarnation(1);
    p.set_step(10);
    p.set_view_version(cluster_->View().version());
    p.set_run_end_step(w == 0 ? 1404 : 1400);
    ASSERT_TRUE(cluster_->ReportProgress(p).ok());
  }
  // The switch the run never reaches was dropped when the first worker said where it ends;
  // the one before the end stays.
  ASSERT_EQ(cluster_->View().pending_switches_size(), 1);
  EXPECT_EQ(cluster_->View().pending_switches(0).at_step(), 1000);
  const int64_t version = cluster_->View().version();
  for (int64_t at : {1400, 1404, 99999}) {
    absl::StatusOr<SwitchModeResponse> r = cluster_->SwitchMode(Switch(ALLREDUCE, at));
    EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << at;
    EXPECT_THAT(std::string(r.status().message()),
                ::testing::HasSubstr("the run ends at step 1400 (worker 1"));
  }
  EXPECT_EQ(cluster_->View().version(), version) << "a refused switch changes nothing";
  EXPECT_EQ(MustSwitch(FSDP, 1399).at_step(), 1399);
  ReportProgressRequest bad;
  bad.set_rank(0);
  bad.set_incarnation(1);
  bad.set_view_version(cluster_->View().version());
  bad.set_run_end_step(-1);
  EXPECT_EQ(cluster_->ReportProgress(bad).code(), absl::StatusCode::kInvalidArgument);
  bad.set_run_end_step(1404);
  bad.set_step(1405);  // past its own end
  EXPECT_EQ(cluster_->ReportProgress(bad).code(), absl::StatusCode::kInvalidArgument);
  // At step 0 (the next boundary), once the workers polled up to the run's end: refused too.
  for (int w = 0; w < 2; ++w) ASSERT_TRUE(cluster_->PollSwitch(Poll(w, 1, 1400)).ok());
  absl::StatusOr<SwitchModeResponse> next = cluster_->SwitchMode(Switch(PIPELINE, 0));
  EXPECT_EQ(next.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(next.status().message()), ::testing::HasSubstr("switch at step 1401"));
}

TEST_F(ClusterStateSwitchTest, ViewStartsInTheConfiguredMode) {
  Start(1, 0, PIPELINE);
  EXPECT_EQ(cluster_->View().mode(), PIPELINE);
  EXPECT_EQ(cluster_->View().switches_size(), 0);
}

TEST_F(ClusterStateSwitchTest, UnregisteredOrReplacedWorkerGetsReportProgresssError) {
  Start(2);
  ReportProgressRequest progress;
  progress.set_rank(1);
  progress.set_incarnation(2);  // rank 1 is at incarnation 1
  progress.set_view_version(cluster_->View().version());
  const absl::Status expected = cluster_->ReportProgress(progress);
  ASSERT_EQ(expected.code(), absl::StatusCode::kNotFound);

  EXPECT_EQ(cluster_->PollSwitch(Poll(1, 2, 0)).status(), expected);
  SwitchModeResponse s = MustSwitch(FSDP, 5);
  EXPECT_EQ(cluster_->ReportSwitch(Report(1, 2, s, PS, FSDP)).status(), expected);

  absl::Status out_of_range = cluster_->PollSwitch(Poll(2, 1, 0)).status();
  EXPECT_EQ(out_of_range.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(out_of_range, cluster_->ReportSwitch(Report(2, 1, s, PS, FSDP)).status());
  EXPECT_EQ(cluster_->View().pending_switches(0).acked_ranks_size(), 0);
}

TEST_F(ClusterStateSwitchTest, SchedulingBumpsTheVersionAndPollsAndNoOpsDoNot) {
  Start(1);
  const int64_t v0 = cluster_->View().version();
  ASSERT_TRUE(cluster_->PollSwitch(Poll(0, 1, 7)).ok());
  EXPECT_EQ(cluster_->View().version(), v0);
  EXPECT_TRUE(MustSwitch(PS, 0).no_op());
  EXPECT_EQ(cluster_->View().version(), v0);
  SwitchModeResponse s = MustSwitch(ALLREDUCE, 0);
  EXPECT_EQ(s.at_step(), 8) << "one past the polled step";
  EXPECT_EQ(cluster_->View().version(), v0 + 1);
  EXPECT_EQ(cluster_->SwitchMode(Switch(FSDP, 7)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(cluster_->View().version(), v0 + 1);
}

TEST_F(ClusterStateSwitchTest, ASwitchARegisteredWorkersModelCannotTakeIsRefusedUnscheduled) {
  Start(2);
  RegisterRequest r;  // worker 1 again, as ps_worker registers: with its model's limits
  r.set_role(WORKER);
  r.set_id(1);
  r.set_address("w1");
  r.mutable_limits()->set_model("mlp");
  r.mutable_limits()->set_layers(1);
  ASSERT_TRUE(cluster_->Register(r).ok());
  const ClusterView before = cluster_->View();
  for (TrainingMode m : {TENSOR, PIPELINE}) {
    absl::StatusOr<SwitchModeResponse> s = cluster_->SwitchMode(Switch(m, 0));
    EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(s.status().message().find("worker 1's model cannot switch"), std::string::npos)
        << s.status();
  }
  EXPECT_EQ(cluster_->View().SerializeAsString(), before.SerializeAsString());

  r.mutable_limits()->set_layers(2);  // restarted with a deeper model: pipeline fits 2 workers
  ASSERT_TRUE(cluster_->Register(r).ok());
  EXPECT_FALSE(MustSwitch(PIPELINE, 0).no_op());
}

// What the workers would find wrong only at the switch (and stop there, every one of them)
// is refused when the switch is asked for: micro-batches that do not divide the global
// batch, and any mode but ps for a model with embedding tables (allreduce included).
TEST_F(ClusterStateSwitchTest, ASwitchTheWorkersWouldFailAtIsRefusedWhenAskedFor) {
  Start(2);
  RegisterRequest r;
  r.set_role(WORKER);
  r.set_id(1);
  r.set_address("w1");
  r.mutable_limits()->set_model("mlp");
  r.mutable_limits()->set_layers(4);
  r.mutable_limits()->set_batch_size(8);
  r.mutable_limits()->set_micro_batches(100);
  ASSERT_TRUE(cluster_->Register(r).ok());
  absl::StatusOr<SwitchModeResponse> s = cluster_->SwitchMode(Switch(PIPELINE, 0));
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.status().message().find("global batch of 16 examples into --micro_batches=100"),
            std::string::npos)
      << s.status();
  r.mutable_limits()->set_micro_batches(4);
  r.mutable_limits()->set_model("embedding");
  r.mutable_limits()->set_embedding_tables(true);
  ASSERT_TRUE(cluster_->Register(r).ok());
  for (TrainingMode m : {ALLREDUCE, FSDP}) {
    s = cluster_->SwitchMode(Switch(m, 0));
    EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(s.status().message().find("ps"), std::string::npos) << s.status();
    EXPECT_EQ(s.status().message().find("allreduce"), std::string::npos)
        << "recommends a mode that fails: " << s.status();
  }
}

TEST_F(ClusterStateSwitchTest, EachNewReportBumpsTheVersionAndTheLastSetsTheMode) {
  Start(2);
  SwitchModeResponse s = MustSwitch(FSDP, 3);
  const int64_t v0 = cluster_->View().version();
  absl::StatusOr<ReportSwitchResponse> r = cluster_->ReportSwitch(Report(0, 1, s, PS, FSDP, 1.5));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->done());
  ClusterView v = cluster_->View();
  EXPECT_EQ(v.version(), v0 + 1);
  EXPECT_EQ(v.mode(), PS);
  EXPECT_THAT(v.pending_switches(0).acked_ranks(), ElementsAre(0));
  ASSERT_TRUE(cluster_->ReportSwitch(Report(0, 1, s, PS, FSDP)).ok());  // a retry
  EXPECT_EQ(cluster_->View().version(), v0 + 1);

  r = cluster_->ReportSwitch(Report(1, 1, s, PS, FSDP, 2.5));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->done());
  v = cluster_->View();
  EXPECT_EQ(v.version(), v0 + 2);
  EXPECT_EQ(v.mode(), FSDP);
  ASSERT_EQ(v.switches_size(), 1);
  EXPECT_EQ(v.switches(0).from_mode(), PS);
  EXPECT_DOUBLE_EQ(v.switches(0).handoff_seconds(), 2.5);
  EXPECT_EQ(v.switches(0).unix_ms(), absl::ToUnixMillis(kStart));
}

TEST_F(ClusterStateSwitchTest, BlockingReaderWakesWhenTheSwitchIsDone) {
  Start(2);
  SwitchModeResponse s = MustSwitch(PIPELINE, 1);
  ASSERT_TRUE(cluster_->ReportSwitch(Report(1, 1, s, PS, PIPELINE)).ok());
  const int64_t waiting_for = cluster_->View().version() + 1;
  absl::StatusOr<ClusterView> seen;
  std::thread reader([&] {  // whether it blocks before or after the report, it sees it
    seen = cluster_->AwaitView(waiting_for, false, absl::Now() + absl::Minutes(1));
  });
  ASSERT_TRUE(cluster_->ReportSwitch(Report(0, 1, s, PS, PIPELINE)).ok());
  reader.join();
  ASSERT_TRUE(seen.ok()) << seen.status();
  EXPECT_EQ(seen->mode(), PIPELINE);
  EXPECT_EQ(seen->switches_size(), 1);
}

// Workers as threads, stepping as fast as they can while the operator schedules "the next
// boundary": every worker takes the switch at the step it was given, exactly once.
TEST_F(ClusterStateSwitchTest, WorkersRacingTheScheduleAllSwitchAtTheAssignedStep) {
  constexpr int kWorkers = 4;
  constexpr int64_t kGateStep = 1000;  // workers wait here until the switch is scheduled
  Start(kWorkers);
  absl::Notification scheduled;
  std::vector<std::vector<int64_t>> taken(kWorkers);  // steps each worker switched at
  std::vector<std::thread> workers;
  for (int rank = 0; rank < kWorkers; ++rank) {
    workers.emplace_back([&, rank] {
      for (int64_t step = 0; step < kGateStep + 10; ++step) {
        if (step == kGateStep) scheduled.WaitForNotification();
        absl::StatusOr<PollSwitchResponse> p = cluster_->PollSwitch(Poll(rank, 1, step));
        ASSERT_TRUE(p.ok()) << p.status();
        if (!p->pending() || p->at_step() != step) continue;
        taken[rank].push_back(step);
        SwitchModeResponse s;
        s.set_switch_id(p->switch_id());
        s.set_at_step(p->at_step());
        ASSERT_TRUE(cluster_->ReportSwitch(Report(rank, 1, s, PS, p->mode())).ok());
      }
    });
  }
  SwitchModeResponse s = MustSwitch(FSDP, 0);
  scheduled.Notify();
  for (auto& w : workers) w.join();
  EXPECT_LE(s.at_step(), kGateStep + 1);
  for (int rank = 0; rank < kWorkers; ++rank) {
    EXPECT_THAT(taken[rank], ElementsAre(s.at_step())) << "rank " << rank;
  }
  ClusterView v = cluster_->View();
  EXPECT_EQ(v.mode(), FSDP);
  ASSERT_EQ(v.switches_size(), 1);
  EXPECT_EQ(v.switches(0).at_step(), s.at_step());
}

}  // namespace
}  // namespace pscluster::coord
