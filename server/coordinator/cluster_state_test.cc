#include "server/coordinator/cluster_state.h"

#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/parking_testing.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/coordinator.pb.h"

namespace pscluster::coord {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

// A clock the test advances by hand; no sleeps anywhere.
class FakeClock {
 public:
  absl::Time Now() const { return now_; }
  void Advance(absl::Duration d) { now_ += d; }
  std::function<absl::Time()> AsFunction() {
    return [this] { return now_; };
  }

 private:
  absl::Time now_ = absl::FromUnixSeconds(1'700'000'000);
};

RegisterRequest Reg(Role role, int32_t id, const std::string& address) {
  RegisterRequest r;
  r.set_role(role);
  r.set_id(id);
  r.set_address(address);
  return r;
}

HeartbeatRequest Hb(Role role, int32_t id, int64_t incarnation) {
  HeartbeatRequest r;
  r.set_role(role);
  r.set_id(id);
  r.set_incarnation(incarnation);
  return r;
}

ReportProgressRequest Progress(int32_t rank, int64_t incarnation, int64_t view_version,
                               int64_t step, double loss = 0.0, double samples_per_sec = 0.0) {
  ReportProgressRequest r;
  r.set_rank(rank);
  r.set_incarnation(incarnation);
  r.set_view_version(view_version);
  r.set_step(step);
  r.set_loss(loss);
  r.set_samples_per_sec(samples_per_sec);
  return r;
}

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

// A copy of the member (so it can be taken from a temporary view); fails the test and
// returns an empty Member when the view lacks it.
Member FindMember(const ClusterView& v, Role role, int32_t id) {
  for (const Member& m : v.members()) {
    if (m.role() == role && m.id() == id) return m;
  }
  ADD_FAILURE() << "the view has no " << (role == SHARD ? "shard " : "worker ") << id;
  return Member();
}

class ClusterStateTest : public ::testing::Test {
 protected:
  static constexpr absl::Duration kTimeout = absl::Seconds(5);

  // Registers and returns the incarnation; fails the test on error.
  int64_t MustRegister(ClusterState& m, Role role, int32_t id, const std::string& address) {
    absl::StatusOr<RegisterResponse> r = m.Register(Reg(role, id, address));
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->incarnation() : -1;
  }

