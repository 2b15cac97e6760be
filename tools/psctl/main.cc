// psctl: the operator's command line for a running pscluster, and (plan) the arithmetic of
// a training job before there is one.
//
//   psctl --coordinator=HOST:PORT status        mode, members (role, id, alive, heartbeat
//                                               age, address, incarnation; workers: step,
//                                               loss, samples/s, last metric), last complete
//                                               checkpoint, mode switches (done and pending)
//   psctl --coordinator=HOST:PORT status --json the same as one JSON object (below)
//   psctl --coordinator=HOST:PORT top [--interval_seconds=S] [--iterations=N]
//                                               status's view, redrawn every S seconds
//                                               (default 1) until q or Ctrl-C (any other key
//                                               redraws at once), or N redraws (default 0:
//                                               no limit); clears the screen when stdout is a
//                                               terminal. An unreachable coordinator is shown
//                                               and retried, never an exit. Exits 0.
//   psctl --coordinator=HOST:PORT checkpoint    asks the coordinator for a checkpoint now
//                                               (its step, every shard); waits until durable
//   psctl --coordinator=HOST:PORT checkpoints   the coordinator's complete checkpoints
//   psctl --coordinator=HOST:PORT restore --step=N [--force]
//                                               every shard back to checkpoint N, made the
//                                               newest (later ones deleted); refused while
//                                               workers are alive unless --force
//   psctl --coordinator=HOST:PORT switch-mode --mode=ps|allreduce|fsdp|pipeline|tensor
//                                               [--at_step=N]
//                                               switch every worker live at step N
//                                               (default: the next step boundary)
//   psctl --address=HOST:PORT health            asks a shard or the coordinator (default:
//                                               --coordinator) the gRPC health protocol:
//                                               SERVING (exit 0) or NOT_SERVING (exit 1)
//   psctl plan [--json] MODEL DATA CLUSTER      no cluster needed: how to train a model on
//                                               GPUs, by arithmetic (tools/psctl/plan.h) --
//                                               memory per GPU of each layout (DDP, ZeRO-1/2/3,
//                                               tensor x pipeline x data), the recommended one
//                                               and its traffic per step, the data split into
//                                               steps, compute time, checkpoint interval
//
// plan's flags (defaults in brackets; GB/s = 1e9 bytes/s one way):
//   MODEL    --params=13e9, or --layers --width --heads [--vocab=50257 --context=2048]
//            (count 12·L·h² + 13·L·h + V·h + s·h + 2h; with both, --params counts and the
//            shape gives activations; --params alone derives h = 128·L, heads of 128)
//   DATA     --dataset_bytes=200e9 [--bytes_per_token=4] or --dataset_tokens; [--epochs=1
//            --global_batch_tokens=4194304 --micro_batch=1]
//   CLUSTER  [--nodes=1 --gpus_per_node=8 --gpu=a100-80gb] (a100-40gb, a100-80gb,
//            h100-80gb, h200-141gb; any other name, e.g. cpu to check a local run against
//            measured figures, with --gpu_memory_bytes --gpu_flops --host_copy_gbps
//            --memory_gbps and --intra_node_gbps) [--inter_node_gbit=100 (per node)
//            --checkpoint_write_gbps=2 (per node) --mtbf_hours=1000 (per node) --mfu_low=0.35
//            --mfu_high=0.5 --memory_headroom=0.1 --sequence_parallel]; a preset's
//            --gpu_memory_bytes, --gpu_flops, --intra_node_gbps (A100 300, H100/H200 450),
//            --host_copy_gbps (25, 50) or --memory_gbps (1555 .. 4800) can be overridden.
//
// A cluster with TLS and tokens: add --tls_ca=CA.pem (and --tls_cert/--tls_key for mutual
// TLS, --tls_server_name when the certificates name another host) and --token_file=F, or
// --admin_token_file=F for checkpoint and switch-mode where the cluster has an admin token.
//
// status --json prints one line: the ClusterView (proto/coordinator.proto) in protobuf's JSON
// mapping with the proto's field names, every field (defaults too), enums by name ("mode":
// "PS", "role": "WORKER") and int64 fields as strings, plus "mode_name" (the mode as psctl
// names it, "ps") and in each member "heartbeat_age_seconds" (since last_heartbeat_ms, by
// psctl's clock); keys sorted. It parses back into a ClusterView ignoring unknown fields.
//
// top reads keys without echo when stdin is a terminal (restored on exit); otherwise it does
// not read stdin (so </dev/null works) and stops on --iterations, Ctrl-C (SIGINT), SIGTERM
// or a closed stdout. A key or Ctrl-C during an RPC takes effect when it returns (at most
// --timeout_seconds).
//
// Exit codes: 0 ok; 1 the command ran but the cluster is not healthy or refused (status: a member
// is dead or missing; checkpoint: a shard refused or failed; switch-mode: the step already passed,
// another switch is scheduled there, or 'ps' without shards); 2 usage (an unknown flag, a flag
// without its value or with one it cannot hold, a missing or unknown command, a --coordinator or
// --address that is not HOST:PORT; switch-mode: no or an unknown mode, a negative step; top: an
// interval that is not a positive number of seconds, negative iterations; plan: input that
// describes no job, the message naming the flag); 3 cannot reach the coordinator or a shard.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "client/coordinator/coordinator_operator.h"
#include "common/address.h"
#include "common/command_line.h"
#include "common/grpc_status.h"
#include "common/security_flags.h"
#include "common/status_macros.h"
#include "common/training_mode.h"
#include "grpcpp/grpcpp.h"
#include "proto/coordinator.grpc.pb.h"
#include "proto/health.grpc.pb.h"
#include "tools/psctl/commands.h"
#include "tools/psctl/export_command.h"
#include "tools/psctl/plan.h"
#include "tools/psctl/plan_flags.h"
#include "tools/psctl/plan_format.h"
#include "tools/psctl/top_input.h"
#include "tools/psctl/view_format.h"

