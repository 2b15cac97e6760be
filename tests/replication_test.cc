// Replicated shards with real processes: a coordinator with --replicas=2, 2 shards of 2
// chain-replicated ps_server replicas each, and 2 workers training under BSP (synthetic data).
// The head of a chain is killed with SIGKILL, or stopped past the liveness timeout and let go
// again (a primary cut off, then reconnected), in the middle of training. Either way the
// coordinator takes it out of its chain, the backup becomes the head, the workers' calls
// follow it, and training goes on with no rollback: the final parameters are bitwise those
// of an uninterrupted run, and of a run without replicas. A head that comes back holds no
// authority: it refuses the pushes of clients that still know it as the head, and joins the
// chain again as its tail by a state transfer, as a replacement replica does; every replica
// ends with bitwise the same state (Stats fingerprints).
#include <signal.h>

#include <cstdio>
#include <filesystem>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/ps/shard_stub.h"
#include "common/call_metadata.h"
#include "common/sharding.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/ps.grpc.pb.h"
#include "tests/fault_cluster.h"
#include "tests/replication_probes.h"
#include "tests/test_tables.h"

namespace pscluster {
namespace {

using testing::AwaitTrainingAgain;
using testing::Cluster;
using testing::ClusterOptions;
using testing::ExpectNoRollbackAndSameParameters;
using testing::ExpectReplicasEqual;
using testing::Field;
using testing::Fingerprint;
using testing::kStepsPerEpoch;
using testing::kWorkers;
using testing::PushesApplied;
using testing::Replicated;
using testing::StubTo;
using testing::Tables;

std::string StatsOf(pscluster::ShardStub* stub) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  ps::StatsResponse stats;
  grpc::Status s = stub->Stats(&ctx, ps::StatsRequest(), &stats);
  return s.ok() ? stats.DebugString() : s.error_message();
}

class ReplicationTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    unreplicated_ = new std::vector<std::string>(
        Cluster(::testing::TempDir() + "/unreplicated", Replicated(1)).Finish());
  }
  static void TearDownTestSuite() { delete unreplicated_; }
  static std::vector<std::string>* unreplicated_;
};
std::vector<std::string>* ReplicationTest::unreplicated_ = nullptr;

TEST_F(ReplicationTest, ReplicasHoldTheSameStateAndChangeNothingInTheResult) {
  for (int replicas : {2, 3}) {
    SCOPED_TRACE(absl::StrCat(replicas, " replicas"));
    Cluster cluster(absl::StrCat(::testing::TempDir(), "/replicated", replicas),
                    Replicated(replicas));
    ExpectNoRollbackAndSameParameters(cluster.Finish(), *unreplicated_);
    ExpectReplicasEqual(cluster, replicas);
  }
}

// A collective mode writes its state into the shards (rank 0 at every epoch's end, and the
// switch into ps mode), each table's import making its chain the head alone first. The
// tables were imported concurrently, and every import but the first was refused (their
// shrinks named a stale chain epoch): the first epoch's end failed the run with replicas.
TEST_F(ReplicationTest, CollectiveModesWriteIntoReplicatedShardsAsIntoOne) {
  ClusterOptions o = Replicated(2);
  o.mode = "allreduce";
  o.epochs = 3;
  o.switches = {absl::StrCat(kStepsPerEpoch + kStepsPerEpoch / 2, ":ps")};
  ClusterOptions single = o;
  single.replicas = 1;
  const std::vector<std::string> clean =
      Cluster(::testing::TempDir() + "/collective_unreplicated", single).Finish();
  Cluster cluster(::testing::TempDir() + "/collective_replicated", o);
  ExpectNoRollbackAndSameParameters(cluster.Finish(), clean);
  ExpectReplicasEqual(cluster, 2);
}

