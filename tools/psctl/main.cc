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
// Exit codes: 0 ok; 1 the command ran but the cluster is not healthy or refused (status: a
// member is dead or missing; checkpoint: a shard refused or failed; switch-mode: the step
// already passed, another switch is scheduled there, or 'ps' without shards); 2 usage (an
// unknown flag, a flag without its value or with one it cannot hold, a missing or unknown
// command; switch-mode: no or an unknown mode, a negative step; top: an interval that is not
// a positive number of seconds, negative iterations; plan: input that describes no job, the
// message naming the flag); 3 cannot reach the coordinator or a shard.
#include <poll.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
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
#include "common/command_line.h"
#include "common/grpc_status.h"
#include "common/security_flags.h"
#include "common/training_mode.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/type_resolver_util.h"
#include "grpcpp/grpcpp.h"
#include "proto/coordinator.grpc.pb.h"
#include "proto/health.grpc.pb.h"
#include "tools/psctl/plan.h"
#include "tools/psctl/plan_flags.h"
#include "tools/psctl/plan_format.h"

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
          "restore: the checkpoint step (psctl checkpoints lists them).");
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
    "[--nodes=N --gpus_per_node=G --gpu=a100-80gb ...]";

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

CoordinatorOperator Connect(const std::string& address, const Security& security) {
  return CoordinatorOperator(address, absl::Seconds(absl::GetFlag(FLAGS_timeout_seconds)),
                             security);
}

// Seconds since `m`'s last heartbeat by psctl's clock (0 where the clocks disagree).
double HeartbeatAgeSeconds(const coord::Member& m, absl::Time now) {
  return std::max(0.0, absl::ToDoubleSeconds(now - absl::FromUnixMillis(m.last_heartbeat_ms())));
}