ABSL_FLAG(std::string, coordinator, "", "ps_coordinator address (host:port).");
ABSL_FLAG(std::string, address, "",
          "health: the server to ask, a ps_server or the ps_coordinator (default: --coordinator).");
ABSL_FLAG(int, timeout_seconds, 10,
          "Deadline of each RPC (checkpoint: of the whole write; restore: at least 600).");
ABSL_FLAG(std::string, mode, "",
          "switch-mode: the mode to switch to (ps, allreduce, fsdp, pipeline, tensor).");
ABSL_FLAG(int64_t, at_step, 0,
          "switch-mode: the step every worker switches before (0: the next step boundary).");
ABSL_FLAG(std::optional<int64_t>, step, std::nullopt,
          "restore: the checkpoint step (psctl checkpoints lists them); export: the "
          "snapshot's (default: the latest).");
ABSL_FLAG(bool, force, false,
          "restore: even while workers are alive (they train on over the rolled-back tables).");
ABSL_FLAG(bool, json, false, "status: print the view as one JSON object; plan: the plan.");
ABSL_FLAG(double, interval_seconds, 1, "top: seconds between redraws (> 0).");
ABSL_FLAG(int64_t, iterations, 0, "top: exit after this many redraws (0: run until q).");

namespace {

using namespace pscluster;

constexpr int kOk = 0, kUnhealthy = 1, kUsage = 2, kUnreachable = 3;

constexpr char kUsageLine[] =
    "psctl --coordinator=HOST:PORT status|top|checkpoint|checkpoints|restore|switch-mode "
    "[--json] [--interval_seconds=S --iterations=N] "
    "[--mode=ps|allreduce|fsdp|pipeline|tensor --at_step=N] "
    "[--step=N [--force]] [--timeout_seconds=S] | psctl --address=HOST:PORT health | "
    "psctl plan [--json] "
    "--params=N|--layers=L --width=H --heads=A --dataset_bytes=B|--dataset_tokens=T "
    "[--nodes=N --gpus_per_node=G --gpu=a100-80gb ...] | psctl help [COMMAND]";

int Error(int code, const std::string& message) {
  std::fprintf(stderr, "psctl: %s\n", message.c_str());
  if (code == kUsage)
    std::fprintf(stderr, "usage: %s (psctl --help lists the flags)\n", kUsageLine);
  return code;
}

// A first call to an address that failed with `status` (exit `code`, the message after
// `prefix`); when it did not get through, also what to check. (Only for a first call: a
// later one's UNAVAILABLE, as a checkpoint's, may be a worker's.)
int FirstCallError(int code, const std::string& prefix, const absl::Status& status) {
  Error(code, prefix + status.ToString());
  if (absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status)) {
    std::fprintf(stderr,
                 "psctl: is it running at that address, and reachable from here? With TLS, "
                 "give --tls_ca (and --tls_server_name if its certificate names another "
                 "host); a slow answer: raise --timeout_seconds\n");
  }
  return code;
}

