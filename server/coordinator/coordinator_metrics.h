// ps_coordinator's metrics, read from the cluster view at scrape time (common/metrics.h):
// members alive/dead and each one's heartbeat age, each worker's reported progress, the
// mode, switches and checkpoints.
#pragma once

#include "common/metrics.h"
#include "server/coordinator/cluster_state.h"

namespace pscluster::coord {

// `cluster` must outlive `metrics`' serving.
void AddCoordinatorMetrics(const ClusterState* cluster, Metrics* metrics);

}  // namespace pscluster::coord
