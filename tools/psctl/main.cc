// psctl: the operator's command line for a running pscluster.
//
//   psctl --coordinator=HOST:PORT status        mode, members, liveness, steps, loss,
//                                               samples/s, last complete checkpoint, mode
//                                               switches (done and pending)
//   psctl --coordinator=HOST:PORT checkpoint    asks the coordinator for a checkpoint now
//                                               (its step, every shard); waits until durable
//   psctl --coordinator=HOST:PORT checkpoints   the coordinator's complete checkpoints
//   psctl --coordinator=HOST:PORT switch-mode --mode=ps|allreduce|fsdp|pipeline [--at_step=N]
//                                               switch every worker live at step N
//                                               (default: the next step boundary)
//   psctl --address=HOST:PORT health            asks a shard or the coordinator (default:
//                                               --coordinator) the gRPC health protocol:
//                                               SERVING (exit 0) or NOT_SERVING (exit 1)
//
// Exit codes: 0 ok; 1 the command ran but the cluster is not healthy or refused (status: a
// member is dead or missing; checkpoint: a shard refused or failed; switch-mode: the step
// already passed, another switch is scheduled there, or 'ps' without shards); 2 usage (an
// unknown flag, a flag without its value or with one it cannot hold, a missing or unknown
// command; switch-mode: no or an unknown mode, a negative step); 3 cannot reach the
// coordinator or a shard.
#include <algorithm>
#include <cstdio>
#include <memory>
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
#include "common/grpc_status.h"
#include "common/training_mode.h"
#include "grpcpp/grpcpp.h"
#include "proto/coordinator.grpc.pb.h"
#include "proto/health.grpc.pb.h"

ABSL_FLAG(std::string, coordinator, "", "ps_coordinator address (host:port).");
ABSL_FLAG(std::string, address, "",
          "health: the server to ask, a ps_server or the ps_coordinator (default: --coordinator).");
ABSL_FLAG(int, timeout_seconds, 10, "Deadline of each RPC (checkpoint: of the whole write).");
ABSL_FLAG(std::string, mode, "",
          "switch-mode: the mode to switch to (ps, allreduce, fsdp, pipeline).");
ABSL_FLAG(int64_t, at_step, 0,
          "switch-mode: the step every worker switches before (0: the next step boundary).");

namespace {

using namespace pscluster;

constexpr int kOk = 0, kUnhealthy = 1, kUsage = 2, kUnreachable = 3;

constexpr char kUsageLine[] =
    "psctl --coordinator=HOST:PORT status|checkpoint|checkpoints|switch-mode "
    "[--mode=ps|allreduce|fsdp|pipeline --at_step=N] [--timeout_seconds=S] | "
    "psctl --address=HOST:PORT health";

int Error(int code, const std::string& message) {
  std::fprintf(stderr, "psctl: %s\n", message.c_str());
  if (code == kUsage)
    std::fprintf(stderr, "usage: %s (psctl --help lists the flags)\n", kUsageLine);
  return code;
}

// What absl::ParseCommandLine would refuse with exit status 1 (an unknown flag, a flag
// without its value, a value its flag cannot hold), found first so that psctl exits with
// its usage code instead; nullopt when it will parse. Follows its syntax: -flag or --flag,
// =value or the next argument as the value (a bool needs none; --noflag is false), "--"
// ends the flags. A valid value is set here already (ParseCommandLine sets it again);
// absl's own flags (--help..., --flagfile...) are left to it.
std::optional<std::string> FlagError(int argc, char** argv) {
  static const auto* const kAbslOwn = new std::set<absl::string_view>{
      "help",    "helpfull",        "helpshort", "helppackage", "helpon",     "helpmatch",
      "version", "only_check_args", "flagfile",  "fromenv",     "tryfromenv", "undefok"};
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (!absl::ConsumePrefix(&arg, "-") || arg.empty()) continue;  // the command
    absl::ConsumePrefix(&arg, "-");
    const size_t eq = arg.find('=');
    const std::string given(arg.substr(0, eq));
    if (kAbslOwn->count(given) > 0) continue;
    absl::string_view name = given;
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    bool negated = false;
    if (flag == nullptr && absl::ConsumePrefix(&name, "no")) {
      flag = absl::FindCommandLineFlag(name);
      negated = flag != nullptr && flag->IsOfType<bool>();
      if (!negated) flag = nullptr;
    }
    if (flag == nullptr) return absl::StrCat("unknown flag --", given);
    std::string value;
    if (eq != absl::string_view::npos) {
      if (negated) return absl::StrCat("--", given, " takes no value");
      value = std::string(arg.substr(eq + 1));
    } else if (flag->IsOfType<bool>()) {
      value = negated ? "false" : "true";
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return absl::StrCat("--", given, " needs a value");
    }
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      return absl::StrCat("--", given, "=", value, ": ", error);
    }
  }
  return std::nullopt;
}

CoordinatorOperator Connect(const std::string& address) {
  return CoordinatorOperator(address, absl::Seconds(absl::GetFlag(FLAGS_timeout_seconds)));
}