CoordinatorOperator Connect(const std::string& address, const Security& security) {
  return CoordinatorOperator(address, absl::Seconds(absl::GetFlag(FLAGS_timeout_seconds)),
                             security);
}

int Status(const coord::ClusterView& view, bool json) {
  const absl::Time now = absl::Now();
  if (json) {
    absl::StatusOr<std::string> text = psctl::ViewJson(view, now);
    if (!text.ok()) return Error(kUnhealthy, "status --json: " + text.status().ToString());
    std::printf("%s\n", text->c_str());
  } else {
    std::fputs(psctl::FormatView(view, now).c_str(), stdout);
  }
  return view.complete() || view.finished() ? kOk : kUnhealthy;
}

// The coordinator's manifest: the checkpoints complete on every shard, ascending.
int Checkpoints(const coord::ClusterView& view) {
  std::printf("%10s %10s %s\n", "STEP", "METRIC", "TAKEN");
  for (const auto& c : view.checkpoints()) {
    std::printf("%10lld %10s %s\n", static_cast<long long>(c.step()),
                c.has_metric() ? absl::StrFormat("%.4f", c.metric()).c_str() : "-",
                absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", absl::FromUnixMillis(c.unix_ms()),
                                 absl::UTCTimeZone())
                    .c_str());
  }
  return kOk;
}

// INVALID_ARGUMENT: the operator asked for something impossible (usage); unreachable;
// anything else: the coordinator refused.
int ExitCodeOf(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument:
      return kUsage;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
      return kUnreachable;
    default:
      return kUnhealthy;
  }
}

// Asks the coordinator (the only checkpoint initiator) for a checkpoint now.
int Checkpoint(const std::string& address, const Security& security) {
  absl::StatusOr<coord::Checkpoint> done =
      Connect(address, security)
          .Checkpoint(std::nullopt, absl::Seconds(absl::GetFlag(FLAGS_timeout_seconds)));
  if (!done.ok())
    return Error(ExitCodeOf(done.status()), "checkpoint: " + done.status().ToString());
  // The same first words either way (scripts read the step from them).
  std::printf("checkpoint of step %lld is complete on every shard%s\n",
              static_cast<long long>(done->step()),
              done->earlier() ? " (an earlier one, no new checkpoint: the tables have not "
                                "passed its step; what changed since at that step is not in "
                                "it; train past it, then checkpoint)"
                              : "");
  return kOk;
}

constexpr absl::Duration kRestoreTimeout = absl::Minutes(10);

