// The workers' recovery through ClusterState: who may call, the generation check, the
// view and its version, and the record kept across a coordinator restart. The schedule's
// own rules are tested in recovery_schedule_test.cc.
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/cluster_view.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/coordinator.pb.h"
#include "server/coordinator/cluster_state.h"

namespace pscluster::coord {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

const absl::Time kStart = absl::FromUnixSeconds(1'700'000'000);

ReportStoppedRequest Stopped(int32_t rank, int64_t incarnation, const std::string& gen) {
  ReportStoppedRequest r;
  r.set_rank(rank);
  r.set_incarnation(incarnation);
  r.set_generation(gen);
  return r;
}

DecideRollbackRequest Decide(int64_t incarnation, const std::string& gen, int64_t step) {
  DecideRollbackRequest r;
  r.set_rank(0);
  r.set_incarnation(incarnation);
  r.set_generation(gen);
  r.set_step(step);
  return r;
}

class ClusterStateRecoveryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ClusterStateOptions o;
    o.num_shards = 0;
    o.num_workers = 2;
    o.mode = ALLREDUCE;
    o.on_change = [this](const CoordinatorState& s) { saved_ = s; };
    cluster_ = std::make_unique<ClusterState>(o, [] { return kStart; });
    for (int w = 0; w < 2; ++w) Register(w);
  }

  void Register(int rank) {
    RegisterRequest r;
    r.set_role(WORKER);
    r.set_id(rank);
    r.set_address("w" + std::to_string(rank));
    ASSERT_TRUE(cluster_->Register(r).ok());
  }

  RecordRunRequest Run(int64_t incarnation, bool started) {
    RecordRunRequest r;
    r.set_rank(0);
    r.set_incarnation(incarnation);
    r.add_flags("--seed=7");
    r.set_started(started);
    return r;
  }

  std::unique_ptr<ClusterState> cluster_;
  CoordinatorState saved_;
};

TEST_F(ClusterStateRecoveryTest, TheRunRecordIsRankZerosAndInTheView) {
  const int64_t before = cluster_->View().version();
  EXPECT_EQ(cluster_->RecordRun(Run(/*incarnation=*/9, false)).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(cluster_->View().version(), before);  // a refused call changes nothing
  ASSERT_TRUE(cluster_->RecordRun(Run(1, false)).ok());
  ASSERT_TRUE(cluster_->RecordRun(Run(1, true)).ok());
  const ClusterView v = cluster_->View();
  EXPECT_EQ(v.version(), before + 2);
  EXPECT_THAT(v.run().flags(), ElementsAre("--seed=7"));
  EXPECT_TRUE(v.run().started());
  EXPECT_TRUE(saved_.run().started());
}

TEST_F(ClusterStateRecoveryTest, AStaleGenerationIsAbortedAndChangesNothing) {
  const std::string first = Generation(cluster_->View());
  Register(1);  // rank 1 restarted: incarnation 2, a new generation
  const std::string now = Generation(cluster_->View());
  ASSERT_NE(first, now);
  const int64_t before = cluster_->View().version();
  absl::StatusOr<Rollback> stale = cluster_->ReportStopped(Stopped(0, 1, first));
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(stale.status().message(), HasSubstr("roll back in that one"));
  EXPECT_EQ(cluster_->ReportStopped(Stopped(1, 1, now)).status().code(),
            absl::StatusCode::kNotFound);  // the old incarnation of rank 1
  EXPECT_EQ(cluster_->View().version(), before);
  EXPECT_TRUE(cluster_->View().rollback().generation().empty());
}

TEST_F(ClusterStateRecoveryTest, EveryWorkerStopsThenRankZeroDecides) {
  Register(1);
  const std::string gen = Generation(cluster_->View());
  const int64_t before = cluster_->View().version();
  ASSERT_TRUE(cluster_->ReportStopped(Stopped(1, 2, gen)).ok());
  EXPECT_EQ(cluster_->DecideRollback(Decide(1, gen, 30)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // Each report is a new version of the view, which shows who stopped.
  ASSERT_TRUE(cluster_->ReportStopped(Stopped(0, 1, gen)).ok());
  absl::StatusOr<ClusterView> woke =
      cluster_->AwaitView(before + 2, false, kStart + absl::Seconds(1));
  ASSERT_TRUE(woke.ok()) << woke.status();
  EXPECT_THAT(woke->rollback().stopped_ranks(), ElementsAre(0, 1));
  absl::StatusOr<Rollback> decided = cluster_->DecideRollback(Decide(1, gen, 30));
  ASSERT_TRUE(decided.ok()) << decided.status();
  EXPECT_TRUE(decided->decided());
  EXPECT_EQ(cluster_->View().rollback().step(), 30);
  EXPECT_EQ(saved_.rollback().step(), 30);
}

TEST_F(ClusterStateRecoveryTest, ARestartedCoordinatorKeepsTheRecord) {
  ASSERT_TRUE(cluster_->RecordRun(Run(1, true)).ok());
  const std::string gen = Generation(cluster_->View());
  ASSERT_TRUE(cluster_->ReportStopped(Stopped(0, 1, gen)).ok());
  ClusterStateOptions o;
  o.num_shards = 0;
  o.num_workers = 2;
  o.mode = ALLREDUCE;
  ClusterState restarted(o, [] { return kStart; });
  ASSERT_TRUE(restarted.Restore(saved_).ok());
  const ClusterView v = restarted.View();
  EXPECT_TRUE(v.run().started());
  EXPECT_EQ(Generation(v), gen);  // the same incarnations: the rollback goes on
  EXPECT_TRUE(restarted.ReportStopped(Stopped(1, 1, gen)).ok());
  EXPECT_TRUE(restarted.DecideRollback(Decide(1, gen, 0)).ok());
}

}  // namespace
}  // namespace pscluster::coord