  FakeClock clock_;
};

// ClusterState is neither copyable nor movable (it holds a mutex), so tests build it in place.
#define MAKE_MEMBERSHIP(name, shards, workers) \
  ClusterStateOptions name##_options;          \
  name##_options.num_shards = (shards);        \
  name##_options.num_workers = (workers);      \
  name##_options.heartbeat_timeout = kTimeout; \
  ClusterState name(name##_options, clock_.AsFunction())

// ---------------------------------------------------------------------------------------
// Registration and the view.

TEST_F(ClusterStateTest, InitialViewIsVersionOneEmptyAndIncomplete) {
  MAKE_MEMBERSHIP(m, 2, 3);
  ClusterView v = m.View();
  EXPECT_EQ(v.version(), 1);
  EXPECT_EQ(v.num_shards(), 2);
  EXPECT_EQ(v.num_workers(), 3);
  EXPECT_EQ(v.mode(), PS);
  EXPECT_THAT(v.shard_addresses(), ElementsAre("", ""));
  EXPECT_EQ(v.members_size(), 0);
  EXPECT_EQ(v.global_step(), 0);
  EXPECT_FALSE(v.complete());
}

TEST_F(ClusterStateTest, RegisterShardGetsIncarnationOneAndBumpsVersion) {
  MAKE_MEMBERSHIP(m, 2, 1);
  absl::StatusOr<RegisterResponse> r = m.Register(Reg(SHARD, 1, "host1:5000"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->incarnation(), 1);
  EXPECT_EQ(r->view().version(), 2);
  EXPECT_EQ(m.View().version(), 2);
}

// A shard started with another --num_shards (its key ranges would differ from the other
// shards') or a worker with another --world is refused, and nothing changes.
TEST_F(ClusterStateTest, AMemberStartedForAnotherClusterSizeIsRefused) {
  MAKE_MEMBERSHIP(m, 2, 2);
  RegisterRequest shard = Reg(SHARD, 0, "host0:5000");
  shard.set_group_size(3);
  absl::StatusOr<RegisterResponse> r = m.Register(shard);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(r.status()), HasSubstr("shard 0 was started with --num_shards=3 but this "
                                         "coordinator runs --num_shards=2"));
  RegisterRequest worker = Reg(WORKER, 1, "w1");
  worker.set_group_size(3);
  r = m.Register(worker);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(r.status()), HasSubstr("--world=3 but this coordinator runs --num_workers=2"));
  EXPECT_EQ(m.View().version(), 1) << "a refused registration changed the view";
  shard.set_group_size(2);
  EXPECT_TRUE(m.Register(shard).ok());
  shard.set_id(1);
  shard.set_group_size(0);  // not said: accepted
  EXPECT_TRUE(m.Register(shard).ok());
}

TEST_F(ClusterStateTest, RegisterWorkerGetsIncarnationOneAndBumpsVersion) {
  MAKE_MEMBERSHIP(m, 1, 2);
  absl::StatusOr<RegisterResponse> r = m.Register(Reg(WORKER, 0, "w0"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->incarnation(), 1);
  EXPECT_EQ(r->view().version(), 2);
  absl::StatusOr<RegisterResponse> r2 =
      m.Register(Reg(WORKER, 1, ""));  // workers: address optional
  ASSERT_TRUE(r2.ok()) << r2.status();
  EXPECT_EQ(r2->incarnation(), 1);
  EXPECT_EQ(r2->view().version(), 3);
}

TEST_F(ClusterStateTest, ViewListsShardAddressesByIdEmptyUntilRegistered) {
  MAKE_MEMBERSHIP(m, 3, 1);
  MustRegister(m, SHARD, 2, "host2:7000");
  EXPECT_THAT(m.View().shard_addresses(), ElementsAre("", "", "host2:7000"));
  MustRegister(m, SHARD, 0, "host0:7000");
  EXPECT_THAT(m.View().shard_addresses(), ElementsAre("host0:7000", "", "host2:7000"));
}

TEST_F(ClusterStateTest, ViewListsMembersShardsThenWorkersById) {
  MAKE_MEMBERSHIP(m, 2, 2);
  MustRegister(m, WORKER, 1, "w1");
  MustRegister(m, SHARD, 1, "s1:5001");
  MustRegister(m, WORKER, 0, "w0");
  MustRegister(m, SHARD, 0, "s0:5000");
  ClusterView v = m.View();
  ASSERT_EQ(v.members_size(), 4);
  EXPECT_EQ(v.members(0).role(), SHARD);
  EXPECT_EQ(v.members(0).id(), 0);
  EXPECT_EQ(v.members(0).address(), "s0:5000");
  EXPECT_EQ(v.members(1).role(), SHARD);
  EXPECT_EQ(v.members(1).id(), 1);
  EXPECT_EQ(v.members(2).role(), WORKER);
  EXPECT_EQ(v.members(2).id(), 0);
  EXPECT_EQ(v.members(2).address(), "w0");
  EXPECT_EQ(v.members(3).role(), WORKER);
  EXPECT_EQ(v.members(3).id(), 1);
  for (const Member& mem : v.members()) {
    EXPECT_TRUE(mem.alive());
    EXPECT_EQ(mem.incarnation(), 1);
    EXPECT_EQ(mem.last_heartbeat_ms(), absl::ToUnixMillis(clock_.Now()));
  }
}

TEST_F(ClusterStateTest, CompleteOnlyWhenEveryExpectedShardAndWorkerIsRegistered) {
  MAKE_MEMBERSHIP(m, 2, 2);
  EXPECT_FALSE(m.View().complete());
  MustRegister(m, SHARD, 0, "s0:5000");
  MustRegister(m, SHARD, 1, "s1:5001");
  EXPECT_FALSE(m.View().complete()) << "no workers yet";
  MustRegister(m, WORKER, 0, "w0");
  EXPECT_FALSE(m.View().complete()) << "worker 1 missing";
  absl::StatusOr<RegisterResponse> last = m.Register(Reg(WORKER, 1, "w1"));
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_TRUE(last->view().complete());
  EXPECT_TRUE(m.View().complete());
}

TEST_F(ClusterStateTest, CompleteRequiresShardsTooNotJustWorkers) {
  MAKE_MEMBERSHIP(m, 2, 1);
  MustRegister(m, WORKER, 0, "w0");
  MustRegister(m, SHARD, 0, "s0:5000");
  EXPECT_FALSE(m.View().complete());
  MustRegister(m, SHARD, 1, "s1:5001");
  EXPECT_TRUE(m.View().complete());
}

// ---------------------------------------------------------------------------------------
// Invalid registrations.

TEST_F(ClusterStateTest, ShardIdOutOfRangeIsInvalidArgumentNamingNumShardsFlag) {
  MAKE_MEMBERSHIP(m, 2, 3);
  absl::StatusOr<RegisterResponse> r = m.Register(Reg(SHARD, 2, "s2:5002"));
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_THAT(Msg(r.status()), HasSubstr("--num_shards=2"));
  EXPECT_EQ(m.View().version(), 1) << "a refused registration must not change the view";
  EXPECT_EQ(m.View().members_size(), 0);
}

TEST_F(ClusterStateTest, WorkerRankOutOfRangeIsInvalidArgumentNamingNumWorkersFlag) {
  MAKE_MEMBERSHIP(m, 2, 3);
  absl::StatusOr<RegisterResponse> r = m.Register(Reg(WORKER, 3, "w3"));
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_THAT(Msg(r.status()), HasSubstr("--num_workers=3"));
  EXPECT_THAT(Msg(r.status()), Not(HasSubstr("--num_shards")));
}

TEST_F(ClusterStateTest, NegativeIdIsInvalidArgument) {
  MAKE_MEMBERSHIP(m, 2, 3);
  absl::StatusOr<RegisterResponse> shard = m.Register(Reg(SHARD, -1, "s"));
  ASSERT_EQ(shard.status().code(), absl::StatusCode::kInvalidArgument) << shard.status();
  EXPECT_THAT(Msg(shard.status()), HasSubstr("--num_shards=2"));
  absl::StatusOr<RegisterResponse> worker = m.Register(Reg(WORKER, -1, "w"));
  ASSERT_EQ(worker.status().code(), absl::StatusCode::kInvalidArgument) << worker.status();
  EXPECT_THAT(Msg(worker.status()), HasSubstr("--num_workers=3"));
  EXPECT_EQ(m.View().version(), 1);
}

TEST_F(ClusterStateTest, UnknownRoleIsInvalidArgument) {
  MAKE_MEMBERSHIP(m, 2, 2);
  absl::StatusOr<RegisterResponse> r = m.Register(Reg(static_cast<Role>(7), 0, "x"));
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_THAT(Msg(r.status()), HasSubstr("role 7"));
  absl::StatusOr<HeartbeatResponse> hb = m.Heartbeat(Hb(static_cast<Role>(7), 0, 1));
  EXPECT_EQ(hb.status().code(), absl::StatusCode::kInvalidArgument) << hb.status();
  EXPECT_EQ(m.View().version(), 1);
}

TEST_F(ClusterStateTest, ShardWithoutAddressIsInvalidArgument) {
  MAKE_MEMBERSHIP(m, 2, 2);
  absl::StatusOr<RegisterResponse> r = m.Register(Reg(SHARD, 0, ""));
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_THAT(Msg(r.status()), HasSubstr("shard 0"));
  EXPECT_THAT(Msg(r.status()), HasSubstr("address"));
  EXPECT_EQ(m.View().version(), 1);
  EXPECT_THAT(m.View().shard_addresses(), ElementsAre("", ""));
}

// ---------------------------------------------------------------------------------------
// Duplicates and restarts.

TEST_F(ClusterStateTest, DuplicateWorkerRankAtAnotherAddressIsAlreadyExistsNamingHolder) {
  MAKE_MEMBERSHIP(m, 1, 2);
  MustRegister(m, WORKER, 1, "hostA:1");
  const int64_t version = m.View().version();
  absl::StatusOr<RegisterResponse> r = m.Register(Reg(WORKER, 1, "hostB:1"));
  ASSERT_EQ(r.status().code(), absl::StatusCode::kAlreadyExists) << r.status();
  EXPECT_THAT(Msg(r.status()), HasSubstr("hostA:1"));
  EXPECT_THAT(Msg(r.status()), HasSubstr("worker rank 1"));
  // The holder is untouched.
  EXPECT_EQ(m.View().version(), version);
  const Member held = FindMember(m.View(), WORKER, 1);
  EXPECT_EQ(held.address(), "hostA:1");
  EXPECT_EQ(held.incarnation(), 1);
}

TEST_F(ClusterStateTest, DuplicateShardIdAtAnotherAddressIsAlreadyExistsNamingHolder) {
  MAKE_MEMBERSHIP(m, 2, 1);
  MustRegister(m, SHARD, 0, "s0a:5000");
  absl::StatusOr<RegisterResponse> r = m.Register(Reg(SHARD, 0, "s0b:5000"));
  ASSERT_EQ(r.status().code(), absl::StatusCode::kAlreadyExists) << r.status();
  EXPECT_THAT(Msg(r.status()), HasSubstr("s0a:5000"));
  EXPECT_THAT(m.View().shard_addresses(), ElementsAre("s0a:5000", ""));
}

TEST_F(ClusterStateTest, DuplicateRankWithEmptyAddressIsAlreadyExists) {
  MAKE_MEMBERSHIP(m, 1, 2);
  MustRegister(m, WORKER, 0, "hostA:1");
  absl::StatusOr<RegisterResponse> r = m.Register(Reg(WORKER, 0, ""));
  ASSERT_EQ(r.status().code(), absl::StatusCode::kAlreadyExists) << r.status();
  EXPECT_THAT(Msg(r.status()), HasSubstr("hostA:1"));

  // Two address-less workers cannot share a live rank either.
  MustRegister(m, WORKER, 1, "");
  absl::StatusOr<RegisterResponse> r2 = m.Register(Reg(WORKER, 1, ""));
  EXPECT_EQ(r2.status().code(), absl::StatusCode::kAlreadyExists) << r2.status();
}

TEST_F(ClusterStateTest, SameAddressReRegisteringGetsIncarnationTwo) {
  MAKE_MEMBERSHIP(m, 1, 1);
  EXPECT_EQ(MustRegister(m, WORKER, 0, "hostA:1"), 1);
  const int64_t version = m.View().version();
  absl::StatusOr<RegisterResponse> r = m.Register(Reg(WORKER, 0, "hostA:1"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->incarnation(), 2);
  EXPECT_GT(r->view().version(), version);
  const Member w = FindMember(m.View(), WORKER, 0);
  EXPECT_EQ(w.incarnation(), 2);

  EXPECT_EQ(MustRegister(m, SHARD, 0, "s:1"), 1);
  EXPECT_EQ(MustRegister(m, SHARD, 0, "s:1"), 2);
  EXPECT_EQ(MustRegister(m, SHARD, 0, "s:1"), 3);
}

// ---------------------------------------------------------------------------------------
// Heartbeats and liveness.

TEST_F(ClusterStateTest, HeartbeatOfUnknownMemberIsNotFound) {
  MAKE_MEMBERSHIP(m, 2, 2);
  absl::StatusOr<HeartbeatResponse> r = m.Heartbeat(Hb(WORKER, 1, 1));
  ASSERT_EQ(r.status().code(), absl::StatusCode::kNotFound) << r.status();
  EXPECT_THAT(Msg(r.status()), HasSubstr("Register"));
  absl::StatusOr<HeartbeatResponse> s = m.Heartbeat(Hb(SHARD, 0, 1));
  EXPECT_EQ(s.status().code(), absl::StatusCode::kNotFound) << s.status();
}

TEST_F(ClusterStateTest, HeartbeatOutOfRangeIsInvalidArgument) {
  MAKE_MEMBERSHIP(m, 2, 2);
  absl::StatusOr<HeartbeatResponse> r = m.Heartbeat(Hb(WORKER, 5, 1));
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_THAT(Msg(r.status()), HasSubstr("--num_workers=2"));
}

TEST_F(ClusterStateTest, HeartbeatWithCurrentIncarnationSucceedsAndReturnsViewVersion) {
  MAKE_MEMBERSHIP(m, 1, 1);
  const int64_t inc = MustRegister(m, WORKER, 0, "w0");
  clock_.Advance(absl::Seconds(3));
  absl::StatusOr<HeartbeatResponse> r = m.Heartbeat(Hb(WORKER, 0, inc));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->view_version(), m.View().version());
  EXPECT_EQ(m.View().version(), 2) << "a heartbeat of a live member is not a change";
  const Member w = FindMember(m.View(), WORKER, 0);
  EXPECT_EQ(w.last_heartbeat_ms(), absl::ToUnixMillis(clock_.Now()));
}

TEST_F(ClusterStateTest, HeartbeatWithOldIncarnationIsFailedPrecondition) {
  MAKE_MEMBERSHIP(m, 1, 1);
  EXPECT_EQ(MustRegister(m, WORKER, 0, "w0"), 1);
  EXPECT_EQ(MustRegister(m, WORKER, 0, "w0"), 2);
  absl::StatusOr<HeartbeatResponse> r = m.Heartbeat(Hb(WORKER, 0, 1));
  ASSERT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  EXPECT_THAT(Msg(r.status()), HasSubstr("incarnation 1"));
  EXPECT_THAT(Msg(r.status()), HasSubstr("incarnation 2"));
  EXPECT_TRUE(m.Heartbeat(Hb(WORKER, 0, 2)).ok());
}

TEST_F(ClusterStateTest, CheckLivenessKeepsMembersWithinTheTimeout) {
  MAKE_MEMBERSHIP(m, 1, 1);
  MustRegister(m, SHARD, 0, "s0:5000");
  MustRegister(m, WORKER, 0, "w0");
  const int64_t version = m.View().version();
  clock_.Advance(kTimeout);  // silent exactly the timeout: not longer than it
  EXPECT_FALSE(m.CheckLiveness());
  EXPECT_EQ(m.View().version(), version);
  EXPECT_TRUE(m.View().complete());
}

TEST_F(ClusterStateTest, CheckLivenessDeclaresSilentMembersDeadAfterTimeout) {
  MAKE_MEMBERSHIP(m, 1, 2);
  MustRegister(m, SHARD, 0, "s0:5000");
  const int64_t w0 = MustRegister(m, WORKER, 0, "w0");
  const int64_t s0 = 1;
  MustRegister(m, WORKER, 1, "w1");
  ASSERT_TRUE(m.View().complete());
  const int64_t version = m.View().version();

  // Shard 0 and worker 0 keep heartbeating; worker 1 goes silent.
  clock_.Advance(absl::Seconds(4));
  ASSERT_TRUE(m.Heartbeat(Hb(SHARD, 0, s0)).ok());
  ASSERT_TRUE(m.Heartbeat(Hb(WORKER, 0, w0)).ok());
  clock_.Advance(absl::Seconds(2));  // worker 1: silent 6 s > 5 s
  EXPECT_TRUE(m.CheckLiveness());

  ClusterView v = m.View();
  EXPECT_GT(v.version(), version);
  EXPECT_FALSE(v.complete());
  EXPECT_TRUE(FindMember(v, SHARD, 0).alive());
  EXPECT_TRUE(FindMember(v, WORKER, 0).alive());
  EXPECT_FALSE(FindMember(v, WORKER, 1).alive());
  EXPECT_EQ(v.members_size(), 3) << "dead members stay in the view";

  // Nothing more to declare: no change, no version bump.
  EXPECT_FALSE(m.CheckLiveness());
  EXPECT_EQ(m.View().version(), v.version());
}

// A worker that finished its run and left is not a dead member: after both workers of a
// clean run exited, psctl status said "global step 0, INCOMPLETE" (exit 1) with both DEAD.
TEST_F(ClusterStateTest, WorkersThatFinishedAndFellSilentMakeAFinishedRun) {
  MAKE_MEMBERSHIP(m, 1, 2);
  const int64_t s0 = MustRegister(m, SHARD, 0, "s0:5000");
  const int64_t w0 = MustRegister(m, WORKER, 0, "w0");
  const int64_t w1 = MustRegister(m, WORKER, 1, "w1");
  const int64_t version = m.View().version();
  ASSERT_TRUE(m.ReportProgress(Progress(0, w0, version, 100, 0.25, 900)).ok());
  ReportProgressRequest done = Progress(1, w1, version, 100);
  done.set_finished(true);
  ASSERT_TRUE(m.ReportProgress(done).ok());
  EXPECT_FALSE(m.View().finished()) << "worker 0 has not finished yet";
  done.set_rank(0);
  done.set_incarnation(w0);
  ASSERT_TRUE(m.ReportProgress(done).ok());
  clock_.Advance(kTimeout + absl::Seconds(1));  // the workers have exited; the shard stays
  ASSERT_TRUE(m.Heartbeat(Hb(SHARD, 0, s0)).ok());
  EXPECT_TRUE(m.CheckLiveness());
  const ClusterView v = m.View();
  EXPECT_TRUE(v.finished());
  EXPECT_EQ(v.global_step(), 100) << "a finished run keeps its step";
  EXPECT_TRUE(FindMember(v, WORKER, 0).finished());
  EXPECT_FALSE(FindMember(v, WORKER, 0).alive());
  EXPECT_EQ(FindMember(v, WORKER, 0).loss(), 0.25) << "a finished report keeps the last figures";
  // A worker that registers again starts a new run of its own: no longer finished.
  MustRegister(m, WORKER, 0, "w0");
  EXPECT_FALSE(m.View().finished());
  EXPECT_FALSE(FindMember(m.View(), WORKER, 0).finished());
}

TEST_F(ClusterStateTest, CheckLivenessDeclaresADeadShardAndKeepsItsAddress) {
  MAKE_MEMBERSHIP(m, 1, 1);
  MustRegister(m, SHARD, 0, "s0:1");
  MustRegister(m, WORKER, 0, "w0");
  const int64_t version = m.View().version();
  clock_.Advance(kTimeout + absl::Milliseconds(1));
  EXPECT_TRUE(m.CheckLiveness());
  ClusterView v = m.View();
  EXPECT_EQ(v.version(), version + 1);
  EXPECT_FALSE(v.complete());
  EXPECT_FALSE(FindMember(v, SHARD, 0).alive());
  EXPECT_FALSE(FindMember(v, WORKER, 0).alive());
}

// Regression: a member declared dead whose process survived (stopped past the deadline)
// came back with the same incarnation, and the others, waiting for a new generation,
// waited forever while the view said the cluster was complete. It must register again.
TEST_F(ClusterStateTest, HeartbeatOfADeadMemberMakesItRegisterAsANewIncarnation) {
  MAKE_MEMBERSHIP(m, 1, 1);
  MustRegister(m, SHARD, 0, "s0:5000");
  const int64_t inc = MustRegister(m, WORKER, 0, "w0");
  clock_.Advance(absl::Seconds(10));
  ASSERT_TRUE(m.Heartbeat(Hb(SHARD, 0, 1)).ok());
  ASSERT_TRUE(m.CheckLiveness());
  ASSERT_FALSE(FindMember(m.View(), WORKER, 0).alive());

  absl::StatusOr<HeartbeatResponse> r = m.Heartbeat(Hb(WORKER, 0, inc));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound) << r.status();
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("declared dead"));
  EXPECT_FALSE(FindMember(m.View(), WORKER, 0).alive()) << "a dead member revived itself";
  EXPECT_FALSE(m.View().complete());

