// ps_server: one parameter-server shard.
//
//   ps_server --port=5000 --shard_id=0 --num_shards=2
//
// Prints "ps_server shard S/N listening on HOST:PORT" once it serves (with --port=0 the
// kernel picks a free port). SIGTERM or SIGINT: fail waiting pulls, let RPCs in progress
// finish (up to 5 s), close every connection, exit 0; while still registering with the
// coordinator (--coordinator), exit 0 at once.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/coordinator/coordinator_client.h"
#include "common/command_line.h"
#include "common/logging.h"
#include "common/malloc_mode.h"
#include "common/metrics_flags.h"
#include "common/mutex_mode.h"
#include "common/parse_errors.h"
#include "common/security_flags.h"
#include "common/status_macros.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "server/ps/flags.h"
#include "server/ps/service/shard_services.h"
#include "server/ps/shard_metrics.h"

namespace pscluster::ps {
namespace {

// The snapshotter (null without --data_dir), after --restore loaded a snapshot.
// The disk tier of sparse tables, when --sparse_memory_bytes asks for one (else null).
absl::StatusOr<std::unique_ptr<DiskTier>> OpenDiskTier(ServerFlags* f) {
  if (f->disk_tier.memory_bytes == 0) return nullptr;
  auto tier = DiskTier::Open(f->disk_tier);
  if (!tier.ok()) return tier.status();
  f->shard.disk_tier = tier->get();
  LogInfo("sparse rows beyond %llu bytes of RAM go to the disk tier in %s",
          static_cast<unsigned long long>(f->disk_tier.memory_bytes), f->disk_tier.dir.c_str());
  return tier;
}

absl::StatusOr<std::unique_ptr<Snapshotter>> OpenSnapshots(const ServerFlags& f, Shard* shard) {
  if (f.snapshots.root.empty()) return nullptr;
  absl::StatusOr<std::unique_ptr<Snapshotter>> created = Snapshotter::Create(shard, f.snapshots);
  if (!created.ok()) {
    return absl::Status(created.status().code(), absl::StrCat("--data_dir=", f.snapshots.root, ": ",
                                                              created.status().ToString()));
  }
  if (f.restore.empty()) return created;
  absl::StatusOr<int64_t> step = (*created)->Restore(f.restore);
  if (!step.ok()) {
    return absl::Status(step.status().code(),
                        absl::StrCat("--restore=", f.restore, ": ", step.status().ToString()));
  }
  if (*step < 0) {
    // This shard's own parts, if any: then the other shards' are not under this root.
    std::vector<int64_t> own;
    if (auto list = (*created)->List(); list.ok()) {
      for (const SnapshotInfo& i : list->snapshots()) own.push_back(i.step());
    }
    LogInfo("no complete snapshot under %s%s; starting empty", f.snapshots.root.c_str(),
            own.empty() ? ""
                        : absl::StrCat(" (this shard's part of step(s) ", absl::StrJoin(own, ", "),
                                       " is there, but no step has every shard's part: give "
                                       "every shard the same --data_dir root)")
                              .c_str());
  } else {
    LogInfo("restored snapshot of step %lld from %s", static_cast<long long>(*step),
            f.snapshots.root.c_str());
  }
  return created;
}

// The calls that change what a cluster is rather than train in it: with an admin token set
// they need it (a worker's cluster token gets PERMISSION_DENIED).
std::set<std::string> AdminMethods() {
  std::set<std::string> methods = pscluster::AdminMethods(
      "pscluster.ps.ShardAdmin", {"CreateTable", "Snapshot", "Restore", "ImportDense"});
  methods.merge(pscluster::AdminMethods("pscluster.ps.ShardData", {"UnregisterWorker"}));
  // between the replicas of a shard (they hold the admin token)
  methods.merge(pscluster::AdminMethods("pscluster.ps.ShardReplication",
                                        {"Replicate", "TransferState", "JoinedChain"}));
  return methods;
}

// Listening on --host:--port (the port chosen is in *port).
absl::StatusOr<std::unique_ptr<grpc::Server>> Listen(const ServerFlags& f,
                                                     const pscluster::Security& security,
                                                     ShardServices* services,
                                                     pscluster::Metrics* metrics, int* port) {
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ServerCredentials> credentials,
                   security.ServerCredentials(AdminMethods()));
  grpc::ResourceQuota quota("ps_server");
  quota.SetMaxThreads(f.threads);
  // gRPC's own buffers (requests being received, answers being sent) are bounded by the
  // request budget too: as they fill the quota gRPC shrinks its flow-control windows, and at
  // the limit it cancels streams (RESOURCE_EXHAUSTED). So that never happens to traffic the
  // handlers would accept, the quota holds at least a message per handler thread. What the
  // handlers hold is the service's RequestBudget.
  quota.Resize(std::max<uint64_t>(f.service.max_inflight_request_bytes,
                                  uint64_t{1} * f.threads * MaxMessageBytes(f.service)));
  // grpc.health.v1.Health: SERVING once listening (after any --restore), NOT_SERVING while
  // draining. Set before the builder exists: the builder reads it.
  grpc::EnableDefaultHealthCheckService(true);
  // Server reflection, so generic gRPC tools (grpc_cli, grpcurl) discover the services without
  // the repository's .proto files. Before the builder too: its plugins are read at creation.
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  const std::string address = absl::StrCat(f.host, ":", f.port);
  builder.AddListeningPort(address, credentials, port);
  builder.SetResourceQuota(quota);
  builder.SetMaxReceiveMessageSize(MaxMessageBytes(f.service));
  builder.SetMaxSendMessageSize(MaxMessageBytes(f.service));
  services->RegisterWith(&builder);
  NameUnparsableRequests(&builder, metrics ? metrics->rpcs().Interceptor() : nullptr);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || *port == 0) return pscluster::CannotListen(address, security);
  return server;
}

