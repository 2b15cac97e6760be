// What a shard's three services share: the shard and its snapshots, the gate every call
// passes and every write goes through, the commands that change the tables, and the limits
// and threads the handlers draw on.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "common/graceful_shutdown.h"
#include "common/work_queue.h"
#include "grpcpp/server_context.h"
#include "server/ps/service/buffer_pool.h"
#include "server/ps/service/commands.h"
#include "server/ps/service/idle_memory.h"
#include "server/ps/service/options.h"
#include "server/ps/service/request_budget.h"
#include "server/ps/service/serving_gate.h"
#include "server/ps/service/stream_watchdog.h"
#include "server/ps/snapshot/snapshotter.h"
#include "server/ps/table/shard.h"

namespace pscluster::ps {

struct ShardCore {
  // `snapshotter` may be null (no --data_dir): snapshot RPCs then fail clearly.
  ShardCore(Shard* shard, Snapshotter* snapshotter, ServiceOptions options);

  // Held by every handler that uses the tables. With `ctx` (the push and pull handlers),
  // the workers the call touches count as in a call of the client its ps-client-id
  // metadata names until it ends (Shard::Visit).
  class Scope {
   public:
    explicit Scope(ShardCore* core, const grpc::ServerContextBase* ctx = nullptr);
    Shard::Visit* visit() { return &visit_; }

   private:
    InFlightCounter::Scope in_flight_;
    absl::ReaderMutexLock serving_;
    Shard::Visit visit_;
  };

  Shard* const shard;
  Snapshotter* const snapshotter;
  const ServiceOptions options;
  ServingGate gate;
  Commands commands;
  StreamWatchdog watchdog;
  BufferPool buffers;
  RequestBudget budget;
  InFlightCounter in_flight;  // handlers in progress, for ShutdownGracefully
  // Where the callback handlers run what may block: a woken pull, a chain's round trip.
  static constexpr int kPoolThreads = 4;
  WorkQueue pool{kPoolThreads};
  // Where the admin calls that may wait long run (a snapshot's step, a restore): apart, so
  // that they never hold up a woken pull.
  static constexpr int kAdminThreads = 2;
  WorkQueue admin_pool{kAdminThreads};
  // Where a replica applies the updates from the one before it and hands them on, and
  // streams its state to a joiner: apart, since each may wait for another replica.
  WorkQueue replication_pool;
  IdleMemoryReleaser releaser;  // last: its thread uses the others
};

}  // namespace pscluster::ps
