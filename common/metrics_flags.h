// --metrics_host and --metrics_port, shared by ps_server, ps_coordinator and ps_worker.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/metrics.h"

namespace pscluster {

// Metrics served as the flags say (printing where), or null with --metrics_port=0.
absl::StatusOr<std::unique_ptr<Metrics>> ServeMetricsFromFlags(const std::string& role,
                                                               const std::string& id);

}  // namespace pscluster
