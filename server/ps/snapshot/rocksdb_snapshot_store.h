// The snapshots of the older layout, one RocksDB database per shard, read only: nothing
// writes this layout any more (see file_snapshot_store.h for why), but its snapshots stay
// listable and restorable. RocksDB is only ever opened read-only, which never writes.
//
// Keys:  manifest/<step:020>                    SnapshotManifest (present iff complete)
//        snap/<step:020>/t/<table:010>/h        TableSnapshotHeader
//        snap/<step:020>/t/<table:010>/x/<blk:012>  data block (snapshot_store.h encoding)
// A table's CRC runs over its header's bytes, then its blocks' bytes, in key order.
//
// Thread-safe (RocksDB is).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "server/ps/snapshot/snapshot_store.h"

namespace rocksdb {
class DB;
}

namespace pscluster::ps {

class RocksDbSnapshotStore final : public SnapshotStore {
 public:
  static absl::StatusOr<std::unique_ptr<SnapshotStore>> OpenReadOnly(const std::string& dir);
  ~RocksDbSnapshotStore() override;
  RocksDbSnapshotStore(const RocksDbSnapshotStore&) = delete;
  RocksDbSnapshotStore& operator=(const RocksDbSnapshotStore&) = delete;

  const std::string& dir() const override { return dir_; }
  // FAILED_PRECONDITION: the layout is read only.
  absl::StatusOr<SnapshotManifest> Write(int64_t step,
                                         const std::vector<std::unique_ptr<TableImage>>& images,
                                         const WriteOptions& options) override;
  absl::StatusOr<std::vector<SnapshotManifest>> List() const override;
  absl::Status Delete(int64_t step) override;  // FAILED_PRECONDITION
  absl::Status Read(int64_t step, Visitor* visitor) const override;

 private:
  RocksDbSnapshotStore(std::string dir, rocksdb::DB* db);

  const std::string dir_;
  std::unique_ptr<rocksdb::DB> db_;
};

}  // namespace pscluster::ps