// A backup killed mid-training is replaced: the new process joins the live chain by a state
// transfer from its tail while the others train, and ends holding the same state.
TEST_F(ReplicationTest, ReplacementReplicaJoinsByStateTransferWhileTrainingGoesOn) {
  ClusterOptions options = Replicated(2);
  options.epochs = 12;  // long enough that the join comes while the workers train
  Cluster cluster(::testing::TempDir() + "/replaced", options);
  ASSERT_TRUE(cluster.coordinator()
                  .WaitForLine(absl::StrCat("checkpoint of step ", kStepsPerEpoch, " complete"),
                               absl::Minutes(2))
                  .ok());
  ASSERT_TRUE(cluster.shard(1, 1).Stop(SIGKILL, absl::Seconds(20)).ok());
  ASSERT_TRUE(cluster.coordinator()
                  .WaitForLine("shard 1 replica 1 left its chain", absl::Seconds(30))
                  .ok());
  cluster.StartShard(1, /*restore=*/false, 1);
  ASSERT_TRUE(cluster.coordinator()
                  .WaitForLine("shard 1 replica 1 joined its chain", absl::Seconds(60))
                  .ok());
  EXPECT_FALSE(std::filesystem::exists(cluster.dir() + "/worker0.json"))
      << "training ended before the replacement joined: the test shows nothing";
  std::vector<std::string> run = cluster.Finish();
  for (int r = 0; r < kWorkers; ++r) {  // (a longer run than the others: its own result)
    EXPECT_EQ(Field(run[r], "rollbacks"), "[]") << run[r];
    EXPECT_GT(std::stod(Field(run[r], "test_accuracy")), 0.9) << run[r];
  }
  ExpectReplicasEqual(cluster, 2);
}

TEST_F(ReplicationTest, KilledHeadFailsOverWithoutRollbackAndEndsBitwiseAsIfUninterrupted) {
  std::vector<std::string> run;
  {
    Cluster cluster(::testing::TempDir() + "/killed", Replicated(2));
    ASSERT_TRUE(cluster.coordinator()
                    .WaitForLine(absl::StrCat("checkpoint of step ", kStepsPerEpoch, " complete"),
                                 absl::Minutes(2))
                    .ok());
    auto survivor = StubTo(cluster.shard_address(1, 1));
    const int64_t tables = Tables(survivor.get());
    const int64_t at_kill = PushesApplied(survivor.get());
    const absl::Time killed = absl::Now();
    ASSERT_TRUE(cluster.shard(1, 0).Stop(SIGKILL, absl::Seconds(20)).ok());
    const absl::Duration pause = AwaitTrainingAgain(survivor.get(), tables, killed, at_kill);
    std::printf(
        "failover pause: %.0f ms from the SIGKILL of shard 1's head to a whole step "
        "applied by the new head (liveness timeout 600 ms)\n",
        absl::ToDoubleMilliseconds(pause));
    std::fflush(stdout);
    run = cluster.Finish();
  }
  ExpectNoRollbackAndSameParameters(run, *unreplicated_);
}

// A worker killed mid-training: the others roll every shard back to the last checkpoint,
// as without replicas. Each head restores alone (the coordinator shrinks its chain to it)
// and its backup joins again by a state transfer of the restored state.
TEST_F(ReplicationTest, WorkerKilledRollsBackThroughTheChainsAndEndsBitwiseAsIfUninterrupted) {
  std::vector<std::string> run;
  Cluster cluster(::testing::TempDir() + "/worker_killed", Replicated(2));
  ASSERT_TRUE(cluster.coordinator()
                  .WaitForLine(absl::StrCat("checkpoint of step ", kStepsPerEpoch, " complete"),
                               absl::Minutes(2))
                  .ok());
  ASSERT_TRUE(cluster.worker(1).Stop(SIGKILL, absl::Seconds(20)).ok());
  cluster.StartWorker(1);
  run = cluster.Finish();
  EXPECT_NE(Field(run[0], "rollbacks"), "[]") << "rank 0 never rolled back: " << run[0];
  for (int r = 0; r < kWorkers; ++r) {  // (the replacement joined the rollback: none of its own)
    SCOPED_TRACE(run[r]);
    EXPECT_EQ(Field(run[r], "param_crc32c"), Field((*unreplicated_)[r], "param_crc32c"))
        << "the final parameters differ from the uninterrupted run's";
  }
  std::set<std::string> joined;  // the two shards' backups rejoin in either order
  while (joined.size() < static_cast<size_t>(testing::kShards)) {
    auto line = cluster.coordinator().WaitForLine("replica 1 joined its chain", absl::Seconds(60));
    ASSERT_TRUE(line.ok()) << "rejoined so far: " << joined.size() << "; " << line.status();
    joined.insert(line->substr(line->find("shard "), 7));
  }
  ExpectReplicasEqual(cluster, 2);
}

