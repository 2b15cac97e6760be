#include "server/ps/snapshot/shard_loader.h"

#include "absl/strings/str_cat.h"
#include "server/ps/table/dense_table.h"
#include "server/ps/table/sparse_table.h"

namespace pscluster::ps {

ShardLoader::ShardLoader(Shard* shard) : shard_(shard) {}

absl::Status ShardLoader::Header(const TableSnapshotHeader& h) {
  auto existing = shard_->GetTable(h.spec().table_id());
  if (existing.ok()) {  // seen in an earlier old shard: specs must agree
    if ((*existing)->spec().SerializeAsString() != h.spec().SerializeAsString()) {
      return absl::DataLossError(absl::StrCat("table ", h.spec().table_id(),
                                              " has different specs in different old shards"));
    }
    return RestoreLifecycle(*existing, h);
  }
  auto created = shard_->CreateTable(h.spec());
  if (!created.ok()) return created.status();
  Table* table = *shard_->GetTable(h.spec().table_id());
  table->RestoreClocks(h);
  if (h.spec().kind() == TableSpec::DENSE)
    static_cast<DenseTable*>(table)->RestoreUpdates(h.updates());
  for (const WorkerClock& c : h.clocks()) workers_.push_back(c.worker_id());
  return RestoreLifecycle(table, h);
}

absl::Status ShardLoader::RestoreLifecycle(Table* table, const TableSnapshotHeader& h) {
  if (h.spec().kind() != TableSpec::SPARSE) return absl::OkStatus();
  absl::Status s = static_cast<SparseTable*>(table)->RestoreLifecycle(h);
  if (s.ok()) return s;
  return absl::DataLossError(absl::StrCat("table ", h.spec().table_id(), ": ", s.message()));
}

absl::Status ShardLoader::DenseBlock(const TableSnapshotHeader& h, uint64_t begin, uint64_t n,
                                     const float* data) {
  Table* table = *shard_->GetTable(h.spec().table_id());
  static_cast<DenseTable*>(table)->RestoreBlock(begin, n, data);
  return absl::OkStatus();
}

absl::Status ShardLoader::SparseRow(const TableSnapshotHeader& h, uint64_t key, int64_t updates,
                                    int64_t step, const float* data) {
  Table* table = *shard_->GetTable(h.spec().table_id());
  return static_cast<SparseTable*>(table)->RestoreRow(key, updates, data, step);
}

}  // namespace pscluster::ps