// This replica's place in the view's chain of its shard.
ChainConfig ChainOf(const coord::ClusterView& view, uint32_t shard) {
  ChainConfig c;
  if (static_cast<int>(shard) >= view.chains_size()) return c;
  const coord::Chain& chain = view.chains(shard);
  c.epoch = chain.epoch();
  c.replicas.assign(chain.replicas().begin(), chain.replicas().end());
  c.addresses.assign(chain.addresses().begin(), chain.addresses().end());
  c.formed = chain.formed();
  return c;
}

// What the heartbeat thread and the chain share: the replicator to keep informed, set once
// it exists (the heartbeat thread starts inside CoordinatorClient::Register).
struct ChainFollower {
  explicit ChainFollower(uint32_t shard) : shard(shard) {}
  // Asks for the view and hands the replicator its chain; false when it cannot yet.
  bool Refresh() {
    Replicator* r = replicator.load();
    CoordinatorClient* c = client.load();
    if (r == nullptr || c == nullptr) return false;
    auto view = c->AwaitView(0, false, absl::Seconds(2));
    if (view.ok()) r->Update(ChainOf(*view, shard));
    return view.ok();
  }
  // Every new view, as the coordinator makes it: the chain in it, at once.
  void View(const coord::ClusterView& view) {
    Replicator* r = replicator.load();
    if (r == nullptr) return;
    seen.store(view.version());
    r->Update(ChainOf(view, shard));
  }
  // Every answered heartbeat renews the replicator's lease; a new view version refreshes.
  void Heartbeat(int64_t version, absl::Time sent) {
    Replicator* r = replicator.load();
    if (r == nullptr) return;
    r->Renew(sent);
    if (seen.exchange(version) != version) Refresh();
  }

  const uint32_t shard;
  std::atomic<Replicator*> replicator{nullptr};
  std::atomic<CoordinatorClient*> client{nullptr};
  std::atomic<int64_t> seen{0};
};

