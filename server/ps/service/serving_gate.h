// Whether the shard serves clients now, and the one way a mutation reaches it: every write
// goes through Write, which numbers it in a log and answers a repeated request id once. A
// shard alone appends to its own log; a chain's head appends to the chain's (Replicator),
// which hands the write down the chain.
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/server_context.h"
#include "proto/ps.pb.h"
#include "server/ps/replication/replicator.h"
#include "server/ps/replication/write_log.h"

namespace pscluster::ps {

class ServingGate {
 public:
  ServingGate(uint32_t shard_id, absl::Duration max_wait);

  // The shard's chain (ps_coordinator --replicas > 1; null: not replicated). From then on
  // only the chain's head serves clients, and every update goes down the chain.
  void SetReplicator(Replicator* replicator) { replicator_ = replicator; }
  Replicator* replicator() const { return replicator_.load(); }
  // False while a shard started with --coordinator has not registered yet: its data calls
  // get UNAVAILABLE. A restarted shard served its workers' pushes before the coordinator's
  // view showed its new incarnation, and they took the refusal of a step the restored
  // tables had not reached for their own error instead of rolling back.
  void SetJoined(bool joined) { joined_ = joined; }
  // The server's grpc.health.v1 service (null: none), NOT_SERVING while Restore runs.
  void SetHealth(grpc::HealthCheckServiceInterface* health) { health_ = health; }
  grpc::HealthCheckServiceInterface* health() const { return health_.load(); }

  // OK when this shard serves clients: registered, and not replicated or its chain's head.
  absl::Status CheckServing() const;
  // When a call must be answered by: a little before its client gives up, so that the
  // client hears what the wait was for, and never later than max_wait from now.
  absl::Time Deadline(const grpc::ServerContextBase* ctx) const;
  // A client's mutation, checked already: apply() once per request id, in the log's order;
  // with a chain, describe() fills in the update handed down it (chunks: a stream's bytes).
  absl::Status Write(const grpc::ServerContextBase* ctx,
                     const std::function<void(ReplicatedUpdate*)>& describe,
                     std::vector<std::string>* chunks, const std::function<absl::Status()>& apply);

  // Held shared by every handler that uses the tables, exclusively to replace them.
  absl::Mutex* serving_mu() { return &serving_mu_; }
  // Replaces the tables (Restore): install() runs once every handler has left; repeats of
  // writes into the old tables apply again.
  void ReplaceTables(const std::function<void()>& install);
  // A joining replica installed its state (the caller holds serving_mu() exclusively).
  void TablesReplaced() { tables_replaced_++; }
  // Counts the tables' replacements: a pull stream, which reads its table across
  // callbacks, ends when it changes under it.
  uint64_t tables_replaced() const { return tables_replaced_.load(); }

 private:
  const uint32_t shard_id_;
  const absl::Duration max_wait_;
  std::atomic<grpc::HealthCheckServiceInterface*> health_{nullptr};
  std::atomic<Replicator*> replicator_{nullptr};
  std::atomic<bool> joined_{true};
  absl::Mutex serving_mu_;
  // Without a chain, every write goes through this log (with one, through the chain's):
  // a repeated attempt of a write (its slice ran out before the answer came) is not
  // applied again.
  static constexpr size_t kWriteIds = 4096;
  absl::Mutex log_mu_ ABSL_ACQUIRED_AFTER(serving_mu_);
  WriteLog alone_;
  std::atomic<uint64_t> tables_replaced_{0};
};

}  // namespace pscluster::ps