// The mode switches: done ones in the order they completed, then pending ones by step.
void AppendSwitches(const coord::ClusterView& view, std::string* out) {
  if (view.switches_size() + view.pending_switches_size() == 0) {
    absl::StrAppend(out, "mode switches: none\n");
    return;
  }
  absl::StrAppendFormat(out, "%6s %9s %-10s %-10s %9s %s\n", "SWITCH", "AT_STEP", "FROM", "TO",
                        "HANDOFF_S", "STATE");
  auto row = [out](const coord::SwitchRecord& s, const std::string& state) {
    const bool reported = s.from_mode() != coord::TRAINING_MODE_UNSPECIFIED;
    absl::StrAppendFormat(out, "%6d %9d %-10s %-10s %9s %s\n", s.switch_id(), s.at_step(),
                          reported ? ModeName(s.from_mode()) : "-", ModeName(s.to_mode()),
                          reported ? absl::StrFormat("%.3f", s.handoff_seconds())
                                   : "-",  // no worker has reported it yet
                          state);
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

// What status prints (and top redraws): the view's mode, step and completeness, a row per
// member, the last checkpoint and the mode switches; heartbeat ages as of `now`.
std::string FormatView(const coord::ClusterView& view, absl::Time now) {
  std::string out = absl::StrFormat("cluster view %d: mode %s, global step %d, %s\n",
                                    view.version(), ModeName(view.mode()), view.global_step(),
                                    view.complete() ? "complete" : "INCOMPLETE");
  absl::StrAppendFormat(&out, "%-8s %4s %-6s %7s %-22s %5s %13s %9s %10s %9s\n", "ROLE", "ID",
                        "ALIVE", "HB_AGE", "ADDRESS", "INC", "STEP/END", "LOSS", "SAMPLES/S",
                        "METRIC");
  for (const auto& m : view.members()) {
    const bool worker = m.role() == coord::WORKER;
    // A worker's step, and the step its run ends at once it has said.
    const std::string step = m.run_end_step() > 0 ? absl::StrCat(m.step(), "/", m.run_end_step())
                                                  : absl::StrCat(m.step());
    absl::StrAppendFormat(&out, "%-8s %4d %-6s %6.1fs %-22s %5d %13s %9s %10s %9s\n",
                          worker ? "worker" : "shard", m.id(), m.alive() ? "yes" : "DEAD",
                          HeartbeatAgeSeconds(m, now), m.address(), m.incarnation(),
                          worker ? step : "-", worker ? absl::StrFormat("%.4g", m.loss()) : "-",
                          worker ? absl::StrFormat("%.0f", m.samples_per_sec()) : "-",
                          worker && m.has_metric() ? absl::StrFormat("%.4f", m.metric()) : "-");
  }
  absl::StrAppend(&out, "last checkpoint: ",
                  view.checkpoints().empty()
                      ? "none"
                      : absl::StrCat("step ", view.checkpoints().rbegin()->step()),
                  "\n");
  AppendSwitches(view, &out);
  return out;
}

// `message` as protobuf JSON with its map keys sorted (deterministic serialization orders
// them; the JSON printer keeps the wire order).
absl::StatusOr<std::string> SortedJson(const google::protobuf::Message& message) {
  namespace pb = google::protobuf;
  std::string bytes;
  {
    pb::io::StringOutputStream stream(&bytes);
    pb::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    message.SerializeToCodedStream(&coded);
  }
  constexpr char kPrefix[] = "type.googleapis.com";
  std::unique_ptr<pb::util::TypeResolver> resolver(
      pb::util::NewTypeResolverForDescriptorPool(kPrefix, pb::DescriptorPool::generated_pool()));
  std::string json;
  const auto s = pb::util::BinaryToJsonString(
      resolver.get(), absl::StrCat(kPrefix, "/", message.GetDescriptor()->full_name()), bytes,
      &json);
  if (!s.ok()) return absl::InternalError(s.ToString());
  return json;
}

// status --json (the usage comment above describes it).
absl::StatusOr<std::string> ViewJson(const coord::ClusterView& view, absl::Time now) {
  namespace pb = google::protobuf;
  pb::util::JsonPrintOptions options;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string json;
  pb::Struct object;
  auto s = pb::util::MessageToJsonString(view, &json, options);
  if (s.ok()) s = pb::util::JsonStringToMessage(json, &object);
  if (!s.ok()) return absl::InternalError(s.ToString());
  auto& fields = *object.mutable_fields();
  fields["mode_name"].set_string_value(ModeName(view.mode()));
  pb::ListValue* members = fields["members"].mutable_list_value();
  for (int i = 0; i < view.members_size() && i < members->values_size(); ++i) {
    (*members->mutable_values(i)->mutable_struct_value()->mutable_fields())["heartbeat_age_seconds"]
        .set_number_value(HeartbeatAgeSeconds(view.members(i), now));
  }
  return SortedJson(object);
}

int Status(const coord::ClusterView& view, bool json) {
  const absl::Time now = absl::Now();
  if (json) {
    absl::StatusOr<std::string> text = ViewJson(view, now);
    if (!text.ok()) return Error(kUnhealthy, "status --json: " + text.status().ToString());
    std::printf("%s\n", text->c_str());
  } else {
    std::fputs(FormatView(view, now).c_str(), stdout);
  }
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

// Stdin in non-canonical no-echo mode (each key arrives at once, unechoed) while this lives,
// if stdin is a terminal; restored on destruction. Not thread-safe.
class KeyboardMode {
 public:
  KeyboardMode() {
    tty_ = isatty(STDIN_FILENO) && tcgetattr(STDIN_FILENO, &saved_) == 0;
    if (!tty_) return;
    termios keys = saved_;
    keys.c_lflag &= ~(ICANON | ECHO);  // ISIG stays: Ctrl-C is still a SIGINT
    keys.c_cc[VMIN] = 1;
    keys.c_cc[VTIME] = 0;
    tcsetattr(STDIN_FILENO, TCSANOW, &keys);
  }
  ~KeyboardMode() {
    if (tty_) tcsetattr(STDIN_FILENO, TCSANOW, &saved_);
  }
  KeyboardMode(const KeyboardMode&) = delete;
  KeyboardMode& operator=(const KeyboardMode&) = delete;

  bool tty() const { return tty_; }

 private:
  termios saved_{};
  bool tty_ = false;
};

// SIGINT and SIGTERM blocked and readable on fd() (signalfd), so that poll() sees them beside
// the keys: no handler, no global. Construct it before any gRPC thread exists (threads inherit
// the mask). They stay blocked after destruction, on the way out: a second Ctrl-C then cannot
// turn top's exit 0 into death by signal. Not thread-safe.
class QuitSignals {
 public:
  QuitSignals() {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    if (pthread_sigmask(SIG_BLOCK, &set, nullptr) == 0) fd_ = signalfd(-1, &set, SFD_CLOEXEC);
  }
  ~QuitSignals() {
    if (fd_ >= 0) close(fd_);
  }
  QuitSignals(const QuitSignals&) = delete;
  QuitSignals& operator=(const QuitSignals&) = delete;

  int fd() const { return fd_; }  // -1: could not be set up

 private:
  int fd_ = -1;
};

// One frame of top: a header, then status's view or, while the coordinator cannot be read,
// what top waits for.
std::string TopFrame(const std::string& address, const TopOptions& options,
                     const absl::StatusOr<coord::ClusterView>& view) {
  const absl::Time now = absl::Now();
  std::string frame = absl::StrCat(
      "psctl top: coordinator ", address, ", every ", absl::FormatDuration(options.interval), ", ",
      absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", now, absl::UTCTimeZone()), "; q or Ctrl-C quits\n");
  if (view.ok()) return frame + FormatView(*view, now);
  return absl::StrCat(frame, "waiting for the coordinator at ", address,
                      " to answer GetView (deadline --timeout_seconds=",
                      absl::GetFlag(FLAGS_timeout_seconds), "): ", view.status().ToString(),
                      "; retrying every ", absl::FormatDuration(options.interval), "\n");
}

// Waits up to `interval` (the wait between redraws) for a key or a quit signal; true when
// top should quit: 'q', Ctrl-C or SIGTERM, or the terminal gone.
bool AwaitQuit(const KeyboardMode& keyboard, int signal_fd, absl::Duration interval) {
  pollfd fds[2] = {{signal_fd, POLLIN, 0}, {STDIN_FILENO, POLLIN, 0}};
  const double ms = std::ceil(absl::ToDoubleMilliseconds(interval));
  const int timeout_ms = static_cast<int>(std::clamp(ms, 1.0, static_cast<double>(INT_MAX)));
  if (poll(fds, keyboard.tty() ? 2 : 1, timeout_ms) <= 0) return false;  // time to redraw
  if (fds[0].revents != 0) return true;
  char keys[64];
  const ssize_t got = read(STDIN_FILENO, keys, sizeof keys);
  if (got < 0) return errno != EINTR && errno != EAGAIN;
  return got == 0 || std::memchr(keys, 'q', got) != nullptr ||
         std::memchr(keys, 'Q', got) != nullptr;  // any other key: redraw now
}

// Redraws the view every interval until told to quit; a coordinator that cannot be reached
// (restarting, say) is shown and asked again at the next redraw.
int Top(const std::string& address, const Security& security, const TopOptions& options) {
  QuitSignals quit;  // first: before the channel starts gRPC's threads
  if (quit.fd() < 0) return Error(kUnhealthy, absl::StrCat("top: signalfd: ", strerror(errno)));
  KeyboardMode keyboard;
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
    if (AwaitQuit(keyboard, quit.fd(), options.interval)) return kOk;
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
  if (std::optional<std::string> error = FlagError(argc, argv)) return Error(kUsage, *error);
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  constexpr char kCommands[] =
      "status, top, checkpoint, checkpoints, restore, switch-mode, health or plan";
  if (args.size() != 2) return Error(kUsage, absl::StrCat("give one command: ", kCommands));
  const std::string command = args[1];
  const std::set<std::string> known = {"status",  "top",         "checkpoint", "checkpoints",
                                       "restore", "switch-mode", "health",     "plan"};
  if (known.count(command) == 0) {
    return Error(kUsage, absl::StrCat("unknown command '", command, "'; use ", kCommands));
  }
  if (command == "plan") return PlanCommand(absl::GetFlag(FLAGS_json));
  if (absl::GetFlag(FLAGS_timeout_seconds) <= 0) {
    return Error(kUsage, absl::StrCat("--timeout_seconds=", absl::GetFlag(FLAGS_timeout_seconds),
                                      " must be positive"));
  }
  const absl::StatusOr<Security> security = SecurityFromFlags();
  if (!security.ok()) return Error(kUsage, std::string(security.status().message()));
  const std::string address = absl::GetFlag(FLAGS_coordinator);
  if (command == "health") {
    const std::string target =
        absl::GetFlag(FLAGS_address).empty() ? address : absl::GetFlag(FLAGS_address);
    if (target.empty()) return Error(kUsage, "health: give --address=HOST:PORT (or --coordinator)");
    return Health(target, *security);
  }
  if (address.empty()) return Error(kUsage, "--coordinator=HOST:PORT is required");
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