// Every shard back to a checkpoint of the manifest, which becomes the newest.
int Restore(const std::string& address, const Security& security) {
  const std::optional<int64_t> given = absl::GetFlag(FLAGS_step);
  if (!given) return Error(kUsage, "restore needs --step=N (psctl checkpoints lists them)");
  const int64_t step = *given;
  if (step < 0) {
    return Error(kUsage, absl::StrCat("--step=", step,
                                      " is negative; give a checkpoint's step (psctl "
                                      "checkpoints lists them)"));
  }
  // At least kRestoreTimeout: the shards read the whole snapshot back within this deadline
  // (one that runs out says which shards rolled back).
  const absl::Duration timeout =
      std::max(kRestoreTimeout, absl::Seconds(absl::GetFlag(FLAGS_timeout_seconds)));
  CoordinatorOperator op = Connect(address, security);
  absl::StatusOr<coord::Checkpoint> done = op.Restore(step, absl::GetFlag(FLAGS_force), timeout);
  if (!done.ok()) return Error(ExitCodeOf(done.status()), "restore: " + done.status().ToString());
  std::printf(
      "every shard is back at the checkpoint of step %lld, now the newest; workers "
      "started against this coordinator resume there\n",
      static_cast<long long>(done->step()));
  std::fflush(stdout);
  // Replicated shards: each head is alone until its backups have copied the restored state
  // back (its death then would lose the shard). Done once every chain is whole again.
  const absl::Time give_up = absl::Now() + timeout;
  absl::Time said = absl::InfinitePast();
  while (true) {
    absl::StatusOr<coord::ClusterView> view = op.View();
    if (!view.ok()) return Error(ExitCodeOf(view.status()), "restore: " + view.status().ToString());
    std::vector<int> short_chains;
    for (const coord::Chain& c : view->chains()) {
      if (c.replicas_size() < view->replicas()) short_chains.push_back(c.shard());
    }
    if (short_chains.empty()) return kOk;
    const std::string which = absl::StrCat("shard(s) ", absl::StrJoin(short_chains, ", "));
    if (absl::Now() >= give_up) {
      return Error(
          kUnhealthy,
          absl::StrCat("restore: done, but the chains of ", which, " have not all their ",
                       view->replicas(), " replicas again after ", absl::FormatDuration(timeout),
                       ": a head lost now loses its shard (psctl status shows them)"));
    }
    if (absl::Now() - said >= absl::Seconds(2)) {
      std::printf("waiting for the backups of %s to copy the restored state\n", which.c_str());
      std::fflush(stdout);
      said = absl::Now();
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
}

int SwitchMode(const std::string& address, const Security& security) {
  const std::string name = absl::GetFlag(FLAGS_mode);
  if (name.empty())
    return Error(kUsage, "switch-mode needs --mode=ps|allreduce|fsdp|pipeline|tensor");
  absl::StatusOr<coord::TrainingMode> parsed = coord::ParseMode(name);
  if (!parsed.ok()) return Error(kUsage, "switch-mode: --mode: " + parsed.status().ToString());
  if (absl::GetFlag(FLAGS_at_step) < 0) {
    return Error(kUsage, absl::StrCat("switch-mode: --at_step=", absl::GetFlag(FLAGS_at_step),
                                      " is negative; give 0 (the next step boundary) or a "
                                      "later step"));
  }
  const char* mode = ModeName(*parsed);
  absl::StatusOr<ScheduledSwitch> resp =
      Connect(address, security).SwitchMode(*parsed, absl::GetFlag(FLAGS_at_step));
  if (!resp.ok()) {
    return Error(ExitCodeOf(resp.status()), "switch-mode: " + resp.status().ToString());
  }
  if (resp->no_op) {
    const std::string since =
        resp->switch_id == 0 ? "the starting mode"
                             : absl::StrCat("switch ", resp->switch_id, " at step ", resp->at_step);
    std::printf("mode %s is already in effect at that step (%s); nothing scheduled\n", mode,
                since.c_str());
    return kOk;
  }
  std::printf("switch %lld to %s scheduled at step %lld\n", static_cast<long long>(resp->switch_id),
              mode, static_cast<long long>(resp->at_step));
  return kOk;
}

// The gRPC health protocol's answer for the whole server at `address`.
int Health(const std::string& address, const Security& security) {
  auto stub = grpc::health::v1::Health::NewStub(security.Channel(address));
  grpc::ClientContext context;
  context.set_deadline(
      absl::ToChronoTime(absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_timeout_seconds))));
  grpc::health::v1::HealthCheckRequest request;
  grpc::health::v1::HealthCheckResponse response;
  const grpc::Status status = stub->Check(&context, request, &response);
  if (!status.ok()) {
    return FirstCallError(kUnreachable, "", FromGrpcStatus(status, address));
  }
  std::printf("%s: %s\n", address.c_str(),
              grpc::health::v1::HealthCheckResponse::ServingStatus_Name(response.status()).c_str());
  return response.status() == grpc::health::v1::HealthCheckResponse::SERVING ? kOk : kUnhealthy;
}