TEST_F(ReplicationTest, HeadCutOffIsReplacedAndRefusesWritesWhenItComesBack) {
  std::vector<std::string> run;
  Cluster cluster(::testing::TempDir() + "/stopped", Replicated(2));
  ASSERT_TRUE(cluster.coordinator()
                  .WaitForLine(absl::StrCat("checkpoint of step ", kStepsPerEpoch, " complete"),
                               absl::Minutes(2))
                  .ok());
  // Cut off (stopped) past the liveness timeout: the coordinator takes it out of the chain.
  ASSERT_EQ(kill(cluster.shard(0, 0).pid(), SIGSTOP), 0);
  ASSERT_TRUE(cluster.coordinator()
                  .WaitForLine("shard 0 replica 0 left its chain", absl::Seconds(30))
                  .ok());
  ASSERT_EQ(kill(cluster.shard(0, 0).pid(), SIGCONT), 0);
  run = cluster.Finish();
  ExpectNoRollbackAndSameParameters(run, *unreplicated_);
  // Back, it registered again and joined the chain as its tail, by a state transfer.
  ASSERT_TRUE(cluster.coordinator()
                  .WaitForLine("shard 0 replica 0 joined its chain", absl::Seconds(60))
                  .ok());
  ExpectReplicasEqual(cluster, 2);

  // A client that still takes the old head for the head: its push is refused, and neither
  // replica applies it.
  auto old_head = StubTo(cluster.shard_address(0, 0));
  auto new_head = StubTo(cluster.shard_address(0, 1));
  const int64_t before_old = PushesApplied(old_head.get()),
                before_new = PushesApplied(new_head.get());
  ps::DenseBatch batch;
  ps::DenseChunk* c = batch.add_chunks();
  c->set_worker_id(0);
  c->set_step(1 << 20);
  c->set_table_id(0);
  const float one = 1.0f;
  c->set_data(&one, sizeof(one));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  ps::PushDenseBatchResponse resp;
  grpc::Status refused = old_head->PushDenseBatch(&ctx, batch, &resp);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE) << refused.error_message();
  EXPECT_NE(refused.error_message().find("shard 0 replica 0"), std::string::npos)
      << refused.error_message();
  EXPECT_EQ(PushesApplied(old_head.get()), before_old);
  EXPECT_EQ(PushesApplied(new_head.get()), before_new);
}

// Makes `call` with request id `id` (none if empty), retrying, bounded, while the shard is
// not serving yet (UNAVAILABLE: its chain is still forming; such a refusal changes nothing).
template <typename Call>
grpc::Status Identified(const std::string& id, Call call) {
  for (const absl::Time give_up = absl::Now() + absl::Seconds(30);;) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    if (!id.empty()) ctx.AddMetadata(kRequestIdKey, id);
    grpc::Status s = call(&ctx);
    if (s.error_code() != grpc::StatusCode::UNAVAILABLE || absl::Now() > give_up) return s;
    absl::SleepFor(absl::Milliseconds(50));
  }
}

