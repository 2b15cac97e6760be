// One shard's snapshots in one RocksDB database. A snapshot is written as one SST file,
// durably (fsync), ingested, and only then made visible by a manifest written with a
// synced put: a crash at any moment leaves earlier snapshots intact and the partial one
// invisible; Open() deletes such leftovers.
//
// Keys:  manifest/<step:020>                    SnapshotManifest (present iff complete)
//        snap/<step:020>/t/<table:010>/h        TableSnapshotHeader
//        snap/<step:020>/t/<table:010>/x/<blk:012>  data block: DENSE values then each
//            optimizer slot for kDenseBlockValues indices; SPARSE up to kSparseBlockRows
//            rows as keys (u64), update counts (i64), then row data (floats)
//
// Thread-safe (RocksDB is); Write() calls must not overlap. Opened by SnapshotStore::Open.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "server/ps/snapshot_store.h"

namespace rocksdb {
class DB;
}

namespace pscluster::ps {

class RocksDbSnapshotStore final : public SnapshotStore {
 public:
  ~RocksDbSnapshotStore() override;
  RocksDbSnapshotStore(const RocksDbSnapshotStore&) = delete;
  RocksDbSnapshotStore& operator=(const RocksDbSnapshotStore&) = delete;

  const std::string& dir() const override { return dir_; }
  absl::StatusOr<SnapshotManifest> Write(int64_t step,
                                         const std::vector<std::unique_ptr<TableImage>>& images,
                                         const WriteOptions& options) override;
  absl::StatusOr<std::vector<SnapshotManifest>> List() const override;
  absl::Status Delete(int64_t step) override;
  absl::Status Read(int64_t step, Visitor* visitor) const override;

 private:
  friend class SnapshotStore;  // Open
  RocksDbSnapshotStore(std::string dir, rocksdb::DB* db);
  absl::Status CheckSpace(int64_t step, const std::vector<std::unique_ptr<TableImage>>& images);
  absl::Status RemovePartial();

  const std::string dir_;
  std::unique_ptr<rocksdb::DB> db_;
};

}  // namespace pscluster::ps
