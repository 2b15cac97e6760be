// psctl export: no cluster, a checkpoint's sparse table written for serving as a RocksDB
// database (server/ps/export/table_export.h says its layout).
#pragma once

#include <cstdint>
#include <optional>

namespace pscluster::psctl {

// Reads --data_dir, --table and --out; `step` (--step) or the latest snapshot. Exit status:
// 0 exported, 1 refused or failed (the reason printed), 2 a flag missing.
int ExportCommand(std::optional<int64_t> step);

}  // namespace pscluster::psctl
