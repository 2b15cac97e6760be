// A restarted coordinator continues from the state its predecessor saved (on_change):
// members keep their incarnations (their heartbeats are accepted without registering
// again), the view's version goes on above the saved one, and the switch schedule (what
// is pending, how far the workers polled) is the same.
#include <optional>

#include "gtest/gtest.h"
#include "server/coordinator/cluster_state.h"

namespace pscluster::coord {
namespace {

const absl::Time kStart = absl::FromUnixSeconds(1'700'000'000);

RegisterRequest Registration(Role role, int32_t id, const std::string& address) {
  RegisterRequest r;
  r.set_role(role);
  r.set_id(id);
  r.set_address(address);
  return r;
}

TEST(StateRestoreTest, ARestartedCoordinatorKeepsMembersIncarnationsAndTheSwitchSchedule) {
  std::optional<CoordinatorState> saved;
  ClusterStateOptions o;
  o.num_shards = 1;
  o.num_workers = 1;
  o.on_change = [&](const CoordinatorState& s) { saved = s; };
  ClusterState before(o, [] { return kStart; });
  ASSERT_TRUE(before.Register(Registration(SHARD, 0, "127.0.0.1:5000")).ok());
  ASSERT_TRUE(before.Register(Registration(WORKER, 0, "pid:1")).ok());
  auto again = before.Register(Registration(WORKER, 0, "pid:1"));  // a restarted worker
  ASSERT_TRUE(again.ok());
  ASSERT_EQ(again->incarnation(), 2);
  PollSwitchRequest poll;
  poll.set_incarnation(2);
  poll.set_step(10);
  ASSERT_TRUE(before.PollSwitch(poll).ok());
  SwitchModeRequest to_fsdp;
  to_fsdp.set_mode(FSDP);
  to_fsdp.set_at_step(50);
  ASSERT_TRUE(before.SwitchMode(to_fsdp).ok());
  ASSERT_TRUE(saved.has_value());
  const ClusterView old_view = before.View();

  o.on_change = nullptr;
  ClusterState after(o, [] { return kStart + absl::Seconds(30); });
  ASSERT_TRUE(after.Restore(*saved).ok());
  const ClusterView v = after.View();
  EXPECT_GT(v.version(), old_view.version());
  EXPECT_TRUE(v.complete()) << "restored members count as alive until they miss beats";
  EXPECT_EQ(v.shard_addresses(0), "127.0.0.1:5000");
  ASSERT_EQ(v.pending_switches_size(), 1);
  EXPECT_EQ(v.pending_switches(0).at_step(), 50);
  EXPECT_EQ(v.pending_switches(0).to_mode(), FSDP);

  HeartbeatRequest beat;
  beat.set_role(WORKER);
  beat.set_incarnation(2);
  EXPECT_TRUE(after.Heartbeat(beat).ok()) << "the worker need not register again";
  SwitchModeRequest passed;
  passed.set_mode(PIPELINE);
  passed.set_at_step(5);
  EXPECT_EQ(after.SwitchMode(passed).status().code(), absl::StatusCode::kFailedPrecondition)
      << "the steps the workers polled stay passed";
  EXPECT_EQ(after.Register(Registration(WORKER, 0, "pid:1")).value().incarnation(), 3);
}

// Regression (with the rule that a member declared dead must register again): a restarted
// coordinator declared its restored members dead before they had reconnected, forcing
// every worker to roll back. They get a grace of at least 10 s.
TEST(StateRestoreTest, RestoredMembersAreNotDeclaredDeadBeforeTheyCanReconnect) {
  std::optional<CoordinatorState> saved;
  ClusterStateOptions o;
  o.num_shards = 1;
  o.num_workers = 1;
  o.heartbeat_timeout = absl::Milliseconds(500);
  o.on_change = [&](const CoordinatorState& s) { saved = s; };
  ClusterState before(o, [] { return kStart; });
  ASSERT_TRUE(before.Register(Registration(SHARD, 0, "127.0.0.1:5000")).ok());
  ASSERT_TRUE(before.Register(Registration(WORKER, 0, "pid:1")).ok());
  o.on_change = nullptr;
  absl::Time now = kStart + absl::Seconds(30);
  ClusterState after(o, [&] { return now; });
  ASSERT_TRUE(after.Restore(*saved).ok());
  now += absl::Seconds(5);  // ten heartbeat timeouts, within the grace
  after.CheckLiveness();
  EXPECT_TRUE(after.View().complete()) << "a restored member was declared dead at once";
  now += absl::Seconds(6);  // past the grace, still silent: dead
  after.CheckLiveness();
  EXPECT_FALSE(after.View().complete());
}

TEST(StateRestoreTest, MembersOutsideARestartedCoordinatorsRangesAreDropped) {
  CoordinatorState state;
  Member* m = state.add_members();
  m->set_role(SHARD);
  m->set_id(3);
  m->set_address("127.0.0.1:5003");
  m->set_incarnation(1);
  ClusterState cluster(ClusterStateOptions{}, [] { return kStart; });
  ASSERT_TRUE(cluster.Restore(state).ok());
  EXPECT_EQ(cluster.View().members_size(), 0);
}

}  // namespace
}  // namespace pscluster::coord
