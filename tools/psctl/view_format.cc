#include "tools/psctl/view_format.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/cluster_view.h"
#include "common/training_mode.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/type_resolver_util.h"

namespace pscluster::psctl {
namespace {

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

}  // namespace

// The workers' rollback in progress (who stopped, who is awaited) and the run's count of
// rollbacks; nothing for a run that never rolled back.
void AppendRollback(const coord::ClusterView& view, std::string* out) {
  const coord::Rollback& r = view.rollback();
  if (!r.generation().empty() && !r.decided()) {
    const std::vector<int32_t> awaited = coord::RanksNotStopped(r, view.num_workers());
    absl::StrAppend(out, "rollback in progress: ", r.stopped_ranks_size(), " of ",
                    view.num_workers(), " worker(s) stopped",
                    awaited.empty()
                        ? "; rank 0 restores the shards"
                        : absl::StrCat("; waiting for rank(s) ", absl::StrJoin(awaited, ", ")),
                    "\n");
  }
  if (view.run().rollbacks() > 0) {
    absl::StrAppend(out, "rollbacks: ", view.run().rollbacks(),
                    r.decided() ? absl::StrCat(" (the last to step ", r.step(), ")") : "", "\n");
  }
}

std::string MemberState(const coord::Member& m) {
  return m.alive() ? "yes" : m.finished() ? "done" : "DEAD";
}

std::string FormatView(const coord::ClusterView& view, absl::Time now) {
  // A finished run is neither complete (its workers left) nor a failure.
  std::string out = absl::StrFormat("cluster view %d: mode %s, global step %d, %s\n",
                                    view.version(), ModeName(view.mode()), view.global_step(),
                                    view.finished()   ? "FINISHED"
                                    : view.complete() ? "complete"
                                                      : "INCOMPLETE");
  absl::StrAppendFormat(&out, "%-8s %4s %-6s %7s %-22s %5s %13s %9s %10s %9s\n", "ROLE", "ID",
                        "ALIVE", "HB_AGE", "ADDRESS", "INC", "STEP/END", "LOSS", "SAMPLES/S",
                        "METRIC");
  for (const auto& m : view.members()) {
    const bool worker = m.role() == coord::WORKER;
    // A worker's step, and the step its run ends at once it has said.
    const std::string step = m.run_end_step() > 0 ? absl::StrCat(m.step(), "/", m.run_end_step())
                                                  : absl::StrCat(m.step());
    absl::StrAppendFormat(&out, "%-8s %4d %-6s %6.1fs %-22s %5d %13s %9s %10s %9s\n",
                          worker ? "worker" : "shard", m.id(), MemberState(m),
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
  AppendRollback(view, &out);
  AppendSwitches(view, &out);
  return out;
}

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

}  // namespace pscluster::psctl
