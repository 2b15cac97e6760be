// Who may change a chain (issue 49: ShrinkChain and JoinChain from a non-member were
// accepted). Each replica gets a member secret at registration; ShrinkChain must come from
// the head that names itself, JoinChain from the chain's tail, each proving it with its own
// secret. A refused call changes nothing: the chain, its epoch and the view's version
// stay. A restarted coordinator keeps the secrets (CoordinatorState).
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "server/coordinator/cluster_state.h"

namespace pscluster::coord {
namespace {

class ChainCallersTest : public ::testing::Test {
 protected:
  ChainCallersTest() : cluster_(Options(&saved_)) {
    for (int r = 0; r < 3; ++r) secret_[r] = Register(&cluster_, r);
  }
  static ClusterStateOptions Options(CoordinatorState* saved) {
    ClusterStateOptions o;
    o.num_shards = 1;
    o.num_workers = 1;
    o.replicas = 3;
    o.on_change = [saved](const CoordinatorState& s) { *saved = s; };
    return o;
  }
  static std::string Register(ClusterState* cluster, int replica) {
    RegisterRequest req;
    req.set_role(SHARD);
    req.set_id(0);
    req.set_replica(replica);
    req.set_address(absl::StrCat("127.0.0.1:500", replica));
    absl::StatusOr<RegisterResponse> r = cluster->Register(req);
    EXPECT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->member_secret().size(), 32u);
    return r.ok() ? r->member_secret() : "";
  }
  Chain TheChain() const { return cluster_.View().chains(0); }
  ShrinkChainRequest Shrink(int replica, const std::string& secret) const {
    ShrinkChainRequest r;
    r.set_shard(0);
    r.set_replica(replica);
    r.set_epoch(TheChain().epoch());
    r.set_member_secret(secret);
    return r;
  }
  // Replica 2 out of the chain (dead) and registered again: it waits outside for a join.
  void TakeOutAndRegisterAgain() {
    const ClusterView view = cluster_.View();
    ASSERT_TRUE(cluster_.DeclareUnreachable(0, 2, view.members(2).incarnation()));
    secret_[2] = Register(&cluster_, 2);
    ASSERT_EQ(TheChain().replicas_size(), 2);
  }
  JoinChainRequest Join(int caller, const std::string& secret) const {
    JoinChainRequest r;
    r.set_shard(0);
    r.set_replica(2);
    r.set_epoch(TheChain().epoch());
    r.set_caller(caller);
    r.set_member_secret(secret);
    return r;
  }
  // The call was refused with PERMISSION_DENIED and changed nothing.
  template <typename Call>
  void ExpectRefused(Call call) {
    const ClusterView before = cluster_.View();
    absl::StatusOr<JoinChainResponse> r = call();
    EXPECT_EQ(r.status().code(), absl::StatusCode::kPermissionDenied) << r.status();
    const ClusterView after = cluster_.View();
    EXPECT_EQ(after.version(), before.version());
    EXPECT_EQ(after.chains(0).DebugString(), before.chains(0).DebugString());
  }

  CoordinatorState saved_;
  ClusterState cluster_;
  std::string secret_[3];
};

TEST_F(ChainCallersTest, OnlyTheHeadItselfMayShrinkTheChain) {
  ASSERT_EQ(TheChain().replicas_size(), 3);
  ExpectRefused([&] { return cluster_.ShrinkChain(Shrink(0, "")); });
  ExpectRefused([&] { return cluster_.ShrinkChain(Shrink(0, std::string(32, '0'))); });
  // A member, but not the one it names: its own secret proves nothing for replica 0.
  ExpectRefused([&] { return cluster_.ShrinkChain(Shrink(0, secret_[1])); });
  absl::StatusOr<JoinChainResponse> r = cluster_.ShrinkChain(Shrink(0, secret_[0]));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(TheChain().replicas_size(), 1);
}

TEST_F(ChainCallersTest, OnlyTheTailMayAddAReplica) {
  TakeOutAndRegisterAgain();
  ExpectRefused([&] { return cluster_.JoinChain(Join(1, "")); });
  ExpectRefused([&] { return cluster_.JoinChain(Join(1, secret_[0])); });
  // The head, proving it is the head, is still not the tail that sent the joiner its state.
  ExpectRefused([&] { return cluster_.JoinChain(Join(0, secret_[0])); });
  // The joiner itself cannot add itself either.
  ExpectRefused([&] { return cluster_.JoinChain(Join(2, secret_[2])); });
  absl::StatusOr<JoinChainResponse> r = cluster_.JoinChain(Join(1, secret_[1]));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(TheChain().replicas_size(), 3);
}

TEST_F(ChainCallersTest, ARestartedCoordinatorStillKnowsWhoIsWho) {
  ClusterState restarted(Options(&saved_));
  ASSERT_TRUE(restarted.Restore(saved_).ok());
  ShrinkChainRequest forged = Shrink(0, secret_[1]);
  forged.set_epoch(restarted.View().chains(0).epoch());
  EXPECT_EQ(restarted.ShrinkChain(forged).status().code(), absl::StatusCode::kPermissionDenied);
  ShrinkChainRequest real = Shrink(0, secret_[0]);
  real.set_epoch(restarted.View().chains(0).epoch());
  EXPECT_TRUE(restarted.ShrinkChain(real).ok());
}

TEST_F(ChainCallersTest, ARegistrationGetsANewSecretAndTheOldOneStopsWorking) {
  const std::string old = secret_[0];
  secret_[0] = Register(&cluster_, 0);  // a restart: a new incarnation
  EXPECT_NE(secret_[0], old);
  EXPECT_TRUE(cluster_.View().DebugString().find(secret_[0]) == std::string::npos)
      << "a member secret is in the view";
}

}  // namespace
}  // namespace pscluster::coord
