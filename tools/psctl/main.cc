// psctl: the operator's command line for a running pscluster.
//
//   psctl --coordinator=HOST:PORT status        members, liveness, steps, loss, samples/s,
//                                               last complete checkpoint
//   psctl --coordinator=HOST:PORT checkpoint    snapshot every shard now (at the step the
//                                               tables have reached); waits until durable
//   psctl --coordinator=HOST:PORT checkpoints   complete checkpoints (on every shard)
//
// Exit codes: 0 ok; 1 the command ran but the cluster is not healthy (status: a member is
// dead or missing; checkpoint: a shard refused or failed); 2 usage; 3 cannot reach the
// coordinator or a shard.
#include <algorithm>
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "grpcpp/grpcpp.h"
#include "proto/coordinator.grpc.pb.h"
#include "worker/client/ps_client.h"

ABSL_FLAG(std::string, coordinator, "", "ps_coordinator address (host:port).");
ABSL_FLAG(int, timeout_seconds, 10, "Deadline of each RPC (checkpoint: of the whole write).");

namespace {

using namespace pscluster;

constexpr int kOk = 0, kUnhealthy = 1, kUsage = 2, kUnreachable = 3;

int Error(int code, const std::string& message) {
  std::fprintf(stderr, "psctl: %s\n", message.c_str());
  return code;
}

absl::StatusOr<coord::ClusterView> FetchView(const std::string& address) {
  auto stub =
      coord::Coordinator::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(
      absl::ToChronoTime(absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_timeout_seconds))));
  coord::ClusterView view;
  grpc::Status s = stub->GetView(&ctx, coord::GetViewRequest(), &view);
  if (!s.ok())
    return absl::UnavailableError(absl::StrCat("coordinator ", address, ": ", s.error_message()));
  return view;
}

absl::StatusOr<std::unique_ptr<PsClient>> Shards(const coord::ClusterView& view) {
  PsClientOptions o;
  for (const std::string& a : view.shard_addresses()) {
    if (a.empty()) return absl::UnavailableError("a shard has not registered yet");
    o.shard_addresses.push_back(a);
  }
  o.worker_id = -1;  // an operator, not a worker
  o.rpc_timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout_seconds));
  return PsClient::Create(o);
}

int Status(const coord::ClusterView& view) {
  std::printf("cluster view %lld: mode %s, global step %lld, %s\n",
              static_cast<long long>(view.version()), view.mode().c_str(),
              static_cast<long long>(view.global_step()),
              view.complete() ? "complete" : "INCOMPLETE");
  std::printf("%-8s %4s %-6s %-22s %5s %9s %9s %10s\n", "ROLE", "ID", "ALIVE", "ADDRESS", "INC",
              "STEP", "LOSS", "SAMPLES/S");
  for (const auto& m : view.members()) {
    const bool worker = m.role() == coord::WORKER;
    std::printf("%-8s %4d %-6s %-22s %5lld %9s %9s %10s\n", worker ? "worker" : "shard", m.id(),
                m.alive() ? "yes" : "DEAD", m.address().c_str(),
                static_cast<long long>(m.incarnation()),
                worker ? absl::StrCat(m.step()).c_str() : "-",
                worker ? absl::StrFormat("%.4f", m.loss()).c_str() : "-",
                worker ? absl::StrFormat("%.0f", m.samples_per_sec()).c_str() : "-");
  }
  auto shards = Shards(view);
  std::string last = "none";
  if (shards.ok()) {
    auto checkpoints = (*shards)->CompleteSnapshots();
    if (checkpoints.ok() && !checkpoints->empty())
      last = absl::StrCat("step ", checkpoints->back().step());
    if (!checkpoints.ok()) last = "unknown (" + checkpoints.status().ToString() + ")";
  }
  std::printf("last checkpoint: %s\n", last.c_str());
  return view.complete() ? kOk : kUnhealthy;
}

int Checkpoints(const coord::ClusterView& view) {
  auto shards = Shards(view);
  if (!shards.ok()) return Error(kUnreachable, shards.status().ToString());
  auto checkpoints = (*shards)->CompleteSnapshots();
  if (!checkpoints.ok()) return Error(kUnreachable, checkpoints.status().ToString());
  std::printf("%10s %12s %10s\n", "STEP", "BYTES", "METRIC");
  for (const auto& c : *checkpoints) {
    std::printf("%10lld %12llu %10s\n", static_cast<long long>(c.step()),
                static_cast<unsigned long long>(c.bytes()),
                c.has_metric() ? absl::StrFormat("%.4f", c.metric()).c_str() : "-");
  }
  return kOk;
}

int Checkpoint(const coord::ClusterView& view) {
  auto shards = Shards(view);
  if (!shards.ok()) return Error(kUnreachable, shards.status().ToString());
  auto furthest = (*shards)->FurthestAppliedStep();  // BSP tables are held there
  if (!furthest.ok()) return Error(kUnreachable, furthest.status().ToString());
  const int64_t step = *furthest;
  absl::Status s = (*shards)->Snapshot(step);
  if (!s.ok())
    return Error(kUnhealthy, "snapshot of step " + absl::StrCat(step) + ": " + s.ToString());
  auto done = (*shards)->SnapshotStatus(/*wait_until_idle=*/true);
  if (!done.ok()) return Error(kUnreachable, done.status().ToString());
  for (const auto& d : *done) {
    if (!d.last_error().empty())
      return Error(kUnhealthy, "a shard failed to write: " + d.last_error());
  }
  std::printf("checkpoint of step %lld is complete on %d shard(s)\n", static_cast<long long>(step),
              (*shards)->num_shards());
  return kOk;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("psctl --coordinator=HOST:PORT status|checkpoint|checkpoints");
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() != 2) return Error(kUsage, "give one command: status, checkpoint or checkpoints");
  const std::string command = args[1];
  if (command != "status" && command != "checkpoint" && command != "checkpoints") {
    return Error(kUsage,
                 "unknown command '" + command + "'; use status, checkpoint or checkpoints");
  }
  const std::string address = absl::GetFlag(FLAGS_coordinator);
  if (address.empty()) return Error(kUsage, "--coordinator=HOST:PORT is required");
  auto view = FetchView(address);
  if (!view.ok()) return Error(kUnreachable, view.status().ToString());
  if (command == "status") return Status(*view);
  if (command == "checkpoints") return Checkpoints(*view);
  return Checkpoint(*view);
}
