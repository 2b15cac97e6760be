// Loads the tables of a snapshot, a chain of them (snapshot_chain.h) or a state transfer
// into a shard, table by table as the SnapshotStore::Visitor sees them.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "proto/snapshot.pb.h"
#include "server/ps/snapshot/snapshot_store.h"
#include "server/ps/table/shard.h"

namespace pscluster::ps {

// Loads snapshot tables (or a state transfer's) into a shard: creates each table on first
// sight with its clocks and update count, and copies the dense indices and sparse rows
// that the shard owns.
class ShardLoader final : public SnapshotStore::Visitor {
 public:
  explicit ShardLoader(Shard* shard);
  absl::Status Header(const TableSnapshotHeader& h) override;
  absl::Status DenseBlock(const TableSnapshotHeader& h, uint64_t begin, uint64_t n,
                          const float* data) override;
  absl::Status SparseRow(const TableSnapshotHeader& h, uint64_t key, int64_t updates, int64_t step,
                         const float* data) override;
  // The workers the tables' clocks name.
  const std::vector<int32_t>& workers() const { return workers_; }

 private:
  // A sparse table's admission counts from a header (each old shard's added).
  absl::Status RestoreLifecycle(Table* table, const TableSnapshotHeader& h);

  Shard* const shard_;
  std::vector<int32_t> workers_;
};

}  // namespace pscluster::ps
