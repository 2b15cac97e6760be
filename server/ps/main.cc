// ps_server: one parameter-server shard.
//
//   ps_server --port=5000 --shard_id=0 --num_shards=2
//
// Prints "ps_server shard S/N listening on HOST:PORT" once it serves (with --port=0 the
// kernel picks a free port). SIGTERM or SIGINT: fail waiting pulls, let RPCs in progress
// finish (up to 5 s), close every connection, exit 0.
#include <malloc.h>

#include <cstdio>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "client/coordinator/coordinator_client.h"
#include "grpcpp/grpcpp.h"
#include "server/ps/service.h"

ABSL_FLAG(std::string, host, "127.0.0.1", "Address to listen on (0.0.0.0 for every interface).");
ABSL_FLAG(int, port, 0, "Port to listen on; 0 picks a free one (printed at start).");
ABSL_FLAG(uint32_t, shard_id, 0, "This shard's index, in [0, num_shards).");
ABSL_FLAG(uint32_t, num_shards, 1, "Number of shards in the cluster.");
ABSL_FLAG(int, threads, 64,
          "Most RPC handler threads. Pulls waiting on BSP/SSP hold one each, so keep it above "
          "the number of workers times the tables they pull at once.");
ABSL_FLAG(std::string, data_dir, "",
          "Checkpoint root shared by all shards (created if missing); this shard's snapshots "
          "go to DIR/shard-<shard_id>. Without it, snapshot RPCs fail.");
ABSL_FLAG(std::string, restore, "",
          "Before serving, load a snapshot from --data_dir: 'latest' (start empty if none) or a "
          "step. Works across shard counts: each shard takes the rows that now map to it.");
ABSL_FLAG(int, snapshot_keep_last, 3, "Newest complete snapshots kept (plus the best by metric).");
ABSL_FLAG(std::string, snapshot_metric, "min", "Best snapshot: 'min' or 'max' metric.");
ABSL_FLAG(std::string, coordinator, "",
          "ps_coordinator address: register this shard there and heartbeat (optional).");
ABSL_FLAG(std::string, advertise_host, "",
          "Host workers reach this shard at (default: --host), sent to the coordinator.");
ABSL_FLAG(int, snapshot_test_delay_ms, 0, "Tests only: sleep per written block (crash tests).");
ABSL_FLAG(uint64_t, max_chunk_bytes, uint64_t{4} << 20, "Largest dense chunk / sparse payload.");
ABSL_FLAG(uint64_t, max_table_bytes, uint64_t{16} << 30,
          "Largest table slice (values + optimizer state) this shard accepts.");