// What top needs besides the coordinator's address; built from flags in main().
struct TopOptions {
  absl::Duration interval = absl::Seconds(1);  // between redraws; > 0
  int64_t iterations = 0;                      // redraws before exiting; 0: until q or Ctrl-C
};

// One frame of top: a header, then status's view or, while the coordinator cannot be read,
// what top waits for.
std::string TopFrame(const std::string& address, const TopOptions& options,
                     const absl::StatusOr<coord::ClusterView>& view) {
  const absl::Time now = absl::Now();
  std::string frame = absl::StrCat(
      "psctl top: coordinator ", address, ", every ", absl::FormatDuration(options.interval), ", ",
      absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", now, absl::UTCTimeZone()), "; q or Ctrl-C quits\n");
  if (view.ok()) return frame + psctl::FormatView(*view, now);
  return absl::StrCat(frame, "waiting for the coordinator at ", address,
                      " to answer GetView (deadline --timeout_seconds=",
                      absl::GetFlag(FLAGS_timeout_seconds), "): ", view.status().ToString(),
                      "; retrying every ", absl::FormatDuration(options.interval), "\n");
}

// Redraws the view every interval until told to quit; a coordinator that cannot be reached
// (restarting, say) is shown and asked again at the next redraw.
int Top(const std::string& address, const Security& security, const TopOptions& options) {
  psctl::QuitSignals quit;  // first: before the channel starts gRPC's threads
  if (quit.fd() < 0) return Error(kUnhealthy, absl::StrCat("top: signalfd: ", strerror(errno)));
  psctl::KeyboardMode keyboard;
  signal(SIGPIPE, SIG_IGN);  // a closed stdout ends top below, with exit 0
  CoordinatorOperator coordinator = Connect(address, security);
  const char* clear = isatty(STDOUT_FILENO) ? "\033[H\033[2J" : "";
  for (int64_t drawn = 1;; ++drawn) {
    const std::string frame = TopFrame(address, options, coordinator.View());
    if (std::fputs(clear, stdout) < 0 || std::fputs(frame.c_str(), stdout) < 0 ||
        std::fflush(stdout) != 0) {
      return kOk;
    }
    if (options.iterations > 0 && drawn >= options.iterations) return kOk;
    if (psctl::AwaitQuit(keyboard, quit.fd(), options.interval)) return kOk;
  }
}

// top's options from its flags; INVALID_ARGUMENT naming the flag that cannot be used.
absl::StatusOr<TopOptions> TopOptionsFromFlags() {
  const double interval = absl::GetFlag(FLAGS_interval_seconds);
  if (!(interval > 0) || !std::isfinite(interval)) {
    return absl::InvalidArgumentError(
        absl::StrCat("top: --interval_seconds=", interval, " is not a positive number of seconds"));
  }
  TopOptions options;
  options.interval = absl::Seconds(interval);
  options.iterations = absl::GetFlag(FLAGS_iterations);
  if (options.iterations < 0) {
    return absl::InvalidArgumentError(absl::StrCat("top: --iterations=", options.iterations,
                                                   " is negative; give 0 (no limit) or more"));
  }
  return options;
}

// The server `command` talks to: --address (health) or --coordinator. Refused before any
// dialling unless HOST:PORT: gRPC dials port 99999 as 34463, a name without a port at 443 and
// looks "http://host:port" up as a host name, and each then looks like a server that is down.
absl::StatusOr<std::string> TargetFromFlags(const std::string& command) {
  const std::string address = absl::GetFlag(FLAGS_address);
  if (command == "health" && !address.empty()) {
    RETURN_IF_ERROR(CheckHostPort(address, "--address"));
    return address;
  }
  const std::string coordinator = absl::GetFlag(FLAGS_coordinator);
  if (coordinator.empty()) {
    return absl::InvalidArgumentError(command == "health"
                                          ? "health: give --address=HOST:PORT (or --coordinator)"
                                          : "--coordinator=HOST:PORT is required");
  }
  RETURN_IF_ERROR(CheckHostPort(coordinator, "--coordinator"));
  return coordinator;
}

// plan: the flags' PlanInput, printed as a table or --json; no cluster involved.
int PlanCommand(bool json) {
  const absl::StatusOr<plan::Plan> p = plan::MakePlan(plan::PlanInputFromFlags());
  if (!p.ok()) return Error(kUsage, absl::StrCat("plan: ", p.status().message()));
  const std::string text = json ? plan::PlanJson(*p) : plan::PlanTable(*p);
  std::fwrite(text.data(), 1, text.size(), stdout);
  return kOk;
}

}  // namespace

