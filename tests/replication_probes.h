// What the tests of replicated shards ask a replica directly (Stats over its own stub),
// and the checks built on it: pushes applied, a pause in training, fingerprints compared.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "client/ps/shard_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/ps.grpc.pb.h"
#include "tests/fault_cluster.h"

namespace pscluster::testing {

inline ClusterOptions Replicated(int replicas) {
  ClusterOptions o;
  o.replicas = replicas;
  o.heartbeat_timeout_ms = 600;  // failover well within a second
  return o;
}

inline std::unique_ptr<pscluster::ShardStub> StubTo(const std::string& address) {
  return pscluster::ShardStub::New(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
}

// Pushes applied by a replica, summed over its tables (-1: no answer).
inline int64_t PushesApplied(pscluster::ShardStub* stub) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  ps::StatsResponse stats;
  if (!stub->Stats(&ctx, ps::StatsRequest(), &stats).ok()) return -1;
  int64_t pushes = 0;
  for (const auto& t : stats.tables()) pushes += t.pushes();
  return pushes;
}

// Waits (bounded) until `stub`'s replica has applied two more steps' pushes than at the
// kill: the pause training took. Two steps, because updates in flight at the kill may
// still arrive; one whole step is then applied after the failover.
inline absl::Duration AwaitTrainingAgain(pscluster::ShardStub* stub, int64_t tables,
                                         absl::Time killed, int64_t at_kill) {
  const int64_t target = at_kill + 2 * kWorkers * tables;
  for (const absl::Time give_up = absl::Now() + absl::Seconds(60); absl::Now() < give_up;) {
    if (PushesApplied(stub) >= target) return absl::Now() - killed;
    absl::SleepFor(absl::Milliseconds(2));
  }
  ADD_FAILURE() << "training did not go on within 60 s of the failover";
  return absl::InfiniteDuration();
}

// The replica's fingerprint: a CRC of its whole state (0: no answer).
inline uint32_t Fingerprint(pscluster::ShardStub* stub) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  ps::StatsRequest req;
  req.set_fingerprint(true);
  ps::StatsResponse stats;
  EXPECT_TRUE(stub->Stats(&ctx, req, &stats).ok());
  return stats.fingerprint();
}

// Every replica of every shard holds bitwise the same state as its head.
inline void ExpectReplicasEqual(Cluster& cluster, int replicas) {
  for (int s = 0; s < kShards; ++s) {
    const uint32_t head = Fingerprint(StubTo(cluster.shard_address(s, 0)).get());
    EXPECT_NE(head, 0u);
    for (int r = 1; r < replicas; ++r) {
      EXPECT_EQ(Fingerprint(StubTo(cluster.shard_address(s, r)).get()), head)
          << "shard " << s << " replica " << r << " differs from replica 0";
    }
  }
}

inline int64_t Tables(pscluster::ShardStub* stub) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  ps::StatsResponse stats;
  EXPECT_TRUE(stub->Stats(&ctx, ps::StatsRequest(), &stats).ok());
  return stats.tables_size();
}

inline void ExpectNoRollbackAndSameParameters(const std::vector<std::string>& run,
                                              const std::vector<std::string>& clean) {
  for (int r = 0; r < kWorkers; ++r) {
    SCOPED_TRACE(run[r]);
    EXPECT_EQ(Field(run[r], "rollbacks"), "[]") << "worker " << r << " rolled back";
    EXPECT_EQ(Field(run[r], "param_crc32c"), Field(clean[r], "param_crc32c"))
        << "the final parameters differ from the uninterrupted run's";
    EXPECT_GT(std::stod(Field(run[r], "test_accuracy")), 0.9);
  }
}

}  // namespace pscluster::testing