// This replica of a chain-replicated shard (the view keeps several): its replicator, which
// follows the chain through `follower` and joins it when it is outside.
std::unique_ptr<Replicator> Replicate(const ServerFlags& f, const pscluster::Security& security,
                                      const std::string& address, CoordinatorClient* coordinator,
                                      std::shared_ptr<ChainFollower> follower,
                                      ShardServices* services) {
  ReplicatorOptions ro;
  ro.shard_id = f.shard.shard_id;
  ro.replica = f.replica;
  // Under the coordinator's liveness timeout, so this head stops serving before the
  // coordinator could have replaced it.
  ro.lease = coordinator->heartbeat_timeout() * 3 / 4;
  ro.forward_timeout = f.forward_timeout;
  ro.max_message_bytes = MaxMessageBytes(f.service);
  ro.security = security;
  ro.refresh = [follower] { return follower->Refresh(); };
  ro.chain_key = [coordinator] { return coordinator->chain_key(); };
  ro.report_unreachable = [coordinator, shard = f.shard.shard_id](const std::string& address) {
    coordinator->ReportUnreachable(shard, address, absl::Milliseconds(200)).IgnoreError();
  };
  ro.address = address;
  ro.shard = f.shard;
  // A replica that must stop shuts down as on SIGTERM, and main exits 3 (chain->stopped()).
  ro.stop = [] { kill(getpid(), SIGTERM); };
  ro.append = [coordinator](int32_t r, int64_t epoch) { return coordinator->JoinChain(r, epoch); };
  ro.shrink = [coordinator](int32_t r, int64_t epoch) {
    return coordinator->ShrinkChain(r, epoch);
  };
  std::unique_ptr<Replicator> chain = services->NewReplicator(ro);
  chain->Renew(absl::Now() - absl::Milliseconds(100));  // Register just answered
  chain->Update(ChainOf(coordinator->registered_view(), f.shard.shard_id));
  follower->client.store(coordinator);
  follower->replicator.store(chain.get());
  services->core()->gate.SetReplicator(chain.get());
  chain->StartJoining();  // a replica outside its live chain (a replacement) joins it
  return chain;
}

// With --coordinator: registered and heartbeating (null without one). When the coordinator
// keeps several replicas of each shard, *chain follows this shard's chain (its lease renewed
// by every heartbeat answered, the chain asked for again whenever the view changed).
absl::StatusOr<std::unique_ptr<CoordinatorClient>> Register(const ServerFlags& f,
                                                            const pscluster::Security& security,
                                                            int port, ShardServices* services,
                                                            std::unique_ptr<Replicator>* chain) {
  if (f.coordinator.empty()) return nullptr;
  CoordinatorClientOptions co;
  co.coordinator = f.coordinator;
  co.security = security;
  co.role = coord::SHARD;
  co.id = static_cast<int32_t>(f.shard.shard_id);
  co.replica = f.replica;
  co.group_size = static_cast<int32_t>(f.shard.num_shards);
  co.address = absl::StrCat(f.advertise_host, ":", f.advertise_port > 0 ? f.advertise_port : port);
  auto follower = std::make_shared<ChainFollower>(f.shard.shard_id);
  co.on_heartbeat = [follower](int64_t version, absl::Time sent) {
    follower->Heartbeat(version, sent);
  };
  co.on_view = [follower](const coord::ClusterView& view) { follower->View(view); };
  ASSIGN_OR_RETURN(auto coordinator, CoordinatorClient::Register(co));
  LogInfo("registered with the coordinator at %s as %s", f.coordinator.c_str(), co.address.c_str());
  // Its registration's answer carries the view (no call more: workers that see this shard
  // in the view call it, and it refuses data calls until Register returns).
  const int replicas = coordinator->registered_view().replicas();
  if (replicas > 1) {
    *chain = Replicate(f, security, co.address, coordinator.get(), follower, services);
    LogInfo("shard %u replica %d of %d, chain-replicated", f.shard.shard_id, f.replica, replicas);
  } else if (f.replica > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--replica=", f.replica,
                     " but the coordinator keeps one copy of each shard (start it with --replicas=",
                     f.replica + 1, " or more)"));
  }
  return coordinator;
}