int main(int argc, char** argv) {
  pscluster::HandleHelpAndVersion(argc, argv, kUsageLine);
  absl::SetProgramUsageMessage(kUsageLine);
  if (std::optional<std::string> error = psctl::FlagError(argc, argv)) {
    return Error(kUsage, *error);
  }
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  constexpr char kCommands[] =
      "status, top, checkpoint, checkpoints, restore, switch-mode, health, plan, export or help";
  if (args.size() == 2 && std::string(args[1]) == "help") {
    std::fputs(psctl::CommandsOverview().c_str(), stdout);
    return kOk;
  }
  if (args.size() == 3 && std::string(args[1]) == "help") {
    const std::optional<std::string> help = psctl::CommandHelp(args[2]);
    if (!help) return Error(kUsage, absl::StrCat("help: no command '", args[2], "'; ", kCommands));
    std::fputs(help->c_str(), stdout);
    return kOk;
  }
  if (args.size() != 2) return Error(kUsage, absl::StrCat("give one command: ", kCommands));
  const std::string command = args[1];
  const std::set<std::string> known = {"status",      "top",     "checkpoint",
                                       "checkpoints", "restore", "switch-mode",
                                       "health",      "plan",    "export"};
  if (known.count(command) == 0) {
    return Error(kUsage, absl::StrCat("unknown command '", command, "'; use ", kCommands));
  }
  if (command == "plan") return PlanCommand(absl::GetFlag(FLAGS_json));
  if (command == "export") return psctl::ExportCommand(absl::GetFlag(FLAGS_step));
  if (absl::GetFlag(FLAGS_timeout_seconds) <= 0) {
    return Error(kUsage, absl::StrCat("--timeout_seconds=", absl::GetFlag(FLAGS_timeout_seconds),
                                      " must be positive"));
  }
  const absl::StatusOr<Security> security = SecurityFromFlags();
  if (!security.ok()) return Error(kUsage, std::string(security.status().message()));
  const absl::StatusOr<std::string> target = TargetFromFlags(command);
  if (!target.ok()) return Error(kUsage, std::string(target.status().message()));
  const std::string& address = *target;
  if (command == "health") return Health(address, *security);
  if (command == "switch-mode") return SwitchMode(address, *security);
  if (command == "checkpoint") return Checkpoint(address, *security);
  if (command == "restore") return Restore(address, *security);
  if (command == "top") {
    absl::StatusOr<TopOptions> options = TopOptionsFromFlags();
    if (!options.ok()) return Error(kUsage, std::string(options.status().message()));
    return Top(address, *security, *options);
  }
  auto view = Connect(address, *security).View();
  if (!view.ok()) {  // 3 when unreachable; a refusal (a missing or wrong token) is 1
    return FirstCallError(ExitCodeOf(view.status()), absl::StrCat("coordinator ", address, ": "),
                          view.status());
  }
  if (command == "status") return Status(*view, absl::GetFlag(FLAGS_json));
  return Checkpoints(*view);
}
