// Clients follow the cluster's view when a chain changes (issue 49). The workers' shard
// client asks the coordinator's view where a shard's chain is after a replica did not take
// a call (client/coordinator/chain_watch.h), instead of retrying the addresses it read at
// start until its deadline (2 minutes):
// - a replica that was killed, restarted on a new port and rejoined as the tail becomes the
//   head when the other replica is killed: the workers call it at its new address, and the
//   run goes on with no rollback;
// - both replicas of a chain killed: the shard's state is gone, and the workers stop and
//   roll back as soon as the coordinator has declared them dead.
// And a replica that does not take a call is reported to the coordinator, which probes it
// and takes it out of its chain at once if it does not answer (server/coordinator/
// replica_prober.h): at the default liveness timeout (5 s) a head's or a tail's death
// pauses training for well under a second, not for the timeout.
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

// Two replicas a shard, at ps_coordinator's default liveness timeout (5 s): what is
// measured is the reports' path, not the timeout's.
ClusterOptions AtTheDefaults(int epochs = 4) {
  ClusterOptions o = Replicated(2);
  o.heartbeat_timeout_ms = 5000;
  o.epochs = epochs;
  return o;
}

class FailoverTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    clean_ = new std::vector<std::string>(
        Cluster(::testing::TempDir() + "/uninterrupted", ClusterOptions()).Finish());
  }
  static void TearDownTestSuite() { delete clean_; }
  static std::vector<std::string>* clean_;
};
std::vector<std::string>* FailoverTest::clean_ = nullptr;

void AwaitEpochCheckpoint(Cluster& cluster) {
  ASSERT_TRUE(cluster.coordinator()
                  .WaitForLine(absl::StrCat("checkpoint of step ", kStepsPerEpoch, " complete"),
                               absl::Minutes(2))
                  .ok());
}

void AwaitCoordinatorLine(Cluster& cluster, const std::string& line) {
  ASSERT_TRUE(cluster.coordinator().WaitForLine(line, absl::Seconds(60)).ok()) << line;
}

TEST_F(FailoverTest, ARejoinedReplicaOnANewPortBecomesHeadAndTheWorkersFollowIt) {
  // 16 epochs: long enough for a kill, a restart, a rejoin and a second kill.
  Cluster cluster(::testing::TempDir() + "/rejoined", AtTheDefaults(16));
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
  // The killed partner back: it joins the chain the rejoined replica now heads, and every
  // replica's fingerprint (exactly the replicated state) equals its head's again.
  cluster.StartShard(1, /*restore=*/false, 1);
  AwaitCoordinatorLine(cluster, "shard 1 replica 1 joined its chain");
  ExpectReplicasEqual(cluster, 2);
}

TEST_F(FailoverTest, BothReplicasOfAChainKilledRollTheWorkersBackWithoutWaitingOutTheirDeadline) {
  Cluster cluster(::testing::TempDir() + "/both_killed", AtTheDefaults());
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
      "timeout 5000 ms)\n",
      absl::ToDoubleMilliseconds(absl::Now() - killed));
  std::fflush(stdout);
  cluster.StartShard(1, /*restore=*/true, 0);
  cluster.StartShard(1, /*restore=*/true, 1);
  const std::vector<std::string> run = cluster.Finish();
  EXPECT_NE(Field(run[0], "rollbacks"), "[]") << run[0];
  for (int r = 0; r < kWorkers; ++r) {
    EXPECT_EQ(Field(run[r], "param_crc32c"), Field((*clean_)[r], "param_crc32c"))
        << "the final parameters differ from the uninterrupted run's";
  }
}

// Kills replica `replica` of shard 1 and prints the pause in training; the coordinator must
// have taken it out on a report, not by the timeout.
void KillAtTheDefaultLiveness(const std::string& name, int replica,
                              const std::vector<std::string>& clean) {
  Cluster cluster(::testing::TempDir() + "/" + name, AtTheDefaults());
  AwaitEpochCheckpoint(cluster);
  auto survivor = StubTo(cluster.shard_address(1, 1 - replica));
  const int64_t tables = Tables(survivor.get());
  const int64_t at_kill = PushesApplied(survivor.get());
  const absl::Time killed = absl::Now();
  ASSERT_TRUE(cluster.shard(1, replica).Stop(SIGKILL, absl::Seconds(20)).ok());
  const absl::Duration pause = AwaitTrainingAgain(survivor.get(), tables, killed, at_kill);
  std::printf("%s: training paused %.0f ms (liveness timeout 5000 ms)\n", name.c_str(),
              absl::ToDoubleMilliseconds(pause));
  std::fflush(stdout);
  EXPECT_TRUE(cluster.coordinator()
                  .WaitForLine(absl::StrCat("shard 1 replica ", replica, " (",
                                            cluster.shard_address(1, replica),
                                            ") reported unreachable and does not answer"),
                               absl::Seconds(30))
                  .ok());
  ExpectNoRollbackAndSameParameters(cluster.Finish(), clean);
}

TEST_F(FailoverTest, AHeadKilledAtTheDefaultLivenessIsTakenOutOnTheWorkersReport) {
  KillAtTheDefaultLiveness("head_killed", 0, *clean_);
}

TEST_F(FailoverTest, ATailKilledAtTheDefaultLivenessIsTakenOutOnTheHeadsReport) {
  KillAtTheDefaultLiveness("tail_killed", 1, *clean_);
}

}  // namespace
}  // namespace pscluster::testing
