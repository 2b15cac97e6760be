// ps_coordinator: cluster, the versioned cluster view and the rendezvous store.
//
//   ps_coordinator --port=7000 --num_shards=2 --num_workers=2 [--mode=ps]
//
// Prints "ps_coordinator listening on HOST:PORT" once it serves, and a line whenever
// members join, die or come back, and when a mode switch is scheduled or done.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "common/atomic_file.h"
#include "common/cluster_view.h"
#include "common/command_line.h"
#include "common/graceful_shutdown.h"
#include "common/logging.h"
#include "common/metrics_flags.h"
#include "common/mutex_mode.h"
#include "common/parse_errors.h"
#include "common/security_flags.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "server/coordinator/checkpointer.h"
#include "server/coordinator/coordinator_metrics.h"
#include "server/coordinator/mode_switch.h"
#include "server/coordinator/service.h"
#include "server/coordinator/status_page.h"

ABSL_FLAG(std::string, host, "127.0.0.1", "Address to listen on (0.0.0.0 for every interface).");
ABSL_FLAG(int, port, 0, "Port to listen on; 0 picks a free one (printed at start).");
ABSL_FLAG(int, num_shards, 1, "Parameter-server shards the cluster has.");
ABSL_FLAG(int, num_workers, 1, "Workers the cluster has (0: none built in; clients train).");
ABSL_FLAG(int, replicas, 1,
          "Copies of each shard (1-3), chain-replicated: start each shard's ps_server "
          "--replica=0..R-1; a dead replica is taken out of its chain and training goes on.");
ABSL_FLAG(int, heartbeat_timeout_ms, 5000, "A member silent this long is declared dead.");
ABSL_FLAG(std::string, data_dir, "",
          "Cluster checkpoints: the manifest is kept here (reloaded on restart). Without it, "
          "the coordinator takes checkpoints only when asked (psctl checkpoint, a worker's "
          "--snapshot_every_epochs) and forgets them on restart.");
ABSL_FLAG(int64_t, checkpoint_every_steps, 0,
          "Checkpoint every shard every this many global steps (0: only when the metric improves; "
          "needs --data_dir). In the collective modes the workers hand their state to the shards "
          "at these steps first.");
ABSL_FLAG(std::string, metric, "max",
          "Better validation metric: 'max' (accuracy) or 'min' (loss).");
ABSL_FLAG(int, keep_checkpoints, 3, "Newest checkpoints kept, besides the best.");
ABSL_FLAG(int, http_port, 0,
          "Serve the status page (members, shard map, mode, checkpoints, curves) at "
          "http://--http_host:PORT/ (0: off; -1: a free port, printed at start).");
ABSL_FLAG(std::string, http_host, "127.0.0.1",
          "Address the status page listens on (0.0.0.0 for every interface).");
ABSL_FLAG(
    std::string, mode, "",
    "Training mode at start: ps, allreduce, fsdp, pipeline or tensor. Default ps, or allreduce "
    "when --num_shards=0 ('ps' needs shards). psctl switch-mode changes it live.");
ABSL_FLAG(bool, exit_when_finished, false,
          "Exit (0, as on SIGTERM) once every worker has finished its run: for compose, systemd "
          "and scripts that run one training job per coordinator.");

using pscluster::LogError;
using pscluster::LogInfo;
using pscluster::LogWarning;

