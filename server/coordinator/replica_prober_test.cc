// ReplicaProber with a probe the test decides: a report alone changes nothing, a replica
// that does not answer the coordinator's probe leaves its chain at once, one that answers
// stays, and many reports of one replica make one probe.
#include "server/coordinator/replica_prober.h"

#include <atomic>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace pscluster::coord {
namespace {

// A cluster of one shard in a formed chain of two replicas (r0 the head), and a worker.
class ReplicaProberTest : public ::testing::Test {
 protected:
  ReplicaProberTest() : cluster_(Options()) {
    for (int r = 0; r < 2; ++r) {
      RegisterRequest req;
      req.set_role(SHARD);
      req.set_id(0);
      req.set_replica(r);
      req.set_address(absl::StrCat("127.0.0.1:500", r));
      EXPECT_TRUE(cluster_.Register(req).ok());
    }
  }
  static ClusterStateOptions Options() {
    ClusterStateOptions o;
    o.num_shards = 1;
    o.num_workers = 1;
    o.replicas = 2;
    return o;
  }
  std::vector<int32_t> Chain() const {
    const ClusterView view = cluster_.View();
    return {view.chains(0).replicas().begin(), view.chains(0).replicas().end()};
  }
  // Waits (bounded) until `n` probes were decided.
  static bool Decided(const ReplicaProber& prober, int64_t n) {
    for (const absl::Time end = absl::Now() + absl::Seconds(10); absl::Now() < end;) {
      if (prober.confirmed() + prober.refuted() >= n) return true;
      absl::SleepFor(absl::Milliseconds(1));
    }
    return false;
  }

  ClusterState cluster_;
};

TEST_F(ReplicaProberTest, AReplicaThatDoesNotAnswerTheProbeLeavesItsChainAtOnce) {
  ASSERT_EQ(Chain(), (std::vector<int32_t>{0, 1}));
  std::atomic<int> probes{0};
  ReplicaProber prober(&cluster_, [&](const std::string& address, absl::Duration) {
    ++probes;
    return address == "127.0.0.1:5000" ? absl::UnavailableError("refused") : absl::OkStatus();
  });
  const int64_t before = cluster_.View().version();
  EXPECT_TRUE(prober.Report(0, "127.0.0.1:5000"));
  ASSERT_TRUE(cluster_.AwaitView(before + 1, false, absl::Now() + absl::Seconds(10)).ok());
  EXPECT_EQ(Chain(), (std::vector<int32_t>{1}));
  EXPECT_FALSE(cluster_.View().members(0).alive());
  ASSERT_TRUE(Decided(prober, 1));
  EXPECT_EQ(prober.confirmed(), 1);
  EXPECT_EQ(probes.load(), 1);
}

TEST_F(ReplicaProberTest, AReplicaThatAnswersStaysAndTheReportChangesNothing) {
  ReplicaProber prober(&cluster_,
                       [](const std::string&, absl::Duration) { return absl::OkStatus(); });
  const ClusterView before = cluster_.View();
  EXPECT_TRUE(prober.Report(0, "127.0.0.1:5000"));
  ASSERT_TRUE(Decided(prober, 1));
  EXPECT_EQ(prober.refuted(), 1);
  EXPECT_EQ(cluster_.View().version(), before.version());
  EXPECT_EQ(Chain(), (std::vector<int32_t>{0, 1}));
}

TEST_F(ReplicaProberTest, ReportsOfNoLiveReplicaOrOfOneBeingProbedStartNoProbe) {
  absl::Notification release;
  std::atomic<int> probes{0};
  ReplicaProber prober(&cluster_, [&](const std::string&, absl::Duration) {
    ++probes;
    release.WaitForNotificationWithTimeout(absl::Seconds(10));
    return absl::OkStatus();
  });
  EXPECT_FALSE(prober.Report(0, "127.0.0.1:6000"));  // no replica there
  EXPECT_FALSE(prober.Report(1, "127.0.0.1:5000"));  // no such shard
  EXPECT_TRUE(prober.Report(0, "127.0.0.1:5001"));
  for (int i = 0; i < 100; ++i) EXPECT_FALSE(prober.Report(0, "127.0.0.1:5001"));
  release.Notify();
  ASSERT_TRUE(Decided(prober, 1));
  EXPECT_FALSE(prober.Report(0, "127.0.0.1:5001"));  // probed moments ago (kQuiet)
  EXPECT_EQ(probes.load(), 1);
}

TEST_F(ReplicaProberTest, AVerdictOnAnOldIncarnationChangesNothing) {
  absl::Notification release;
  ReplicaProber prober(&cluster_, [&](const std::string&, absl::Duration) {
    release.WaitForNotificationWithTimeout(absl::Seconds(10));
    return absl::UnavailableError("refused");
  });
  EXPECT_TRUE(prober.Report(0, "127.0.0.1:5001"));
  RegisterRequest again;  // replica 1 restarts meanwhile: a new incarnation
  again.set_role(SHARD);
  again.set_id(0);
  again.set_replica(1);
  again.set_address("127.0.0.1:5001");
  ASSERT_TRUE(cluster_.Register(again).ok());
  const int64_t version = cluster_.View().version();
  release.Notify();
  ASSERT_TRUE(Decided(prober, 1));
  EXPECT_EQ(prober.refuted(), 1);
  EXPECT_EQ(cluster_.View().version(), version);
}

}  // namespace
}  // namespace pscluster::coord