// Register, while a SIGTERM or SIGINT (registering may wait up to a minute for the
// coordinator) stops the shard at once: it has served no data call and taken no write yet.
absl::StatusOr<std::unique_ptr<CoordinatorClient>> RegisterOrStop(
    const ServerFlags& f, const pscluster::Security& security, int port, ShardServices* services,
    std::unique_ptr<Replicator>* chain) {
  std::atomic<bool> registered{false};
  auto stop_on_signal = [&] {
    while (!registered.load()) {
      const int sig = pscluster::TakeTerminationSignal(absl::Milliseconds(100));
      if (sig == 0) continue;
      if (registered.load()) {  // too late: the signal is ServeUntilSignal's
        kill(getpid(), sig);
        return;
      }
      LogWarning(
          "signal %d while registering with the coordinator at %s: "
          "stopped (no data call was served)",
          sig, f.coordinator.c_str());
      std::_Exit(0);
    }
  };
  std::thread watch;
  if (!f.coordinator.empty()) watch = std::thread(stop_on_signal);
  auto coordinator = Register(f, security, port, services, chain);
  registered = true;
  if (coordinator.ok())
    services->core()->gate.SetJoined(true);  // at once: the view shows it already
  if (watch.joinable()) watch.join();
  return coordinator;
}

int Fail(const absl::Status& status) {
  pscluster::LogError("%s", std::string(status.message()).c_str());
  return 2;
}

}  // namespace
}  // namespace pscluster::ps

int main(int argc, char** argv) {
  pscluster::NoMutexDeadlockDetection();
  using namespace pscluster::ps;
  constexpr char kUsage[] =
      "One parameter-server shard: ps_server --port=P --shard_id=S --num_shards=N";
  pscluster::HandleHelpAndVersion(argc, argv, kUsage);
  absl::SetProgramUsageMessage(kUsage);
  absl::ParseCommandLine(argc, argv);
  pscluster::ShardMallocMode();
  absl::StatusOr<ServerFlags> flags = ServerFlagsFromCommandLine();
  if (!flags.ok()) return Fail(flags.status());
  // "ps_server/1" for shard 1, "ps_server/1.2" for its replica 2.
  pscluster::InitLogging(
      "ps_server", flags->replica == 0 ? absl::StrCat(flags->shard.shard_id)
                                       : absl::StrCat(flags->shard.shard_id, ".", flags->replica));
  absl::StatusOr<pscluster::Security> security = pscluster::SecurityFromFlags();
  if (!security.ok()) return Fail(security.status());
  pscluster::BlockTerminationSignals();  // before any thread starts
  auto tier = OpenDiskTier(&*flags);     // outlives the shard's tables
  if (!tier.ok()) return Fail(tier.status());
  Shard shard(flags->shard);
  auto snapshotter = OpenSnapshots(*flags, &shard);
  if (!snapshotter.ok()) return Fail(snapshotter.status());
  ShardServices services(&shard, snapshotter->get(), flags->service);
  auto metrics =
      pscluster::ServeMetricsFromFlags("ps_server", std::to_string(flags->shard.shard_id));
  if (!metrics.ok()) return Fail(metrics.status());
  if (*metrics) AddShardMetrics(&shard, snapshotter->get(), metrics->get());
  int port = 0;
  if (!flags->coordinator.empty()) services.core()->gate.SetJoined(false);  // until Register
  auto server = Listen(*flags, *security, &services, metrics->get(), &port);
  if (!server.ok()) return Fail(server.status());
  services.core()->gate.SetHealth((*server)->GetHealthCheckService());
  pscluster::LogInfo("ps_server shard %u/%u listening on %s:%d (%s)", flags->shard.shard_id,
                     flags->shard.num_shards, flags->host.c_str(), port,
                     security->Describe().c_str());
  std::unique_ptr<Replicator> chain;  // outlives the coordinator client's heartbeats
  auto coordinator = RegisterOrStop(*flags, *security, port, &services, &chain);
  if (!coordinator.ok()) return Fail(coordinator.status());
  pscluster::ServeUntilSignal(server->get(), &services.core()->in_flight,
                              [&] { shard.Shutdown(); });  // waiting pulls fail with UNAVAILABLE
  server->reset();   // before the interceptor's RpcMetrics ...
  metrics->reset();  // ... and before the collectors' shard and snapshotter go
  if (chain != nullptr && !chain->stopped().ok()) return 3;  // see ReplicatorOptions::stop
  return 0;
}