namespace {

int Fail(const std::string& message) {
  LogError("%s", message.c_str());
  return 2;
}

// One line per mode switch scheduled or done since `before`.
void PrintSwitches(const pscluster::coord::ClusterView& before,
                   const pscluster::coord::ClusterView& after) {
  int64_t last_known = 0;  // ids grow: anything above was scheduled since
  for (const auto& s : before.pending_switches()) last_known = std::max(last_known, s.switch_id());
  for (const auto& s : before.switches()) last_known = std::max(last_known, s.switch_id());
  for (const auto& s : after.pending_switches()) {
    if (s.switch_id() > last_known) {
      LogInfo("switch %lld to %s scheduled at step %lld", static_cast<long long>(s.switch_id()),
              ModeName(s.to_mode()), static_cast<long long>(s.at_step()));
    }
  }
  for (int i = before.switches_size(); i < after.switches_size(); ++i) {
    const auto& s = after.switches(i);
    LogInfo("switch %lld done: %s -> %s at step %lld (hand-over %.3f s)",
            static_cast<long long>(s.switch_id()), ModeName(s.from_mode()), ModeName(s.to_mode()),
            static_cast<long long>(s.at_step()), s.handoff_seconds());
  }
  // Pending before, and neither pending nor done now: dropped once the workers said where
  // their run ends, before it.
  int64_t run_end = 0;
  for (const auto& m : after.members()) {
    if (m.role() == pscluster::coord::WORKER && m.run_end_step() > 0 &&
        (run_end == 0 || m.run_end_step() < run_end)) {
      run_end = m.run_end_step();
    }
  }
  auto listed = [](const auto& switches, int64_t id) {
    return std::any_of(switches.begin(), switches.end(),
                       [id](const auto& s) { return s.switch_id() == id; });
  };
  for (const auto& s : before.pending_switches()) {
    if (listed(after.pending_switches(), s.switch_id()) ||
        listed(after.switches(), s.switch_id())) {
      continue;
    }
    LogInfo(
        "ps_coordinator: switch %lld to %s at step %lld dropped: the run ends at step "
        "%lld, before it",
        static_cast<long long>(s.switch_id()), ModeName(s.to_mode()),
        static_cast<long long>(s.at_step()), static_cast<long long>(run_end));
  }
}

// One line per member whose liveness differs from `before`, and per switch.
void PrintChanges(const pscluster::coord::ClusterView& before,
                  const pscluster::coord::ClusterView& after) {
  for (const auto& m : after.members()) {
    bool was_alive = false;
    int64_t was_incarnation = 0;
    for (const auto& b : before.members()) {
      if (b.role() == m.role() && b.id() == m.id() && b.replica() == m.replica()) {
        was_alive = b.alive();
        was_incarnation = b.incarnation();
      }
    }
    if (m.alive() != was_alive || m.incarnation() != was_incarnation) {
      LogInfo("%s %d%s %s (incarnation %lld, %s)",
              m.role() == pscluster::coord::SHARD ? "shard" : "worker", m.id(),
              after.replicas() > 1 && m.role() == pscluster::coord::SHARD
                  ? absl::StrCat(" replica ", m.replica()).c_str()
                  : "",
              m.alive()      ? "alive"
              : m.finished() ? "finished its run and left"
                             : "DEAD",
              static_cast<long long>(m.incarnation()), m.address().c_str());
    }
  }
  for (const auto& chain : after.chains()) {
    if (after.replicas() == 1 || chain.shard() >= before.chains_size() ||
        before.chains(chain.shard()).epoch() == chain.epoch()) {
      continue;
    }
    LogInfo("shard %d chain epoch %lld (generation %lld): %s", chain.shard(),
            static_cast<long long>(chain.epoch()), static_cast<long long>(chain.generation()),
            absl::StrJoin(chain.addresses(), " -> ").c_str());
  }
  PrintSwitches(before, after);
}

std::string StatePath(const std::string& dir) { return dir + "/state.pb"; }

// ClusterState options from the flags, or a message saying which flag is wrong.
absl::StatusOr<pscluster::coord::ClusterStateOptions> MembershipFromFlags() {
  pscluster::coord::ClusterStateOptions options;
  options.num_shards = absl::GetFlag(FLAGS_num_shards);
  options.num_workers = absl::GetFlag(FLAGS_num_workers);
  options.replicas = absl::GetFlag(FLAGS_replicas);
  if (options.replicas < 1 || options.replicas > 3) {
    return absl::InvalidArgumentError(
        absl::StrCat("--replicas must be 1, 2 or 3, got ", options.replicas));
  }
  options.heartbeat_timeout = absl::Milliseconds(absl::GetFlag(FLAGS_heartbeat_timeout_ms));
  // 0 shards: collective modes only. 0 workers: no built-in workers (clients such as the
  // Python one train through the shards); the cluster is complete once the shards are.
  if (options.num_shards < 0 || options.num_workers < 0 ||
      options.num_shards + options.num_workers == 0) {
    return absl::InvalidArgumentError(
        "--num_shards and --num_workers must be >= 0, and not both 0");
  }
  if (options.heartbeat_timeout < absl::Milliseconds(100)) {
    return absl::InvalidArgumentError("--heartbeat_timeout_ms must be >= 100");
  }
  options.mode = options.num_shards > 0 ? pscluster::coord::PS : pscluster::coord::ALLREDUCE;
  if (const std::string mode = absl::GetFlag(FLAGS_mode); !mode.empty()) {
    absl::StatusOr<pscluster::coord::TrainingMode> parsed = pscluster::coord::ParseMode(mode);
    if (!parsed.ok()) return absl::InvalidArgumentError("--mode: " + parsed.status().ToString());
    options.mode = *parsed;
  }
  if (absl::Status s = pscluster::coord::ValidateMode(options.mode, options.num_shards); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--mode: ", s.message()));
  }
  if (const std::string dir = absl::GetFlag(FLAGS_data_dir); !dir.empty()) {
    options.checkpoint_every_steps =
        std::max<int64_t>(0, absl::GetFlag(FLAGS_checkpoint_every_steps));
    options.on_change = [path = StatePath(dir)](const pscluster::coord::CoordinatorState& state) {
      absl::Status s = pscluster::WriteFileAtomically(path, state.SerializeAsString());
      if (!s.ok()) LogWarning("state not saved: %s", s.ToString().c_str());
    };
  }
  return options;
}

// With --data_dir: continues from the state a previous run of this coordinator saved.
absl::Status RestoreState(pscluster::coord::ClusterState* cluster) {
  const std::string dir = absl::GetFlag(FLAGS_data_dir);
  if (dir.empty()) return absl::OkStatus();
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  std::ifstream in(StatePath(dir), std::ios::binary);
  if (!in) return absl::OkStatus();  // a first start
  pscluster::coord::CoordinatorState state;
  if (!state.ParseFromIstream(&in)) {
    return absl::DataLossError(StatePath(dir) + " is unreadable; move it away to start afresh");
  }
  if (absl::Status s = cluster->Restore(state); !s.ok()) {
    return absl::DataLossError(absl::StrCat(StatePath(dir), ": ", s.message()));
  }
  const pscluster::coord::ClusterView v = cluster->View();
  LogInfo("restored view %lld: %d member(s), %d switch(es) done, %d pending",
          static_cast<long long>(v.version()), v.members_size(), v.switches_size(),
          v.pending_switches_size());
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<pscluster::coord::Checkpointer>> CheckpointerFromFlags(
    pscluster::coord::ClusterState* cluster, const pscluster::Security& security) {
  pscluster::coord::CheckpointerOptions co;
  co.security = security;
  co.data_dir = absl::GetFlag(FLAGS_data_dir);
  co.every_steps = absl::GetFlag(FLAGS_checkpoint_every_steps);
  co.higher_metric_is_better = absl::GetFlag(FLAGS_metric) != "min";
  co.keep_last = std::max(1, absl::GetFlag(FLAGS_keep_checkpoints));
  co.client_active = absl::Milliseconds(absl::GetFlag(FLAGS_heartbeat_timeout_ms));
  auto checkpointer = pscluster::coord::Checkpointer::Create(cluster, co);
  if (!checkpointer.ok()) return checkpointer.status();
  if (const auto listed = (*checkpointer)->checkpoints(); !listed.empty()) {
    LogInfo("manifest lists %zu checkpoint(s), the last of step %lld", listed.size(),
            static_cast<long long>(listed.back().step()));
  }
  return checkpointer;
}

// The status page's last state kept in --data_dir (the page goes with the coordinator).
void KeepFinalPage(const pscluster::coord::ClusterView& view,
                   const pscluster::coord::ProgressHistory& history) {
  if (const std::string dir = absl::GetFlag(FLAGS_data_dir); !dir.empty()) {
    const std::string path = dir + "/status.html";
    absl::Status s = pscluster::coord::WriteStatusPage(path, view, history.Curves(), absl::Now());
    if (s.ok()) {
      LogInfo("the run's final status page: %s", path.c_str());
    } else {
      LogWarning("could not write the final status page: %s", s.ToString().c_str());
    }
  }
}

// Every worker finished its run: the final page, and with --exit_when_finished, the exit.
void RunFinished(const pscluster::coord::ClusterView& view,
                 const pscluster::coord::ProgressHistory& history) {
  KeepFinalPage(view, history);
  if (absl::GetFlag(FLAGS_exit_when_finished)) {
    LogInfo("the run finished at step %lld; exiting (--exit_when_finished)",
            static_cast<long long>(view.global_step()));
    kill(getpid(), SIGTERM);  // the same drain and shutdown as an operator's SIGTERM
  }
}

// Until `stop`: the coordinator's own checkpoints (with --data_dir) on one thread, since one
// may take a while to write, and liveness on another, reporting every change of the view.
void RunBackground(pscluster::coord::ClusterState* cluster, pscluster::coord::KvStore* kv,
                   pscluster::coord::Checkpointer* checkpointer,
                   const pscluster::coord::ProgressHistory* history, absl::Duration liveness_every,
                   absl::Notification* stop) {
  const bool automatic = checkpointer->automatic();
  std::thread checkpoints([&] {
    while (automatic && !stop->WaitForNotificationWithTimeout(absl::Milliseconds(250))) {
      absl::Status s = checkpointer->MaybeCheckpoint();
      if (!s.ok()) LogWarning("checkpoint: %s", s.ToString().c_str());
    }
  });
  pscluster::coord::ClusterView last = cluster->View();
  std::string last_generation = pscluster::coord::Generation(last);
  while (!stop->WaitForNotificationWithTimeout(liveness_every)) {
    cluster->CheckLiveness();
    pscluster::coord::ClusterView now = cluster->View();
    if (now.version() != last.version()) {
      PrintChanges(last, now);
      // A new generation's workers rendezvous afresh: the old keys would only fill the store.
      std::string generation = pscluster::coord::Generation(now);
      if (generation != last_generation) {
        kv->DropPrefixedExcept(pscluster::coord::kRendezvousRoot,
                               pscluster::coord::RendezvousPrefix(generation));
        last_generation = std::move(generation);
      }
    }
    if (now.finished() && !last.finished()) RunFinished(now, *history);
    last = now;
  }
  // Stopped right after the run finished, before the loop saw it: the final page all the same.
  if (const auto view = cluster->View(); view.finished() && !last.finished()) {
    KeepFinalPage(view, *history);
  }
  checkpoints.join();
}

// With --http_port: the status page, serving (null without).
absl::StatusOr<std::unique_ptr<pscluster::coord::StatusPageServer>> StartStatusPage(
    const pscluster::coord::ClusterState* cluster,
    const pscluster::coord::ProgressHistory* history) {
  const int port = absl::GetFlag(FLAGS_http_port);
  if (port == 0) return nullptr;
  if (absl::Status s = pscluster::CheckListenPortFlag("http_port", port); !s.ok()) return s;
  const std::string host = absl::GetFlag(FLAGS_http_host);
  auto page = pscluster::coord::StatusPageServer::Start(host, std::max(port, 0), cluster, history);
  if (page.ok()) {
    LogInfo("status page on http://%s:%d/", host.c_str(), (*page)->port());
  }
  return page;
}

// The coordinator's gRPC server, with health checks and reflection (as ps_server's).
absl::StatusOr<std::unique_ptr<grpc::Server>> Listen(
    pscluster::coord::CoordinatorService* service,
    const std::shared_ptr<grpc::ServerCredentials>& credentials,
    const pscluster::Security& security, pscluster::Metrics* metrics, int* port) {
  grpc::EnableDefaultHealthCheckService(true);  // grpc.health.v1.Health, as ps_server
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();  // for generic tools, as ps_server
  grpc::ServerBuilder builder;
  pscluster::NameUnparsableRequests(&builder, metrics ? metrics->rpcs().Interceptor() : nullptr);
  const std::string address =
      absl::StrCat(absl::GetFlag(FLAGS_host), ":", absl::GetFlag(FLAGS_port));
  builder.AddListeningPort(address, credentials, port);
  builder.SetMaxReceiveMessageSize(4 << 20);
  builder.RegisterService(service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || *port == 0) return pscluster::CannotListen(address, security);
  return server;
}

}  // namespace

int main(int argc, char** argv) {
  pscluster::NoMutexDeadlockDetection();
  constexpr char kUsage[] = "ps_coordinator --port=P --num_shards=N --num_workers=M";
  pscluster::HandleHelpAndVersion(argc, argv, kUsage);
  absl::SetProgramUsageMessage(kUsage);
  absl::ParseCommandLine(argc, argv);
  pscluster::InitLogging("ps_coordinator", "");
  absl::StatusOr<pscluster::coord::ClusterStateOptions> options = MembershipFromFlags();
  if (!options.ok()) return Fail(std::string(options.status().message()));
  pscluster::BlockTerminationSignals();  // before any thread starts

  pscluster::coord::ClusterState cluster(*options);
  if (absl::Status s = RestoreState(&cluster); !s.ok()) return Fail(s.ToString());
  pscluster::coord::KvStore kv;
  absl::StatusOr<pscluster::Security> security = pscluster::SecurityFromFlags();
  if (!security.ok()) return Fail(security.status().ToString());
  auto credentials = security->ServerCredentials(pscluster::AdminMethods(
      "pscluster.coord.Coordinator", {"SwitchMode", "Checkpoint", "RestoreCheckpoint"}));
  if (!credentials.ok()) return Fail(credentials.status().ToString());
  auto checkpointer = CheckpointerFromFlags(&cluster, *security);
  if (!checkpointer.ok()) return Fail(checkpointer.status().ToString());
  pscluster::coord::ProgressHistory history;
  pscluster::coord::ReplicaProber prober(&cluster, pscluster::coord::ConnectProbe(*security));
  pscluster::coord::CoordinatorService service(&cluster, &kv, absl::Minutes(10),
                                               checkpointer->get(), &history, &prober);
  auto metrics = pscluster::ServeMetricsFromFlags("ps_coordinator", "");
  if (!metrics.ok()) return Fail(metrics.status().ToString());
  if (*metrics) pscluster::coord::AddCoordinatorMetrics(&cluster, metrics->get());
  auto page = StartStatusPage(&cluster, &history);
  if (!page.ok()) return Fail(page.status().ToString());
  int port = 0;
  auto server = Listen(&service, *credentials, *security, metrics->get(), &port);
  if (!server.ok()) return Fail(std::string(server.status().message()));
  LogInfo(
      "ps_coordinator listening on %s:%d (expecting %d shard(s) x %d replica(s), %d worker(s); "
      "mode %s; %s)",
      absl::GetFlag(FLAGS_host).c_str(), port, options->num_shards, options->replicas,
      options->num_workers, pscluster::coord::ModeName(options->mode),
      security->Describe().c_str());

  absl::Notification stop;
  std::thread background([&] {
    RunBackground(&cluster, &kv, checkpointer->get(), &history, options->heartbeat_timeout / 4,
                  &stop);
  });
  // Waiting GetView and KvGet calls fail with UNAVAILABLE, so the drain does not wait for
  // their deadlines.
  pscluster::ServeUntilSignal(server->get(), service.in_flight(), [&] {
    cluster.Shutdown();
    kv.Shutdown();
  });
  stop.Notify();
  background.join();
  server->reset();  // before the interceptor's RpcMetrics; then the HTTP servers stop before
  page->reset();    // the state they read goes
  metrics->reset();
  return 0;
}
