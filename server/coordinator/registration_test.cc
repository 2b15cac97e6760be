// What a member may register with: addresses checked where they enter (a 3 MiB shard address
// once grew the view past every default client's 4 MiB), and the view kept within a bound
// it cannot outgrow. A refused registration leaves the state exactly as it was.
#include "server/coordinator/registration.h"

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/address.h"
#include "gmock/gmock.h"
#include "grpc/impl/codegen/grpc_types.h"
#include "gtest/gtest.h"
#include "server/coordinator/cluster_state.h"

namespace pscluster::coord {
namespace {

using ::testing::HasSubstr;

RegisterRequest Reg(Role role, int32_t id, const std::string& address) {
  RegisterRequest r;
  r.set_role(role);
  r.set_id(id);
  r.set_address(address);
  return r;
}

// A clock the test moves by hand.
struct Clock {
  absl::Time now = absl::FromUnixSeconds(1'700'000'000);
};

// The coordinator's state for `shards` and `workers`, counting the saves of its state (each
// change) into *saves.
ClusterStateOptions Options(int shards, int workers, int* saves) {
  ClusterStateOptions o;
  o.num_shards = shards;
  o.num_workers = workers;
  o.on_change = [saves](const CoordinatorState&) { ++*saves; };
  return o;
}

// Registers `r` and expects a refusal with `code` whose message has `says`, leaving the
// view (and the saved state) as they were.
void ExpectRefusedChangingNothing(ClusterState& cluster, const int& saves, const RegisterRequest& r,
                                  absl::StatusCode code, const std::string& says) {
  const std::string before = cluster.View().SerializeAsString();
  const int saves_before = saves;
  absl::StatusOr<RegisterResponse> refused = cluster.Register(r);
  EXPECT_EQ(refused.status().code(), code) << refused.status();
  EXPECT_THAT(refused.status().message(), HasSubstr(says));
  EXPECT_LT(refused.status().message().size(), 2000u) << "the value is not echoed whole";
  EXPECT_EQ(cluster.View().SerializeAsString(), before) << "a refused registration changed it";
  EXPECT_EQ(saves, saves_before) << "a refused registration was saved";
}

TEST(RegistrationTest, AThreeMebibyteShardAddressIsRefusedAndTheViewStaysSmall) {
  int saves = 0;
  ClusterState cluster(Options(2, 1, &saves));
  ASSERT_TRUE(cluster.Register(Reg(SHARD, 0, "127.0.0.1:5000")).ok());
  const std::string huge = std::string(3 << 20, 'a') + ":5000";
  ExpectRefusedChangingNothing(cluster, saves, Reg(SHARD, 1, huge),
                               absl::StatusCode::kInvalidArgument,
                               "shard 1 replica 0's address 'aaaa");
  ExpectRefusedChangingNothing(cluster, saves, Reg(SHARD, 1, huge),
                               absl::StatusCode::kInvalidArgument,
                               "has a host of 3145728 characters; at most 253");
  EXPECT_LT(cluster.View().ByteSizeLong(), 1000u);
  // The cluster goes on: the shard registers with its real address.
  ASSERT_TRUE(cluster.Register(Reg(SHARD, 1, "127.0.0.1:5001")).ok());
  ASSERT_TRUE(cluster.Register(Reg(WORKER, 0, "node-1/pid:42")).ok());
  EXPECT_TRUE(cluster.View().complete());
}

TEST(RegistrationTest, AShardAddressThatIsNotHostPortIsInvalidArgumentNamingTheProblem) {
  int saves = 0;
  ClusterState cluster(Options(1, 1, &saves));
  struct Case {
    std::string address, says;
  };
  for (const Case& c : std::vector<Case>{
           {"", "shard 0 replica 0 registered without an address"},
           {"shard0", "'shard0' has no port"},
           {"shard0:", "has no port after the ':'"},
           {":5000", "has no host"},
           {"shard0:0", "port 0, outside 1-65535"},
           {"shard0:65536", "port 65536, outside 1-65535"},
           {"shard0:99999", "port 99999, outside 1-65535"},
           {"http://shard0:5000", "has a scheme ('http://')"},
           {"grpc://shard0:5000", "has a scheme ('grpc://')"},
           {"shard 0:5000", "has whitespace"},
           {"shard0:5000\r\n", "has whitespace"},
           {"shard0\x1b[2J:5000", "has a control character"},
           {"::1:5000", "an IPv6 address goes in brackets"},
           {std::string(254, 's') + ":5000", "host of 254 characters; at most 253"},
       }) {
    SCOPED_TRACE(c.address);
    ExpectRefusedChangingNothing(cluster, saves, Reg(SHARD, 0, c.address),
                                 absl::StatusCode::kInvalidArgument, c.says);
  }
  for (const std::string& good :
       {std::string("127.0.0.1:1"), std::string("[::1]:65535"), std::string(253, 's') + ":5000",
        std::string("shard-0.shards.pscluster.svc.cluster.local:5000")}) {
    ClusterState fresh(Options(1, 1, &saves));  // a live shard would hold its id
    absl::StatusOr<RegisterResponse> r = fresh.Register(Reg(SHARD, 0, good));
    ASSERT_TRUE(r.ok()) << good << ": " << r.status();
    EXPECT_EQ(r->view().shard_addresses(0), good);
  }
}

TEST(RegistrationTest, AWorkerAddressIsAnyShortPrintableLabelOrNone) {
  int saves = 0;
  ClusterState cluster(Options(1, 4, &saves));
  EXPECT_TRUE(cluster.Register(Reg(WORKER, 0, "node-1/pid:42")).ok());
  EXPECT_TRUE(cluster.Register(Reg(WORKER, 1, "")).ok());
  EXPECT_TRUE(cluster.Register(Reg(WORKER, 2, std::string(kMaxHostPortLength, 'w'))).ok());
  ExpectRefusedChangingNothing(cluster, saves, Reg(WORKER, 3, std::string(3 << 20, 'w')),
                               absl::StatusCode::kInvalidArgument, "worker rank 3's address 'wwww");
  ExpectRefusedChangingNothing(cluster, saves, Reg(WORKER, 3, std::string(3 << 20, 'w')),
                               absl::StatusCode::kInvalidArgument, "longer than 259 bytes");
  ExpectRefusedChangingNothing(cluster, saves, Reg(WORKER, 3, "node 1"),
                               absl::StatusCode::kInvalidArgument, "has whitespace (byte 4)");
  ExpectRefusedChangingNothing(cluster, saves, Reg(WORKER, 3, "node\n1"),
                               absl::StatusCode::kInvalidArgument, "has whitespace (byte 4)");
}

TEST(RegistrationTest, AModelNameLongerThanItsBoundIsRefused) {
  int saves = 0;
  ClusterState cluster(Options(1, 1, &saves));
  RegisterRequest r = Reg(WORKER, 0, "node-1/pid:42");
  r.mutable_limits()->set_model(std::string(3 << 20, 'm'));
  ExpectRefusedChangingNothing(cluster, saves, r, absl::StatusCode::kInvalidArgument,
                               "worker rank 0's model name (limits.model)");
  r.mutable_limits()->set_model("gpt");
  EXPECT_TRUE(cluster.Register(r).ok());
}

// Addresses of the largest size allowed, until the bound refuses one; then every member
// reports its largest progress and is declared dead (listed in `missing`): the view stays
// within the bound all along.
TEST(RegistrationTest, ARegistrationThatCouldGrowTheViewPastItsBoundIsResourceExhausted) {
  int saves = 0;
  Clock clock;
  ClusterStateOptions o = Options(40, 40, &saves);
  o.max_view_bytes = 16 << 10;
  ClusterState cluster(o, [&clock] { return clock.now; });
  std::vector<RegisterRequest> accepted;
  bool refused = false;
  for (int i = 0; i < 40 && !refused; ++i) {
    for (const RegisterRequest& r :
         {Reg(SHARD, i, std::string(253, 'a' + i % 26) + ":65535"),
          Reg(WORKER, i, std::string(kMaxHostPortLength, 'a' + i % 26))}) {
      RegisterRequest with_model = r;
      with_model.mutable_limits()->set_model(std::string(kMaxModelNameLength, 'm'));
      absl::StatusOr<RegisterResponse> got = cluster.Register(with_model);
      if (got.ok()) {
        EXPECT_LE(got->ByteSizeLong(), o.max_view_bytes);
        accepted.push_back(with_model);
        continue;
      }
      refused = true;
      EXPECT_EQ(got.status().code(), absl::StatusCode::kResourceExhausted) << got.status();
      ExpectRefusedChangingNothing(cluster, saves, with_model, absl::StatusCode::kResourceExhausted,
                                   "past its bound of 16384 bytes");
      break;
    }
  }
  ASSERT_TRUE(refused) << "40 shards and 40 workers fit in 16 KiB";
  ASSERT_GT(accepted.size(), 4u);
  // A worker registering again (a restart at its address) still fits.
  const RegisterRequest& worker =
      accepted[accepted.size() - (accepted.back().role() == WORKER ? 1 : 2)];
  ASSERT_EQ(worker.role(), WORKER);
  absl::StatusOr<RegisterResponse> again = cluster.Register(worker);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->incarnation(), 2);

