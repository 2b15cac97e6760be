// The chain trusts no stranger (issue 49). A replicated cluster (2 shards x 2 replicas, no
// workers); a client that is no member of it asks the coordinator to change a chain:
// ShrinkChain naming the head, JoinChain naming the tail. Each is refused with
// PERMISSION_DENIED (the caller cannot prove it is the replica it names: each replica got
// a secret of its own at registration), the chains stay as they were, and every replica
// still holds bitwise its head's state.
// The same stranger calls a shard's tail as if it were a replica: Replicate with the chain's
// epoch and every sequence number up to well past the tail's, TransferState naming a
// replica outside the chain, JoinedChain. The replicas take replication calls only from
// callers holding the shard's chain key, which the coordinator gives only to the shard's
// own replicas: each call is PERMISSION_DENIED, and nothing changes.
#include <string>

#include "client/ps/ps_client.h"
#include "gtest/gtest.h"
#include "proto/coordinator.grpc.pb.h"
#include "tests/fault_cluster.h"
#include "tests/replication_probes.h"
#include "tests/test_tables.h"

namespace pscluster::testing {
namespace {

class HostileReplicationTest : public ::testing::Test {
 protected:
  HostileReplicationTest() : cluster_(::testing::TempDir() + "/hostile", Options()) {
    coordinator_ = coord::Coordinator::NewStub(
        grpc::CreateChannel(cluster_.coordinator_address(), grpc::InsecureChannelCredentials()));
    Train();
  }
  // A dense table on every shard, pushed through the chains: state to compare.
  void Train() {
    const coord::ClusterView view = View();
    PsClientOptions o;
    o.shard_addresses.assign(view.shard_addresses().begin(), view.shard_addresses().end());
    for (const coord::Chain& c : view.chains()) {
      o.shard_replicas.emplace_back(c.addresses().begin(), c.addresses().end());
    }
    auto client = PsClient::Create(o);
    ASSERT_TRUE(client.ok()) << client.status();
    ASSERT_TRUE((*client)->RegisterWorker().ok());
    ps::OptimizerConfig adam;
    adam.set_kind(ps::OptimizerConfig::ADAM);
    adam.set_learning_rate(0.01f);
    ps::TableSpec spec = Spec(1, ps::TableSpec::DENSE, adam);
    spec.set_size(1000);
    spec.mutable_consistency()->set_mode(ps::ConsistencyConfig::ASP);
    ASSERT_TRUE((*client)->CreateTable(spec).ok());
    std::vector<float> grad(1000);
    for (int step = 0; step < 3; ++step) {
      for (uint64_t i = 0; i < grad.size(); ++i) grad[i] = Grad(0, step, i);
      ASSERT_TRUE((*client)->PushDense(1, step, grad).ok());
    }
  }
  static ClusterOptions Options() {
    ClusterOptions o = Replicated(2);
    o.workers = 0;
    return o;
  }
  coord::ClusterView View() {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    coord::ClusterView view;
    EXPECT_TRUE(coordinator_->GetView(&ctx, coord::GetViewRequest(), &view).ok());
    return view;
  }
  // Every chain as it was, and every replica with its head's state.
  void ExpectNothingChanged(const coord::ClusterView& before) {
    const coord::ClusterView after = View();
    for (int s = 0; s < kShards; ++s) {
      EXPECT_EQ(after.chains(s).DebugString(), before.chains(s).DebugString()) << "shard " << s;
    }
    ExpectReplicasEqual(cluster_, 2);
  }

  Cluster cluster_;
  std::unique_ptr<coord::Coordinator::Stub> coordinator_;
};

TEST_F(HostileReplicationTest, AStrangerCannotShrinkAChain) {
  const coord::ClusterView before = View();
  ASSERT_EQ(before.chains(1).replicas_size(), 2);
  for (const std::string& secret : {std::string(), std::string(32, 'a')}) {
    coord::ShrinkChainRequest req;
    req.set_shard(1);
    req.set_replica(before.chains(1).replicas(0));
    req.set_epoch(before.chains(1).epoch());
    req.set_member_secret(secret);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    coord::JoinChainResponse resp;
    const grpc::Status s = coordinator_->ShrinkChain(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
    EXPECT_NE(s.error_message().find("did not prove it is shard 1 replica"), std::string::npos)
        << s.error_message();
  }
  ExpectNothingChanged(before);
}

TEST_F(HostileReplicationTest, AStrangerCannotAddAReplica) {
  const coord::ClusterView before = View();
  coord::JoinChainRequest req;
  req.set_shard(0);
  req.set_replica(before.chains(0).replicas(1));  // as if it were outside, joining
  req.set_epoch(before.chains(0).epoch());
  req.set_caller(before.chains(0).replicas(1));  // claiming to be the tail
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  coord::JoinChainResponse resp;
  const grpc::Status s = coordinator_->JoinChain(&ctx, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  ExpectNothingChanged(before);
}

TEST_F(HostileReplicationTest, AStrangerCannotReplicateToAReplicaNorTakeItsState) {
  const coord::ClusterView before = View();
  auto tail = StubTo(before.chains(0).addresses(1));
  for (uint64_t seq = 1; seq <= 64; ++seq) {  // the tail's next one among them
    ps::ReplicatedUpdate update;
    update.set_seq(seq);
    update.set_epoch(before.chains(0).epoch());
    ps::DenseChunk* push = update.mutable_push_dense();
    push->set_table_id(1);
    push->set_step(seq);
    const std::vector<float> forged(1000, 1e3f);
    push->set_data(forged.data(), forged.size() * sizeof(float));
    push->set_total_length(1000);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    ps::ReplicateResponse resp;
    auto writer = tail->Replicate(&ctx, &resp);
    writer->WriteLast(update, grpc::WriteOptions());
    const grpc::Status s = writer->Finish();
    ASSERT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED)
        << seq << ": " << s.error_message();
  }
  ps::TransferStateRequest transfer;
  transfer.set_replica(7);
  transfer.set_address("127.0.0.1:1");
  transfer.set_epoch(before.chains(0).epoch());
  grpc::ClientContext transfer_ctx;
  transfer_ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  auto reader = tail->TransferState(&transfer_ctx, transfer);
  ps::StateTransferChunk chunk;
  EXPECT_FALSE(reader->Read(&chunk)) << "the tail streamed its state to a stranger";
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::PERMISSION_DENIED);
  ps::JoinedChainRequest joined;
  joined.set_replica(7);
  joined.set_epoch(before.chains(0).epoch());
  grpc::ClientContext joined_ctx;
  joined_ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  ps::JoinedChainResponse joined_resp;
  EXPECT_EQ(tail->JoinedChain(&joined_ctx, joined, &joined_resp).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  ExpectNothingChanged(before);
  Train();  // the chain still takes the head's updates, and every replica still agrees
  ExpectReplicasEqual(cluster_, 2);
}

}  // namespace
}  // namespace pscluster::testing