namespace {

int Fail(const std::string& message) {
  std::fprintf(stderr, "ps_server: %s\n", message.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "One parameter-server shard: ps_server --port=P --shard_id=S --num_shards=N");
  absl::ParseCommandLine(argc, argv);
  // Every push and pull allocates and frees message and staging buffers of the same sizes:
  // keep them in the heap instead of fresh mmaps whose pages fault in again each time.
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
  pscluster::ps::ShardOptions shard_options;
  shard_options.shard_id = absl::GetFlag(FLAGS_shard_id);
  shard_options.num_shards = absl::GetFlag(FLAGS_num_shards);
  shard_options.max_table_bytes = absl::GetFlag(FLAGS_max_table_bytes);
  if (shard_options.num_shards == 0 || shard_options.shard_id >= shard_options.num_shards) {
    return Fail(absl::StrCat("--shard_id=", shard_options.shard_id,
                             " must be in [0, --num_shards=", shard_options.num_shards, ")"));
  }
  pscluster::ps::ServiceOptions service_options;
  service_options.max_chunk_bytes = absl::GetFlag(FLAGS_max_chunk_bytes);
  if (service_options.max_chunk_bytes < 1024 || service_options.max_chunk_bytes > (1u << 30)) {
    return Fail("--max_chunk_bytes must be in [1024, 1 GiB]");
  }
  const std::string data_dir = absl::GetFlag(FLAGS_data_dir);
  const std::string restore = absl::GetFlag(FLAGS_restore);
  const std::string metric = absl::GetFlag(FLAGS_snapshot_metric);
  if (data_dir.empty() && !restore.empty()) return Fail("--restore needs --data_dir");
  if (metric != "min" && metric != "max") return Fail("--snapshot_metric must be 'min' or 'max'");
  if (absl::GetFlag(FLAGS_snapshot_keep_last) < 1) return Fail("--snapshot_keep_last must be >= 1");

  pscluster::BlockTerminationSignals();  // before any thread starts

  pscluster::ps::Shard shard(shard_options);
  std::unique_ptr<pscluster::ps::Snapshotter> snapshotter;
  if (!data_dir.empty()) {
    pscluster::ps::SnapshotterOptions so;
    so.root = data_dir;
    so.keep_last = absl::GetFlag(FLAGS_snapshot_keep_last);
    so.lower_metric_is_better = metric == "min";
    so.test_delay_per_block = absl::Milliseconds(absl::GetFlag(FLAGS_snapshot_test_delay_ms));
    auto created = pscluster::ps::Snapshotter::Create(&shard, so);
    if (!created.ok())
      return Fail(absl::StrCat("--data_dir=", data_dir, ": ", created.status().ToString()));
    snapshotter = *std::move(created);
  }
  if (!restore.empty()) {
    auto step = snapshotter->Restore(restore);
    if (!step.ok())
      return Fail(absl::StrCat("--restore=", restore, ": ", step.status().ToString()));
    if (*step < 0) {
      std::printf("ps_server: no complete snapshot under %s; starting empty\n", data_dir.c_str());
    } else {
      std::printf("ps_server: restored snapshot of step %lld from %s\n",
                  static_cast<long long>(*step), data_dir.c_str());
    }
  }
  pscluster::ps::ParameterServerService service(&shard, snapshotter.get(), service_options);
  grpc::ResourceQuota quota("ps_server");
  quota.SetMaxThreads(absl::GetFlag(FLAGS_threads));
  grpc::ServerBuilder builder;
  int port = 0;
  const std::string address =
      absl::StrCat(absl::GetFlag(FLAGS_host), ":", absl::GetFlag(FLAGS_port));
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &port);
  builder.SetResourceQuota(quota);
  builder.SetMaxReceiveMessageSize(pscluster::ps::MaxMessageBytes(service_options));
  builder.SetMaxSendMessageSize(pscluster::ps::MaxMessageBytes(service_options));
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    return Fail(absl::StrCat("cannot listen on ", address, " (port in use? try --port=0)"));
  }
  std::printf("ps_server shard %u/%u listening on %s:%d\n", shard_options.shard_id,
              shard_options.num_shards, absl::GetFlag(FLAGS_host).c_str(), port);
  std::fflush(stdout);
  std::unique_ptr<pscluster::CoordinatorClient> coordinator;
  if (const std::string c = absl::GetFlag(FLAGS_coordinator); !c.empty()) {
    pscluster::CoordinatorClientOptions co;
    co.coordinator = c;
    co.role = pscluster::coord::SHARD;
    co.id = static_cast<int32_t>(shard_options.shard_id);
    const std::string host = absl::GetFlag(FLAGS_advertise_host).empty()
                                 ? absl::GetFlag(FLAGS_host)
                                 : absl::GetFlag(FLAGS_advertise_host);
    co.address = absl::StrCat(host, ":", port);
    auto registered = pscluster::CoordinatorClient::Register(co);
    if (!registered.ok()) return Fail(registered.status().ToString());
    coordinator = *std::move(registered);
    std::printf("ps_server: registered with the coordinator at %s as %s\n", c.c_str(),
                co.address.c_str());
    std::fflush(stdout);
  }

  pscluster::ServeUntilSignal(server.get(), service.in_flight(), "ps_server",
                              [&] { shard.Shutdown(); });  // waiting pulls fail with UNAVAILABLE
  return 0;
}
