// Export for serving: one sparse table of a checkpoint, values only, as a RocksDB database
// that a serving process opens read-only with a stock RocksDB (any language's binding).
//
// Layout of the database:
//   column family "default"  key: the id as 8 bytes big-endian (so ids sort in order);
//                            value: the row's dim float32 values, little-endian
//   column family "meta"     "spec": the TableSpec (proto/ps.proto) in text format;
//                            "step": the checkpoint's step, in decimal; "rows": the count
// The database is written beside OUT (OUT.partial) and renamed into place once closed, so
// OUT either holds a whole export or does not exist.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace pscluster::ps {

struct ExportRequest {
  std::string root;              // the checkpoint root (ps_server --data_dir)
  std::string which = "latest";  // "latest" or a step
  std::string table;             // the table's id or name
  std::string out;               // the database directory to make (must not exist)
};

struct ExportResult {
  int64_t step = -1;
  uint32_t table_id = 0;
  uint64_t rows = 0;
  uint32_t dim = 0;
  uint64_t bytes = 0;  // of the database on disk
};

// Reads the snapshot (or chain) `which` of every shard under `root`, as a restore into
// one shard would, and writes `table`'s stored rows to `out`. NOT_FOUND for an unknown
// table or step; INVALID_ARGUMENT for a dense table; ALREADY_EXISTS when `out` exists;
// RESOURCE_EXHAUSTED, before writing anything, when the disk has too little room.
absl::StatusOr<ExportResult> ExportTable(const ExportRequest& request);

}  // namespace pscluster::ps
