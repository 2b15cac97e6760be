// What psctl status prints (and top redraws) of a ClusterView: the table, or the JSON of
// status --json (tools/psctl/main.cc's usage comment describes both). Stateless.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/coordinator.pb.h"

namespace pscluster::psctl {

// The view's mode, step and completeness, a row per member, the last checkpoint and the
// mode switches; heartbeat ages as of `now` (psctl's clock).
// ALIVE's column: "yes", "done" (a worker that finished its run and left) or "DEAD".
std::string MemberState(const coord::Member& m);

std::string FormatView(const coord::ClusterView& view, absl::Time now);

// One line of JSON: the view in protobuf's JSON mapping with the proto's field names, plus
// "mode_name" and each member's "heartbeat_age_seconds" as of `now`; keys sorted.
absl::StatusOr<std::string> ViewJson(const coord::ClusterView& view, absl::Time now);

}  // namespace pscluster::psctl
