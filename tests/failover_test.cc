// Clients follow the cluster's view when a chain changes (issue 49). The workers' shard
// client asks the coordinator's view where a shard's chain is after a replica did not take
// a call (client/coordinator/chain_watch.h), instead of retrying the addresses it read at
// start until its deadline (2 minutes):
// - a replica that was killed, restarted on a new port and rejoined as the tail becomes the
//   head when the other replica is killed: the workers call it at its new address, and the
//   run goes on with no rollback;
// - both replicas of a chain killed: the shard's state is gone, and the workers stop and
//   roll back as soon as the coordinator has declared them dead.
#include <signal.h>

#include <cstdio>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/fault_cluster.h"
#include "tests/replication_probes.h"

namespace pscluster::testing {
namespace {

void AwaitEpochCheckpoint(Cluster& cluster) {
  ASSERT_TRUE(cluster.coordinator()
                  .WaitForLine(absl::StrCat("checkpoint of step ", kStepsPerEpoch, " complete"),
                               absl::Minutes(2))
                  .ok());
}

void AwaitCoordinatorLine(Cluster& cluster, const std::string& line) {
  ASSERT_TRUE(cluster.coordinator().WaitForLine(line, absl::Seconds(60)).ok()) << line;
}

TEST(FailoverTest, ARejoinedReplicaOnANewPortBecomesHeadAndTheWorkersFollowIt) {
  ClusterOptions options = Replicated(2);
  options.epochs = 16;  // long enough for a kill, a restart, a rejoin and a second kill
  Cluster cluster(::testing::TempDir() + "/rejoined", options);
  AwaitEpochCheckpoint(cluster);
  const std::string first_address = cluster.shard_address(1, 0);
  ASSERT_TRUE(cluster.shard(1, 0).Stop(SIGKILL, absl::Seconds(20)).ok());
  AwaitCoordinatorLine(cluster, "shard 1 replica 0 left its chain");
  cluster.StartShard(1, /*restore=*/false, 0);
  AwaitCoordinatorLine(cluster, "shard 1 replica 0 joined its chain");
  ASSERT_NE(cluster.shard_address(1, 0), first_address) << "restarted on the same port";
  ASSERT_FALSE(std::filesystem::exists(cluster.dir() + "/worker0.json"))
      << "training ended before the second kill: the test shows nothing";

  auto rejoined = StubTo(cluster.shard_address(1, 0));
  const int64_t tables = Tables(rejoined.get());
  const int64_t at_kill = PushesApplied(rejoined.get());
  const absl::Time killed = absl::Now();
  ASSERT_TRUE(cluster.shard(1, 1).Stop(SIGKILL, absl::Seconds(20)).ok());
  const absl::Duration pause = AwaitTrainingAgain(rejoined.get(), tables, killed, at_kill);
  std::printf("pause after the head's kill, the rejoined replica (new port) made head: %.0f ms\n",
              absl::ToDoubleMilliseconds(pause));
  std::fflush(stdout);
  const std::vector<std::string> run = cluster.Finish();
  for (int r = 0; r < kWorkers; ++r) {
    EXPECT_EQ(Field(run[r], "rollbacks"), "[]") << "worker " << r << " rolled back: " << run[r];
    EXPECT_GT(std::stod(Field(run[r], "test_accuracy")), 0.9) << run[r];
  }
}

TEST(FailoverTest, BothReplicasOfAChainKilledRollTheWorkersBackWithoutWaitingOutTheirDeadline) {
  Cluster cluster(::testing::TempDir() + "/both_killed", Replicated(2));
  AwaitEpochCheckpoint(cluster);
  ASSERT_TRUE(cluster.shard(1, 1).Stop(SIGKILL, absl::Seconds(20)).ok());
  const absl::Time killed = absl::Now();
  ASSERT_TRUE(cluster.shard(1, 0).Stop(SIGKILL, absl::Seconds(20)).ok());
  // Before the replicas come back: the workers' calls (deadline 2 minutes) must give up on
  // the view's word that the chain is gone, not by running out.
  for (int r = 0; r < kWorkers; ++r) {
    auto stopped = cluster.worker(r).WaitForLine("waiting for the cluster to be whole again",
                                                 absl::Seconds(30));
    ASSERT_TRUE(stopped.ok()) << "worker " << r << ": " << stopped.status();
  }
  std::printf(
      "both replicas of shard 1 killed: the workers stopped %.0f ms after (liveness "
      "timeout 600 ms)\n",
      absl::ToDoubleMilliseconds(absl::Now() - killed));
  std::fflush(stdout);
  cluster.StartShard(1, /*restore=*/true, 0);
  cluster.StartShard(1, /*restore=*/true, 1);
  const std::vector<std::string> run = cluster.Finish();
  EXPECT_NE(Field(run[0], "rollbacks"), "[]") << run[0];
  for (int r = 0; r < kWorkers; ++r) {
    EXPECT_GT(std::stod(Field(run[r], "test_accuracy")), 0.9) << run[r];
  }
}

}  // namespace
}  // namespace pscluster::testing