  const ClusterView view = cluster.View();
  for (const Member& m : view.members()) {
    if (m.role() != WORKER) continue;
    ReportProgressRequest p;
    p.set_rank(m.id());
    p.set_incarnation(m.incarnation());
    p.set_view_version(view.version());
    p.set_step(std::numeric_limits<int64_t>::max() - 1);
    p.set_run_end_step(std::numeric_limits<int64_t>::max());
    p.set_loss(-1e308);
    p.set_samples_per_sec(1e308);
    p.set_has_metric(true);
    p.set_metric(1e308);
    ASSERT_TRUE(cluster.ReportProgress(p).ok());
  }
  EXPECT_LE(cluster.View().ByteSizeLong(), o.max_view_bytes);
  clock.now += absl::Hours(1);
  ASSERT_TRUE(cluster.CheckLiveness());
  EXPECT_THAT(cluster.View().missing(), HasSubstr("(dead)"));
  EXPECT_LE(cluster.View().ByteSizeLong(), o.max_view_bytes);
}

TEST(RegistrationTest, MaxViewGrowthBoundsAMemberWithEveryFieldAtItsLargest) {
  for (Role role : {SHARD, WORKER}) {
    RegisterRequest r =
        Reg(role, std::numeric_limits<int32_t>::max(), std::string(kMaxHostLength, 'a') + ":65535");
    r.mutable_limits()->set_model(std::string(kMaxModelNameLength, 'm'));
    r.mutable_limits()->set_layers(-1);
    r.mutable_limits()->set_max_tensor_parallel(-1);
    r.mutable_limits()->set_batch_size(-1);
    r.mutable_limits()->set_micro_batches(-1);
    r.mutable_limits()->set_embedding_tables(true);
    ClusterView view;
    Member* m = view.add_members();
    m->set_role(role);
    m->set_id(-1);  // the longest varint an int32 takes
    m->set_address(r.address());
    m->set_incarnation(-1);
    m->set_alive(true);
    m->set_last_heartbeat_ms(-1);
    m->set_step(-1);
    m->set_loss(1e308);
    m->set_samples_per_sec(1e308);
    m->set_has_metric(true);
    m->set_metric(1e308);
    m->set_replica(-1);
    *m->mutable_limits() = r.limits();
    m->set_run_end_step(-1);
    if (role == SHARD) {
      view.add_shard_addresses(r.address());
      view.add_chains()->add_addresses(r.address());
    }
    EXPECT_LE(view.ByteSizeLong(), MaxViewGrowth(r)) << RoleName(role);
  }
}

// The view at its bound, in a RegisterResponse, fits what a default gRPC client receives,
// with a MiB to spare for the checkpoints and mode switches.
TEST(RegistrationTest, TheBoundLeavesRoomWithinADefaultClientsMessage) {
  EXPECT_EQ(kDefaultClientMessageBytes, size_t{GRPC_DEFAULT_MAX_RECV_MESSAGE_LENGTH});
  EXPECT_LE(kMaxViewBytes + (size_t{1} << 20), kDefaultClientMessageBytes);
}

// A state saved by a coordinator that did not check addresses: the member is dropped (it
// registers again, and is refused), not carried into the view.
TEST(RegistrationTest, ASavedMemberWithAnAddressRegistrationRefusesIsDroppedOnRestore) {
  CoordinatorState saved;
  Member* bad = saved.add_members();
  bad->set_role(SHARD);
  bad->set_id(0);
  bad->set_address(std::string(3 << 20, 'a') + ":5000");
  bad->set_incarnation(1);
  Member* good = saved.add_members();
  good->set_role(WORKER);
  good->set_id(0);
  good->set_address("node-1/pid:42");
  good->set_incarnation(1);
  saved.set_version(7);
  int saves = 0;
  ClusterState cluster(Options(1, 1, &saves));
  ASSERT_TRUE(cluster.Restore(saved).ok());
  const ClusterView view = cluster.View();
  ASSERT_EQ(view.members_size(), 1);
  EXPECT_EQ(view.members(0).role(), WORKER);
  EXPECT_LT(view.ByteSizeLong(), 1000u);
}

}  // namespace
}  // namespace pscluster::coord