  const int64_t again = MustRegister(m, WORKER, 0, "w0");
  EXPECT_GT(again, inc);
  ClusterView v = m.View();
  EXPECT_TRUE(FindMember(v, WORKER, 0).alive());
  EXPECT_TRUE(v.complete());
  EXPECT_TRUE(m.Heartbeat(Hb(WORKER, 0, again)).ok());
}

TEST_F(ClusterStateTest, DeadMembersIdCanBeRegisteredFromAnotherAddress) {
  MAKE_MEMBERSHIP(m, 1, 1);
  MustRegister(m, WORKER, 0, "old:1");
  clock_.Advance(absl::Seconds(6));
  ASSERT_TRUE(m.CheckLiveness());

  absl::StatusOr<RegisterResponse> r = m.Register(Reg(WORKER, 0, "new:1"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->incarnation(), 2);
  const Member w = FindMember(r->view(), WORKER, 0);
  EXPECT_TRUE(w.alive());
  EXPECT_EQ(w.address(), "new:1");
  // The replaced process's heartbeats are refused.
  absl::StatusOr<HeartbeatResponse> hb = m.Heartbeat(Hb(WORKER, 0, 1));
  EXPECT_EQ(hb.status().code(), absl::StatusCode::kFailedPrecondition) << hb.status();
}

TEST_F(ClusterStateTest, DeadShardCanMoveToAnotherAddress) {
  MAKE_MEMBERSHIP(m, 2, 1);
  MustRegister(m, SHARD, 0, "s0-old:5000");
  MustRegister(m, SHARD, 1, "s1:5001");
  clock_.Advance(absl::Seconds(4));
  ASSERT_TRUE(m.Heartbeat(Hb(SHARD, 1, 1)).ok());
  clock_.Advance(absl::Seconds(2));
  ASSERT_TRUE(m.CheckLiveness());
  absl::StatusOr<RegisterResponse> r = m.Register(Reg(SHARD, 0, "s0-new:5000"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->incarnation(), 2);
  EXPECT_THAT(r->view().shard_addresses(), ElementsAre("s0-new:5000", "s1:5001"));
}

// ---------------------------------------------------------------------------------------
// Progress.

TEST_F(ClusterStateTest, ReportProgressUpdatesStepLossAndThroughput) {
  MAKE_MEMBERSHIP(m, 1, 1);
  MustRegister(m, SHARD, 0, "s0:5000");
  const int64_t inc = MustRegister(m, WORKER, 0, "w0");
  const int64_t version = m.View().version();
  ASSERT_TRUE(m.ReportProgress(Progress(0, inc, version, 42, 0.25, 1234.5)).ok());
  ClusterView v = m.View();
  const Member w = FindMember(v, WORKER, 0);
  EXPECT_EQ(w.step(), 42);
  EXPECT_DOUBLE_EQ(w.loss(), 0.25);
  EXPECT_DOUBLE_EQ(w.samples_per_sec(), 1234.5);
  EXPECT_EQ(v.global_step(), 42);
  // An evaluation's report (a metric, rate 0) leaves the rate and loss shown: the status
  // page showed 0 samples/s for a training worker after every evaluation.
  ReportProgressRequest eval = Progress(0, inc, version, 50, 0.9, 0);
  eval.set_has_metric(true);
  eval.set_metric(0.88);
  ASSERT_TRUE(m.ReportProgress(eval).ok());
  const Member after = FindMember(m.View(), WORKER, 0);
  EXPECT_DOUBLE_EQ(after.samples_per_sec(), 1234.5);
  EXPECT_DOUBLE_EQ(after.loss(), 0.25);
  EXPECT_DOUBLE_EQ(after.metric(), 0.88);
  EXPECT_EQ(after.step(), 50);
}

TEST_F(ClusterStateTest, GlobalStepIsMinimumOverLiveWorkers) {
  MAKE_MEMBERSHIP(m, 1, 3);
  MustRegister(m, SHARD, 0, "s0:5000");
  const int64_t i0 = MustRegister(m, WORKER, 0, "w0");
  const int64_t i1 = MustRegister(m, WORKER, 1, "w1");
  const int64_t i2 = MustRegister(m, WORKER, 2, "w2");
  const int64_t version = m.View().version();
  ASSERT_TRUE(m.ReportProgress(Progress(0, i0, version, 30)).ok());
  ASSERT_TRUE(m.ReportProgress(Progress(1, i1, version, 10)).ok());
  ASSERT_TRUE(m.ReportProgress(Progress(2, i2, version, 20)).ok());
  EXPECT_EQ(m.View().global_step(), 10);

  ASSERT_TRUE(m.ReportProgress(Progress(1, i1, version, 25)).ok());
  EXPECT_EQ(m.View().global_step(), 20);

  // Worker 2 (step 20) dies: only live workers count.
  clock_.Advance(absl::Seconds(4));
  ASSERT_TRUE(m.Heartbeat(Hb(SHARD, 0, 1)).ok());
  ASSERT_TRUE(m.Heartbeat(Hb(WORKER, 0, i0)).ok());
  ASSERT_TRUE(m.Heartbeat(Hb(WORKER, 1, i1)).ok());
  clock_.Advance(absl::Seconds(2));
  ASSERT_TRUE(m.CheckLiveness());
  ASSERT_FALSE(FindMember(m.View(), WORKER, 2).alive());
  EXPECT_EQ(m.View().global_step(), 25);
}

TEST_F(ClusterStateTest, GlobalStepIsZeroWithNoLiveWorkers) {
  MAKE_MEMBERSHIP(m, 1, 1);
  const int64_t inc = MustRegister(m, WORKER, 0, "w0");
  ASSERT_TRUE(m.ReportProgress(Progress(0, inc, m.View().version(), 7)).ok());
  EXPECT_EQ(m.View().global_step(), 7);
  clock_.Advance(absl::Seconds(6));
  ASSERT_TRUE(m.CheckLiveness());
  EXPECT_EQ(m.View().global_step(), 0);
}

TEST_F(ClusterStateTest, ReportProgressOfUnregisteredOrReplacedWorkerIsRefused) {
  MAKE_MEMBERSHIP(m, 1, 2);
  absl::Status unknown = m.ReportProgress(Progress(1, 1, 1, 5));
  EXPECT_EQ(unknown.code(), absl::StatusCode::kNotFound) << unknown;
  MustRegister(m, WORKER, 0, "w0");
  MustRegister(m, WORKER, 0, "w0");  // incarnation 2
  absl::Status old = m.ReportProgress(Progress(0, 1, m.View().version(), 5));
  EXPECT_EQ(old.code(), absl::StatusCode::kNotFound) << old;
  EXPECT_EQ(FindMember(m.View(), WORKER, 0).step(), 0);
  absl::Status out_of_range = m.ReportProgress(Progress(2, 1, m.View().version(), 5));
  EXPECT_EQ(out_of_range.code(), absl::StatusCode::kInvalidArgument) << out_of_range;
}

// A metric picks the checkpoint kept as the best and a rate is summed and charted: not a
// number, they are refused; a diverged run's NaN loss is shown as it is.
TEST_F(ClusterStateTest, ReportProgressWithANonFiniteMetricOrRateIsRefused) {
  MAKE_MEMBERSHIP(m, 1, 1);
  MustRegister(m, SHARD, 0, "s0:5000");
  const int64_t inc = MustRegister(m, WORKER, 0, "w0");
  const ClusterView before = m.View();
  ReportProgressRequest nan_metric = Progress(0, inc, before.version(), 3, 0.5, 100);
  nan_metric.set_has_metric(true);
  nan_metric.set_metric(std::nan(""));
  EXPECT_EQ(m.ReportProgress(nan_metric).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m.ReportProgress(Progress(0, inc, before.version(), 3, 0.5, INFINITY)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m.ReportProgress(Progress(0, inc, before.version(), 3, 0.5, -1)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m.View().SerializeAsString(), before.SerializeAsString());
  EXPECT_TRUE(m.ReportProgress(Progress(0, inc, before.version(), 3, std::nan(""), 100)).ok());
}

// A worker's step time is charted per worker: kept as reported, and refused (naming it,
// changing nothing) unless each part is a number of milliseconds from 0 to a day.
TEST_F(ClusterStateTest, ReportProgressKeepsASaneStepTimeAndRefusesOthers) {
  MAKE_MEMBERSHIP(m, 1, 1);
  MustRegister(m, SHARD, 0, "s0:5000");
  const int64_t inc = MustRegister(m, WORKER, 0, "w0");
  ReportProgressRequest r = Progress(0, inc, m.View().version(), 3, 0.5, 100);
  r.mutable_step_time()->set_compute_ms(12.5);
  r.mutable_step_time()->set_communication_ms(30);
  r.mutable_step_time()->set_other_ms(0.25);
  ASSERT_TRUE(m.ReportProgress(r).ok());
  const ClusterView before = m.View();
  const Member* w = nullptr;
  for (const Member& member : before.members()) {
    if (member.role() == WORKER) w = &member;
  }
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->step_time().SerializeAsString(), r.step_time().SerializeAsString());
  for (double bad : {-1.0, static_cast<double>(NAN), static_cast<double>(INFINITY), 1e12}) {
    ReportProgressRequest b = r;
    b.mutable_step_time()->set_other_ms(bad);
    const absl::Status s = m.ReportProgress(b);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(s.message()), HasSubstr("step time")) << s;
  }
  EXPECT_EQ(m.View().SerializeAsString(), before.SerializeAsString());
}

TEST_F(ClusterStateTest, ReportProgressWithANegativeStepIsInvalidArgumentAndChangesNothing) {
  MAKE_MEMBERSHIP(m, 1, 1);
  MustRegister(m, SHARD, 0, "s0:5000");
  const int64_t inc = MustRegister(m, WORKER, 0, "w0");
  ASSERT_TRUE(m.ReportProgress(Progress(0, inc, m.View().version(), 7, 0.5, 100)).ok());
  const ClusterView before = m.View();

  ReportProgressRequest negative = Progress(0, inc, before.version(), -3, 9.0, 1.0);
  negative.set_has_metric(true);
  negative.set_metric(0.99);
  absl::Status s = m.ReportProgress(negative);
  ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(Msg(s), HasSubstr("step -3"));
  EXPECT_THAT(Msg(s), HasSubstr("must not be negative"));
  const ClusterView after = m.View();
  EXPECT_EQ(after.SerializeAsString(), before.SerializeAsString())
      << "a refused report changed the view:\n"
      << after.DebugString();
  const Member w = FindMember(after, WORKER, 0);
  EXPECT_EQ(w.step(), 7);
  EXPECT_DOUBLE_EQ(w.loss(), 0.5);
  EXPECT_FALSE(w.has_metric());
  EXPECT_EQ(after.global_step(), 7);
}

TEST_F(ClusterStateTest, ReportProgressWithViewOlderThanShardAddressChangeIsStale) {
  MAKE_MEMBERSHIP(m, 2, 1);
  MustRegister(m, SHARD, 0, "s0:5000");
  const int64_t inc = MustRegister(m, WORKER, 0, "w0");
  const int64_t before = m.View().version();
  ASSERT_TRUE(m.ReportProgress(Progress(0, inc, before, 1)).ok());

  absl::StatusOr<RegisterResponse> shard1 = m.Register(Reg(SHARD, 1, "s1:5001"));
  ASSERT_TRUE(shard1.ok()) << shard1.status();
  const int64_t after = shard1->view().version();
  ASSERT_GT(after, before);

  absl::Status stale = m.ReportProgress(Progress(0, inc, before, 2));
  ASSERT_EQ(stale.code(), absl::StatusCode::kFailedPrecondition) << stale;
  EXPECT_THAT(Msg(stale), HasSubstr("stale"));
  EXPECT_EQ(FindMember(m.View(), WORKER, 0).step(), 1) << "a stale report is not applied";

  // The view that carries the new address is fine, and so is any newer one.
  EXPECT_TRUE(m.ReportProgress(Progress(0, inc, after, 3)).ok());
  EXPECT_TRUE(m.ReportProgress(Progress(0, inc, after + 1, 4)).ok());
  EXPECT_EQ(FindMember(m.View(), WORKER, 0).step(), 4);
}

TEST_F(ClusterStateTest, ShardMovingToANewAddressMakesEarlierViewsStale) {
  MAKE_MEMBERSHIP(m, 1, 1);
  MustRegister(m, SHARD, 0, "s0-old:5000");
  const int64_t inc = MustRegister(m, WORKER, 0, "w0");
  clock_.Advance(absl::Seconds(4));
  ASSERT_TRUE(m.Heartbeat(Hb(WORKER, 0, inc)).ok());
  clock_.Advance(absl::Seconds(2));
  ASSERT_TRUE(m.CheckLiveness());  // shard 0 dies
  const int64_t before = m.View().version();
  ASSERT_TRUE(m.ReportProgress(Progress(0, inc, before, 1)).ok())
      << "a death is not a shard address change";

  absl::StatusOr<RegisterResponse> moved = m.Register(Reg(SHARD, 0, "s0-new:5000"));
  ASSERT_TRUE(moved.ok()) << moved.status();
  absl::Status stale = m.ReportProgress(Progress(0, inc, before, 2));
  EXPECT_EQ(stale.code(), absl::StatusCode::kFailedPrecondition) << stale;
  EXPECT_THAT(Msg(stale), HasSubstr("stale"));
  EXPECT_TRUE(m.ReportProgress(Progress(0, inc, moved->view().version(), 2)).ok());
}

TEST_F(ClusterStateTest, ShardRestartAtSameAddressDoesNotMakeViewsStale) {
  MAKE_MEMBERSHIP(m, 1, 1);
  MustRegister(m, SHARD, 0, "s0:5000");
  const int64_t inc = MustRegister(m, WORKER, 0, "w0");
  const int64_t before = m.View().version();
  EXPECT_EQ(MustRegister(m, SHARD, 0, "s0:5000"), 2);
  EXPECT_GT(m.View().version(), before);
  EXPECT_TRUE(m.ReportProgress(Progress(0, inc, before, 1)).ok());
}

TEST_F(ClusterStateTest, RegisteringAWorkerDoesNotMakeEarlierViewsStaleForProgress) {
  MAKE_MEMBERSHIP(m, 1, 3);
  MustRegister(m, SHARD, 0, "s0:5000");
  const int64_t inc = MustRegister(m, WORKER, 0, "w0");
  const int64_t before = m.View().version();
  MustRegister(m, WORKER, 1, "w1");
  MustRegister(m, WORKER, 2, "w2");
  ASSERT_GT(m.View().version(), before);
  absl::Status s = m.ReportProgress(Progress(0, inc, before, 5));
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(FindMember(m.View(), WORKER, 0).step(), 5);
}

TEST_F(ClusterStateTest, ReportProgressDoesNotBumpTheViewVersion) {
  MAKE_MEMBERSHIP(m, 1, 1);
  MustRegister(m, SHARD, 0, "s0:5000");
  const int64_t inc = MustRegister(m, WORKER, 0, "w0");
  const int64_t version = m.View().version();
  ASSERT_TRUE(m.ReportProgress(Progress(0, inc, version, 9)).ok());
  EXPECT_EQ(m.View().version(), version);
}

// ---------------------------------------------------------------------------------------
// AwaitView.

TEST_F(ClusterStateTest, AwaitViewReturnsAtOnceWhenSatisfied) {
  MAKE_MEMBERSHIP(m, 1, 1);
  MustRegister(m, SHARD, 0, "s0:5000");
  MustRegister(m, WORKER, 0, "w0");
  const absl::Time past = absl::Now() - absl::Seconds(1);
  absl::StatusOr<ClusterView> v = m.AwaitView(3, /*complete=*/true, past);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->version(), 3);
  EXPECT_TRUE(v->complete());

  absl::StatusOr<ClusterView> any = m.AwaitView(0, /*complete=*/false, past);
  ASSERT_TRUE(any.ok()) << any.status();
  EXPECT_EQ(any->version(), 3);
}

TEST_F(ClusterStateTest, AwaitViewTimesOutWaitingForAVersion) {
  MAKE_MEMBERSHIP(m, 1, 1);
  absl::StatusOr<ClusterView> v =
      m.AwaitView(5, /*complete=*/false, absl::Now() - absl::Seconds(1));
  ASSERT_EQ(v.status().code(), absl::StatusCode::kDeadlineExceeded) << v.status();
  EXPECT_THAT(Msg(v.status()), HasSubstr(">= 5"));
  EXPECT_THAT(Msg(v.status()), HasSubstr("current version 1"));
}

TEST_F(ClusterStateTest, AwaitViewTimesOutListingNeverRegisteredAndDeadMembers) {
  MAKE_MEMBERSHIP(m, 2, 2);
  MustRegister(m, SHARD, 0, "s0:5000");
  const int64_t w0 = MustRegister(m, WORKER, 0, "w0");
  MustRegister(m, WORKER, 1, "w1");
  clock_.Advance(absl::Seconds(4));
  ASSERT_TRUE(m.Heartbeat(Hb(SHARD, 0, 1)).ok());
  ASSERT_TRUE(m.Heartbeat(Hb(WORKER, 0, w0)).ok());
  clock_.Advance(absl::Seconds(2));
  ASSERT_TRUE(m.CheckLiveness());  // worker 1 dies

  absl::StatusOr<ClusterView> v = m.AwaitView(0, /*complete=*/true, absl::Now() - absl::Seconds(1));
  ASSERT_EQ(v.status().code(), absl::StatusCode::kDeadlineExceeded) << v.status();
  const std::string msg = Msg(v.status());
  EXPECT_THAT(msg, HasSubstr("shard 1 (never registered)"));
  EXPECT_THAT(msg, HasSubstr("worker rank 1 (dead)"));
  EXPECT_THAT(msg, Not(HasSubstr("shard 0")));
  EXPECT_THAT(msg, Not(HasSubstr("worker rank 0")));
}

TEST_F(ClusterStateTest, AwaitViewWakesWhenTheLastMemberRegisters) {
  MAKE_MEMBERSHIP(m, 1, 2);
  MustRegister(m, SHARD, 0, "s0:5000");
  MustRegister(m, WORKER, 0, "w0");
  ASSERT_FALSE(m.View().complete());

  absl::StatusOr<ClusterView> result = absl::UnknownError("not run");
  std::thread waiter(
      [&] { result = m.AwaitView(0, /*complete=*/true, absl::Now() + absl::Seconds(30)); });
  MustRegister(m, WORKER, 1, "w1");
  waiter.join();

  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(result->complete());
  EXPECT_EQ(result->members_size(), 3);
  EXPECT_EQ(result->version(), 4);
}

TEST_F(ClusterStateTest, AParkedAwaitViewIsWokenWhenTheViewBecomesComplete) {
  MAKE_MEMBERSHIP(m, 1, 2);
  MustRegister(m, SHARD, 0, "s0:5000");
  MustRegister(m, WORKER, 0, "w0");
  auto waiter = std::make_shared<testing::CountingWaiter>();
  Wait how = testing::ParkedWait(waiter, absl::Now() + absl::Seconds(30));
  EXPECT_TRUE(IsParked(m.AwaitView(0, /*complete=*/true, how).status()));
  ASSERT_FALSE(m.View().complete());
  EXPECT_EQ(waiter->wakes, 0);
  MustRegister(m, WORKER, 1, "w1");
  EXPECT_EQ(waiter->wakes, 1);
  absl::StatusOr<ClusterView> view = m.AwaitView(0, /*complete=*/true, how);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_TRUE(view->complete());
}

TEST_F(ClusterStateTest, AParkedAwaitViewHearsOfShutdown) {
  MAKE_MEMBERSHIP(m, 2, 1);
  auto waiter = std::make_shared<testing::CountingWaiter>();
  Wait how = testing::ParkedWait(waiter, absl::Now() + absl::Seconds(30));
  EXPECT_TRUE(IsParked(m.AwaitView(100, /*complete=*/false, how).status()));
  m.Shutdown();
  EXPECT_EQ(waiter->wakes, 1);
  EXPECT_EQ(m.AwaitView(100, /*complete=*/false, how).status().code(),
            absl::StatusCode::kUnavailable);
}

TEST_F(ClusterStateTest, AwaitViewWakesOnAVersionBump) {
  MAKE_MEMBERSHIP(m, 2, 1);
  absl::StatusOr<ClusterView> result = absl::UnknownError("not run");
  std::thread waiter(
      [&] { result = m.AwaitView(2, /*complete=*/false, absl::Now() + absl::Seconds(30)); });
  MustRegister(m, SHARD, 1, "s1:5001");
  waiter.join();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_GE(result->version(), 2);
  EXPECT_FALSE(result->complete());
}

TEST_F(ClusterStateTest, AwaitViewWakesWhenADeadMemberRegistersAgain) {
  MAKE_MEMBERSHIP(m, 1, 1);
  MustRegister(m, SHARD, 0, "s0:5000");
  const int64_t inc = MustRegister(m, WORKER, 0, "w0");
  clock_.Advance(absl::Seconds(4));
  ASSERT_TRUE(m.Heartbeat(Hb(SHARD, 0, 1)).ok());
  clock_.Advance(absl::Seconds(2));
  ASSERT_TRUE(m.CheckLiveness());
  ASSERT_FALSE(m.View().complete());

  absl::StatusOr<ClusterView> result = absl::UnknownError("not run");
  std::thread waiter(
      [&] { result = m.AwaitView(0, /*complete=*/true, absl::Now() + absl::Seconds(30)); });
  EXPECT_FALSE(m.Heartbeat(Hb(WORKER, 0, inc)).ok());
  EXPECT_GT(MustRegister(m, WORKER, 0, "w0"), inc);
  waiter.join();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(result->complete());
}

}  // namespace
}  // namespace pscluster::coord
