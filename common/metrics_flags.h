// --metrics_host and --metrics_port, shared by ps_server, ps_coordinator and ps_worker.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/metrics.h"

namespace pscluster {

// A listening-port flag of the 0 = off, -1 = any free port convention (--metrics_port,
// --http_port): OK for those and ports, else INVALID_ARGUMENT naming the flag.
absl::Status CheckListenPortFlag(const std::string& flag, int port);

// Metrics served as the flags say (printing where), or null with --metrics_port=0.
absl::StatusOr<std::unique_ptr<Metrics>> ServeMetricsFromFlags(const std::string& process,
                                                               const std::string& id);

}  // namespace pscluster