// The mode switches: done ones in the order they completed, then pending ones by step.
void PrintSwitches(const coord::ClusterView& view) {
  if (view.switches_size() + view.pending_switches_size() == 0) {
    std::printf("mode switches: none\n");
    return;
  }
  std::printf("%6s %9s %-10s %-10s %9s %s\n", "SWITCH", "AT_STEP", "FROM", "TO", "HANDOFF_S",
              "STATE");
  auto row = [](const coord::SwitchRecord& s, const std::string& state) {
    const bool reported = s.from_mode() != coord::TRAINING_MODE_UNSPECIFIED;
    std::printf("%6lld %9lld %-10s %-10s %9s %s\n", static_cast<long long>(s.switch_id()),
                static_cast<long long>(s.at_step()), reported ? ModeName(s.from_mode()) : "-",
                ModeName(s.to_mode()),
                reported ? absl::StrFormat("%.3f", s.handoff_seconds()).c_str()
                         : "-",  // no worker has reported it yet
                state.c_str());
  };
  for (const auto& s : view.switches()) {
    row(s, "done " + absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", absl::FromUnixMillis(s.unix_ms()),
                                      absl::UTCTimeZone()));
  }
  for (const auto& s : view.pending_switches()) {
    row(s, absl::StrCat("pending: ", s.acked_ranks_size(), " of ", view.num_workers(),
                        " worker(s) done",
                        s.acked_ranks_size() == 0
                            ? ""
                            : absl::StrCat(" (rank ", absl::StrJoin(s.acked_ranks(), ","), ")")));
  }
}

int Status(const coord::ClusterView& view) {
  std::printf("cluster view %lld: mode %s, global step %lld, %s\n",
              static_cast<long long>(view.version()), ModeName(view.mode()),
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
  const std::string last = view.checkpoints().empty()
                               ? "none"
                               : absl::StrCat("step ", view.checkpoints().rbegin()->step());
  std::printf("last checkpoint: %s\n", last.c_str());
  PrintSwitches(view);
  return view.complete() ? kOk : kUnhealthy;
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
int Checkpoint(const std::string& address) {
  absl::StatusOr<coord::Checkpoint> done = Connect(address).Checkpoint(
      std::nullopt, absl::Seconds(absl::GetFlag(FLAGS_timeout_seconds)));
  if (!done.ok())
    return Error(ExitCodeOf(done.status()), "checkpoint: " + done.status().ToString());
  std::printf("checkpoint of step %lld is complete on every shard\n",
              static_cast<long long>(done->step()));
  return kOk;
}

int SwitchMode(const std::string& address) {
  const std::string name = absl::GetFlag(FLAGS_mode);
  if (name.empty()) return Error(kUsage, "switch-mode needs --mode=ps|allreduce|fsdp|pipeline");
  absl::StatusOr<coord::TrainingMode> parsed = coord::ParseMode(name);
  if (!parsed.ok()) return Error(kUsage, "switch-mode: --mode: " + parsed.status().ToString());
  if (absl::GetFlag(FLAGS_at_step) < 0) {
    return Error(kUsage, absl::StrCat("switch-mode: --at_step=", absl::GetFlag(FLAGS_at_step),
                                      " is negative; give 0 (the next step boundary) or a "
                                      "later step"));
  }
  const char* mode = ModeName(*parsed);
  absl::StatusOr<ScheduledSwitch> resp =
      Connect(address).SwitchMode(*parsed, absl::GetFlag(FLAGS_at_step));
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
int Health(const std::string& address) {
  auto stub = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() +
                                          absl::Seconds(absl::GetFlag(FLAGS_timeout_seconds))));
  grpc::health::v1::HealthCheckRequest request;
  grpc::health::v1::HealthCheckResponse response;
  const grpc::Status status = stub->Check(&context, request, &response);
  if (!status.ok()) {
    return Error(kUnreachable, FromGrpcStatus(status, address).ToString());
  }
  std::printf("%s: %s\n", address.c_str(),
              grpc::health::v1::HealthCheckResponse::ServingStatus_Name(response.status()).c_str());
  return response.status() == grpc::health::v1::HealthCheckResponse::SERVING ? kOk : kUnhealthy;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(kUsageLine);
  if (std::optional<std::string> error = FlagError(argc, argv)) return Error(kUsage, *error);
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  constexpr char kCommands[] = "status, checkpoint, checkpoints, switch-mode or health";
  if (args.size() != 2) return Error(kUsage, absl::StrCat("give one command: ", kCommands));
  const std::string command = args[1];
  if (command != "status" && command != "checkpoint" && command != "checkpoints" &&
      command != "switch-mode" && command != "health") {
    return Error(kUsage, absl::StrCat("unknown command '", command, "'; use ", kCommands));
  }
  if (absl::GetFlag(FLAGS_timeout_seconds) <= 0) {
    return Error(kUsage, absl::StrCat("--timeout_seconds=", absl::GetFlag(FLAGS_timeout_seconds),
                                      " must be positive"));
  }
  const std::string address = absl::GetFlag(FLAGS_coordinator);
  if (command == "health") {
    const std::string target = absl::GetFlag(FLAGS_address).empty() ? address
                                                                    : absl::GetFlag(FLAGS_address);
    if (target.empty()) return Error(kUsage, "health: give --address=HOST:PORT (or --coordinator)");
    return Health(target);
  }
  if (address.empty()) return Error(kUsage, "--coordinator=HOST:PORT is required");
  if (command == "switch-mode") return SwitchMode(address);
  if (command == "checkpoint") return Checkpoint(address);
  auto view = Connect(address).View();
  if (!view.ok()) {
    return Error(kUnreachable,
                 absl::StrCat("coordinator ", address, ": ", view.status().ToString()));
  }
  if (command == "status") return Status(*view);
  return Checkpoints(*view);
}
