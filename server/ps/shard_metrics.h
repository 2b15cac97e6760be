// ps_server's metrics read at scrape time (common/metrics.h): every table's traffic, size,
// pull waits and staleness, the workers' clocks, and the snapshots written.
#pragma once

#include "common/metrics.h"
#include "server/ps/snapshot/snapshotter.h"
#include "server/ps/table/shard.h"

namespace pscluster::ps {

// `snapshotter` may be null (no --data_dir). Both must outlive `metrics`' serving.
void AddShardMetrics(const Shard* shard, const Snapshotter* snapshotter, Metrics* metrics);

}  // namespace pscluster::ps