// A write made again with its request id (a client whose answer was lost: a slice that ran
// out, a head that died) is applied once, on a shard alone and on a chain of 2 alike: both
// go through the shard's one write log (server/ps/replication/write_log.h). A new id applies again.
TEST(RetriedWriteTest, IsAppliedOnceOnAShardAloneAndOnAChainOfTwo) {
  for (int replicas : {1, 2}) {
    SCOPED_TRACE(absl::StrCat(replicas, " replicas"));
    ClusterOptions o = Replicated(replicas);
    o.workers = 0;
    Cluster cluster(absl::StrCat(::testing::TempDir(), "/retried", replicas), o);
    auto head = StubTo(cluster.shard_address(0, 0));
    OptimizerConfig sgd = AllOptimizers()[0];  // lr 0.5
    for (TableSpec::Kind kind : {TableSpec::DENSE, TableSpec::SPARSE}) {
      TableSpec spec = Spec(kind == TableSpec::DENSE ? 7 : 8, kind, sgd);
      spec.set_size(2 * testing::kShards);  // 2 values on shard 0
      spec.set_dim(2);
      spec.mutable_initializer()->set_kind(ps::InitializerConfig::ZEROS);
      spec.mutable_consistency()->set_mode(ps::ConsistencyConfig::ASP);
      ps::CreateTableRequest req;
      *req.mutable_spec() = spec;
      ps::CreateTableResponse resp;
      ASSERT_TRUE(Identified("", [&](grpc::ClientContext* ctx) {
                    return head->CreateTable(ctx, req, &resp);
                  }).ok());
    }
    ps::RegisterWorkerRequest reg;
    ps::RegisterWorkerResponse registered;
    ASSERT_TRUE(Identified("", [&](grpc::ClientContext* ctx) {
                  return head->RegisterWorker(ctx, reg, &registered);
                }).ok());
    const std::vector<float> ones(4, 1.0f);
    ps::DenseChunk dense;
    dense.set_table_id(7);
    dense.set_total_length(2);
    dense.set_data(ones.data(), 2 * sizeof(float));
    ps::SparseRequest sparse;
    sparse.set_table_id(8);
    for (uint64_t k = 0; sparse.keys_size() < 2; ++k) {
      if (SparseShardOf(k, testing::kShards) == 0) sparse.add_keys(k);  // 2 rows of dim 2
    }
    sparse.set_grads(ones.data(), ones.size() * sizeof(float));
    for (const std::string id : {"retried", "retried", "retried", "another"}) {
      ps::PushDenseResponse pushed;
      grpc::Status s = Identified(
          id, [&](grpc::ClientContext* ctx) { return head->PushDense(ctx, dense, &pushed); });
      ASSERT_TRUE(s.ok()) << id << ": " << s.error_message();
      ps::PushSparseResponse rows;
      s = Identified(id + "-sparse", [&](grpc::ClientContext* ctx) {
        return head->PushSparse(ctx, sparse, &rows);
      });
      ASSERT_TRUE(s.ok()) << id << ": " << s.error_message();
    }
    ps::PullDenseRequest pull;
    pull.set_table_id(7);
    pull.set_length(2);
    ps::DenseChunk values;
    ASSERT_TRUE(Identified("", [&](grpc::ClientContext* ctx) {
                  return head->PullDense(ctx, pull, &values);
                }).ok());
    const std::vector<float> twice(2, -1.0f);  // 2 pushes of 1.0 at lr 0.5
    EXPECT_EQ(values.data(), std::string(reinterpret_cast<const char*>(twice.data()),
                                         twice.size() * sizeof(float)));
    for (int r = 0; r < replicas; ++r) {
      EXPECT_EQ(PushesApplied(StubTo(cluster.shard_address(0, r)).get()), 4)
          << "replica " << r << ": 2 dense and 2 sparse pushes";
    }
    if (replicas > 1) {
      EXPECT_EQ(Fingerprint(StubTo(cluster.shard_address(0, 1)).get()), Fingerprint(head.get()))
          << StatsOf(head.get()) << "\n"
          << StatsOf(StubTo(cluster.shard_address(0, 1)).get());
    }
  }
}

}  // namespace
}  // namespace pscluster
